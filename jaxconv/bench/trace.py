"""Optional device-time cross-check from a jax.profiler trace.

Everything here is defensive: the profiler API and the trace format differ across jax versions and backends.
Any failure returns a dict with `ok: False` and a `reason`, never raises.

Method: run the compiled function `ncalls` times inside jax.profiler.trace, read the XSpace (.xplane.pb) with
jax.profiler.ProfileData (newer jax) and keep the events carrying an `hlo_module` stat equal to our (uniquely
named) module. Device planes (/device:GPU:*: kernels, memcpy) are preferred; on the CPU the XLA thunk events of
the host plane are used. Busy time per call = union of the event intervals of each run (by `run_id` when
present), so concurrent thunks on CPU threads are not double counted. Falls back to the perfetto/trace JSON when
ProfileData is missing.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import tempfile

# Lines in device planes that the trace viewer derives from the kernels (they overlap the kernel events).
_DERIVED_LINES = ("xla modules", "xla ops", "steps", "framework", "source code", "tensorflow ops", "xla traceme",
                  "launch stats", "task environment")


def _union_ns(intervals):
    tot, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                tot += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        tot += cur_e - cur_s
    return tot


def _summarize(events, ncalls, module, source):
    """events: list of (name, start_ns, dur_ns, run_id or None, on_device: bool)."""
    if not events:
        return dict(ok=False, reason=f"no events for module {module!r} in the trace ({source})")
    dev = [e for e in events if e[4]]
    use = dev if dev else events
    runs = {}
    for name, s, d, rid, _ in use:
        runs.setdefault(rid, []).append((s, s + d))
    busy = [_union_ns(iv) for iv in runs.values()]
    total_busy = sum(busy)
    kern = {}
    for name, s, d, rid, _ in use:
        k = kern.setdefault(name, [0, 0.0])
        k[0] += 1
        k[1] += d
    top = sorted(kern.items(), key=lambda kv: -kv[1][1])[:8]
    n_runs = len(runs) if None not in runs else ncalls
    per_call_ns = total_busy / max(ncalls, 1)
    busy_sorted = sorted(busy)
    med = busy_sorted[len(busy_sorted) // 2] if None not in runs and busy_sorted else per_call_ns
    return dict(ok=True, source=source, where="device" if dev else "host-thunks", ncalls=ncalls, runs_seen=n_runs,
                per_call_us=per_call_ns / 1e3, median_run_us=med / 1e3,
                sum_kernel_us_per_call=sum(e[2] for e in use) / max(ncalls, 1) / 1e3,
                events_per_call=len(use) / max(ncalls, 1),
                top=[dict(name=n[:120], count=c, total_us=t / 1e3) for n, (c, t) in top])


def _in_module(mod, module):
    """Whether an event's hlo_module stat names our module (XLA may suffix it: "jit_f.1")."""
    return isinstance(mod, str) and (mod == module or mod.startswith(module + "."))


def _xplane_events(path):
    """(event, stats dict, on_device) for the events of an XSpace file, less the trace viewer's derived device
    lines and the "end: " markers."""
    from jax.profiler import ProfileData  # newer jax only
    for plane in ProfileData.from_file(path).planes:
        pname = plane.name or ""
        on_dev = pname.startswith("/device:") and "cpu" not in pname.lower()
        for line in plane.lines:
            lname = (line.name or "").lower()
            if on_dev and any(lname.startswith(d) for d in _DERIVED_LINES):
                continue
            for e in line.events:
                if (e.name or "").startswith("end: "):
                    continue
                try:
                    st = dict(e.stats)
                except Exception:
                    st = {}
                yield e, st, on_dev


def _events_from_xspace(path, module):
    out, unattributed = [], []
    for e, st, on_dev in _xplane_events(path):
        ev = (e.name, float(e.start_ns), float(e.duration_ns), st.get("run_id"), on_dev)
        mod = st.get("hlo_module")
        if not _in_module(mod, module):
            # kernels replayed from a CUDA graph (XLA command buffers) may carry no hlo_module; only our
            # calls run inside the trace window, so device-plane events are still ours
            if on_dev and not isinstance(mod, str):
                unattributed.append(ev[:3] + (None, True))
            continue
        out.append(ev)
    if not any(e[4] for e in out) and unattributed:
        return unattributed, "xplane (device events without hlo_module)"
    return out, "xplane"


