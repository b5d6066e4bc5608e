"""The sweep's timing method: device time per op from a few in-stream-marked calls, one compile per side.

For one case, every (dtype, op, implementation) is one jitted function applying the op to `nsets` distinct input
sets (random normal data, never zeros; all outputs returned) between the stream timer's marks (stream_timer.py:
CUDA events on XLA's stream on the GPU, a host clock on the CPU), so the host's dispatch stays outside the span.
All of a case's functions are lowered first, then compiled on two threads. One compiles lax's one after another
(cuDNN's autotuning runs on the GPU and must not share it), then those of the other sides that hold XLA
convolutions (problems auto leaves to XLA): they autotune on the GPU too, so no two autotunings share it, and a
convolution that matches one of lax's finds lax's choice in XLA's in-process autotuning cache. The other thread
makes the host's part of the inputs, then compiles the rest (host-only compilation).
Timing: one warm-up call per implementation, then `repeats` rounds alternating lax and jaxconv (lax first in even
rounds); time per op = the median over rounds of span / nsets; the spread is the range of the per-round ratios.
No slope fit (harness.py's T-slope) is needed: the marks already exclude the dispatch, and the span's fixed part
(the launch of its first kernel) is shared by nsets ops.
"""
from __future__ import annotations

import concurrent.futures
import math
import re
import statistics
import time

import numpy as np

from . import cases as _cases
from . import stream_timer
from .harness import _impl_fn, _w_scale, batched, hlo_counts, make_op, missing_jaxconv_ops

# Relative error (max |a - b| / max |b|) between jaxconv's and lax's outputs of set 0 above which a measurement is
# flagged: bf16 results round at 2^-8; float32 at DEFAULT precision is TF32 (10-bit mantissa) on the GPU.
REL_ERR_LIMIT = {"bfloat16": 5e-2, "float16": 1e-2, "float32": 2e-2, "float32-high": 1e-3,
                 "float32-highest": 1e-4, "float64": 1e-9}
HOST_GEN_LIMIT = 64 << 20   # float32 bytes of all sets up to which inputs are drawn with numpy (no compile)


def nsets_for(case) -> int:
    """Distinct input sets per call: several for small problems (their fixed costs shared), one for large ones."""
    f = case.flops("fwd")
    return 4 if f <= 1e9 else 2 if f <= 1e10 else 1


class InputSets:
    """nsets (x, w, dy) sets per dtype: normal random data (w scaled by 1/sqrt(fan-in)), one float32 draw shared
    by the dtypes. prepare() does the host's part (numpy draws for small sets; the generator's compilation for
    large ones) and touches no device, so it may run beside lax's autotuning; get() returns
    {dtype: [(x, w, dy)] * nsets} on the default device."""

    def __init__(self, case, dtypes, nsets, data_seed=0):
        self.shapes = tuple(tuple(s) for s in case.shapes())
        self.ws, self.dtypes, self.nsets, self.seed = _w_scale(case), tuple(dtypes), nsets, abs(int(data_seed))
        self.on_host = nsets * sum(math.prod(s) for s in self.shapes) * 4 <= HOST_GEN_LIMIT
        self._host, self._gen = None, None

    def prepare(self):
        import jax
        import jax.numpy as jnp
        dts = {dt: jnp.dtype(_cases.dtype_info(dt)[0]) for dt in self.dtypes}
        if self.on_host:
            rng = np.random.default_rng([self.seed, 7])
            f32 = [(rng.standard_normal(self.shapes[0], dtype=np.float32),
                    rng.standard_normal(self.shapes[1], dtype=np.float32) * np.float32(self.ws),
                    rng.standard_normal(self.shapes[2], dtype=np.float32)) for _ in range(self.nsets)]
            self._host = {dt: [tuple(a.astype(d) for a in s) for s in f32] for dt, d in dts.items()}
            return
        shapes, ws, nsets = self.shapes, self.ws, self.nsets

        def gen(key):
            out = {dt: [] for dt in dts}
            for i in range(nsets):
                k1, k2, k3 = jax.random.split(jax.random.fold_in(key, i), 3)
                s = (jax.random.normal(k1, shapes[0], jnp.float32),
                     jax.random.normal(k2, shapes[1], jnp.float32) * ws,
                     jax.random.normal(k3, shapes[2], jnp.float32))
                for dt, d in dts.items():
                    out[dt].append(tuple(a.astype(d) for a in s))
            return out
        self._gen = jax.jit(gen).lower(jax.random.key(self.seed)).compile()

    def get(self) -> dict:
        import jax
        if self._host is None and self._gen is None:
            self.prepare()
        if self._host is not None:
            sets = {dt: [tuple(jax.device_put(a) for a in s) for s in v] for dt, v in self._host.items()}
        else:
            out = self._gen(jax.random.key(self.seed))
            sets = {dt: [tuple(s) for s in out[dt]] for dt in self.dtypes}
        return jax.block_until_ready(sets)


class _Program:
    """One compiled, marked function of (impl, dtype, op) and its timer."""

    def __init__(self, impl, dtype, op, timer):
        self.impl, self.dtype, self.op, self.timer = impl, dtype, op, timer
        self.lowered, self.compiled, self.error, self.compile_s = None, None, None, 0.0

    def compile(self, options):
        t0 = time.perf_counter()
        try:
            self.compiled = self.lowered.compile(compiler_options=options)
        except Exception as e:  # reported as this side's failure
            self.error = f"compile: {type(e).__name__}: {str(e)[:400]}"
        self.compile_s = time.perf_counter() - t0
        self.lowered = None

    def call(self, sets):
        """(outputs of every set, seconds between the marks)."""
        import jax
        out = self.compiled(sets)[0]
        jax.block_until_ready(out)
        return out, self.timer.elapsed_s()


def compile_case(case, dtypes, ops, nsets, impls=("lax", "jaxconv"), compiler_options=None, tag="sweep",
                 host_work=None, threads=1):
    """{(impl, dtype, op): _Program} for one case, compiled as the module docstring says. A side that fails to
    lower or compile carries its error. host_work (a callable: work that launches nothing on the device, such as
    InputSets.prepare) runs on the thread beside lax's, before the host-only compilations, which run on `threads`
    threads (compile_queues)."""
    import jax
    compiler_options = compiler_options or {}
    progs = {}
    for dt in dtypes:
        npdt = jax.numpy.dtype(_cases.dtype_info(dt)[0])
        abstract = [tuple(jax.ShapeDtypeStruct(tuple(s), npdt) for s in case.shapes())] * nsets
        for op in ops:
            for impl in impls:
                timer = stream_timer.StreamTimer()
                name = re.sub(r"[^a-z0-9_]", "", f"{tag}_{impl}_{dt}_{op}".replace("+", "_").replace("-", "_"))
                p = _Program(impl, dt, op, timer)
                try:
                    fn = batched(make_op(_impl_fn(impl), case, dt, op), nsets, name)
                    p.lowered = jax.jit(timer.wrap(fn)).lower(abstract)
                except Exception as e:
                    p.error = f"lower: {type(e).__name__}: {str(e)[:400]}"
                progs[(impl, dt, op)] = p

    gpu, host = compile_queues(progs)

    def compile_all(todo, first=None, workers=1):
        if first is not None:
            first()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as inner:
            list(inner.map(lambda p: p.compile(compiler_options.get(p.impl)), todo))

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(compile_all, gpu), pool.submit(compile_all, host, host_work, threads)]
        try:
            for f in jobs:
                f.result()
        except Exception:
            release(progs)
            raise
    return progs


def compile_queues(progs) -> tuple:
    """(the programs compiled one after another: lax's, then the others' that hold XLA convolutions; the rest).
    The first list's compilations autotune XLA's convolutions on the device; the second's need only the host."""
    live = [p for p in progs.values() if p.error is None]
    gpu = [p for p in live if p.impl == "lax"]
    gpu += [p for p in live if p.impl != "lax" and "stablehlo.convolution" in p.lowered.as_text()]
    return gpu, [p for p in live if all(p is not q for q in gpu)]