def _events_from_json(path, module):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        data = json.load(f)
    evs = data.get("traceEvents", []) if isinstance(data, dict) else data
    pnames = {}
    for e in evs:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pnames[e.get("pid")] = str(e.get("args", {}).get("name", ""))
    out = []
    for e in evs:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {}) or {}
        mod = args.get("hlo_module") or args.get("long_name", "")
        if not _in_module(mod, module):
            continue
        pn = pnames.get(e.get("pid"), "")
        on_dev = pn.startswith("/device:") and "cpu" not in pn.lower()
        out.append((e.get("name", "?"), float(e.get("ts", 0)) * 1e3, float(e.get("dur", 0)) * 1e3,
                    args.get("run_id"), on_dev))
    return out


def parse_trace_dir(log_dir, module, ncalls):
    """Parse whatever the profiler wrote under log_dir. Never raises."""
    try:
        xs = sorted(glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True))
        reasons = []
        if xs:
            try:
                evs, src = _events_from_xspace(xs[-1], module)
                r = _summarize(evs, ncalls, module, src)
                if r.get("ok"):
                    return r
                reasons.append(r.get("reason"))
            except Exception as e:
                reasons.append(f"xplane: {type(e).__name__}: {e}")
        js = sorted(glob.glob(os.path.join(log_dir, "**", "*.trace.json.gz"), recursive=True)
                    + glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"), recursive=True))
        for j in js:
            try:
                r = _summarize(_events_from_json(j, module), ncalls, module, os.path.basename(j))
                if r.get("ok"):
                    return r
                reasons.append(r.get("reason"))
            except Exception as e:
                reasons.append(f"{os.path.basename(j)}: {type(e).__name__}: {e}")
        if not xs and not js:
            reasons.append("profiler wrote no trace files")
        return dict(ok=False, reason="; ".join(str(r) for r in reasons))
    except Exception as e:
        return dict(ok=False, reason=f"{type(e).__name__}: {e}")


def profile_device_time(fn, args, module, ncalls=5, keep_dir=None):
    """Run fn(*args) ncalls times under jax.profiler.trace and return the busy time per call (see module doc)."""
    try:
        import jax
    except Exception as e:
        return dict(ok=False, reason=f"jax import failed: {e}")
    d = keep_dir or tempfile.mkdtemp(prefix="jaxconv_bench_trace_")
    try:
        jax.block_until_ready(fn(*args))
        try:
            ctx = jax.profiler.trace(d, create_perfetto_trace=True)
        except TypeError:
            ctx = jax.profiler.trace(d)
        with ctx:
            for _ in range(ncalls):
                jax.block_until_ready(fn(*args))
        return parse_trace_dir(d, module, ncalls)
    except Exception as e:
        return dict(ok=False, reason=f"profiler failed: {type(e).__name__}: {e}")
    finally:
        if keep_dir is None:
            shutil.rmtree(d, ignore_errors=True)


def op_times(log_dir, module):
    """Time per HLO instruction of `module` in a trace: {hlo_op: {"ns": total, "events": count}}.

    Device planes (GPU kernels, attributed by their `hlo_op` stat) when present, else the host plane's thunk
    events (CPU). Kernels that carry no `hlo_op` (replayed from an XLA command buffer) are summed under "" on
    device planes: run with XLA_FLAGS=--xla_gpu_enable_command_buffer= to attribute every kernel. Never raises;
    returns {} when nothing was found.
    """
    try:
        xs = sorted(glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True))
        if not xs:
            return {}
        dev, host = {}, {}
        for e, st, on_dev in _xplane_events(xs[-1]):
            mod = st.get("hlo_module")
            if (isinstance(mod, str) and not _in_module(mod, module)) or (not on_dev and mod is None):
                continue
            op = st.get("hlo_op")
            op = op if isinstance(op, str) else ""
            slot = (dev if on_dev else host).setdefault(op, {"ns": 0.0, "events": 0})
            slot["ns"] += float(e.duration_ns)
            slot["events"] += 1
        return dev or host
    except Exception:
        return {}