def release(progs):
    for p in progs.values():
        p.timer.release()
        p.compiled = None


def _rel_err(a, b):
    a = np.asarray(a).astype(np.float32)
    b = np.asarray(b).astype(np.float32)
    if a.shape != b.shape:
        return float("inf")
    denom = float(np.max(np.abs(b))) if b.size else 0.0
    return float(np.max(np.abs(a - b))) / (denom or 1.0) if a.size else 0.0


def _hlo_flags(prog, nsets):
    """jaxconv's program must hold its convolution ops (a silent fallback would time something else)."""
    try:
        got = hlo_counts(prog.compiled.as_text())
    except Exception:  # as_text is best-effort
        return []
    missing = missing_jaxconv_ops(got, prog.op, nsets)
    return [f"hlo_missing_calls:{missing}"] if missing else []


def time_programs(progs, dtype, op, sets, impls=("lax", "jaxconv"), repeats=5, min_repeats=3, round_budget_s=2.0):
    """Times one (dtype, op) of a compiled case. Returns the measurement dict (see sweep_report.py)."""
    nsets = len(sets)
    m = dict(dtype=dtype, precision=_cases.dtype_info(dtype)[1] or "DEFAULT", op=op, nsets=nsets, impls={})
    live = []
    for impl in impls:
        p = progs[(impl, dtype, op)]
        r = m["impls"][impl] = dict(compile_s=round(p.compile_s, 4))
        if p.error:
            r["error"] = p.error
        else:
            live.append(impl)
    outs, walls = {}, {}
    for impl in list(live):
        p, r = progs[(impl, dtype, op)], m["impls"][impl]
        try:
            t0 = time.perf_counter()
            out, _ = p.call(sets)
            walls[impl] = time.perf_counter() - t0
            outs[impl] = out[0]
            if impl == "jaxconv":
                r["flags"] = _hlo_flags(p, nsets)
        except Exception as e:
            r["error"] = f"run: {type(e).__name__}: {str(e)[:400]}"
            live.remove(impl)
    if "lax" in outs and "jaxconv" in outs:
        m["rel_err"] = max(_rel_err(a, b) for a, b in zip(outs["jaxconv"], outs["lax"]))
        m["mismatch"] = not m["rel_err"] <= REL_ERR_LIMIT.get(dtype, 1e-2)
    outs = None
    reps = repeats
    while reps > min_repeats and reps * sum(walls.get(i, 0.0) for i in live) > round_budget_s:
        reps -= 1
    samples = {impl: [] for impl in live}
    for rep in range(reps):
        for impl in (live if rep % 2 == 0 else live[::-1]):
            if impl not in samples:
                continue
            try:
                _, span = progs[(impl, dtype, op)].call(sets)
                samples[impl].append(span / nsets)
            except Exception as e:
                m["impls"][impl]["error"] = f"run: {type(e).__name__}: {str(e)[:400]}"
                samples.pop(impl)
    m["repeats"] = reps
    for impl, v in samples.items():
        m["impls"][impl].update(time_s=statistics.median(v), samples_s=v)
    if "lax" in samples and "jaxconv" in samples:
        lx, jc = m["impls"]["lax"]["time_s"], m["impls"]["jaxconv"]["time_s"]
        if lx > 0 and jc > 0:
            m["ratio"] = lx / jc
            per_round = [a / b for a, b in zip(samples["lax"], samples["jaxconv"]) if b > 0]
            if per_round:
                m["ratio_range"] = [min(per_round), max(per_round)]
    return m


def failure_of(m) -> str:
    """'' for a measurement with a ratio, else why it has none."""
    if m.get("ratio") is not None:
        return ""
    errs = [f"{impl}: {r['error']}" for impl, r in m.get("impls", {}).items() if r.get("error")]
    return "; ".join(errs) or m.get("error") or "no time"
