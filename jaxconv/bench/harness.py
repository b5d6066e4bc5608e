"""Timing of one (case, dtype, op) for several implementations: the T-slope method of GUIDE.md section 4.

For each implementation and each T in Ts, one jitted function applies the op to T distinct input sets (distinct
random data, passed as arguments so nothing is constant-folded) and returns every output (so nothing is dead-code
eliminated or CSE'd; the compiled HLO is checked for the expected number of jaxconv custom calls). Each call is
timed on the device by in-stream marks around its T ops (stream_timer.py: CUDA events on the GPU), over repeats,
interleaving T values and implementations, after warm-up. The least-squares slope of time = a + b*T is the device
time per op, with a t-interval. (The wall time of call + block_until_ready, the method before the marks, also grew
by the host's dispatch work per input set; it stays the measure when the extension lacks the marks.)
"""
from __future__ import annotations

import contextlib
import math
import random
import re
import threading
import time

import numpy as np

from . import cases as _cases
from . import stream_timer
from .stats import fit_samples
from .trace import profile_device_time

_UID = [0]


def _impl_fn(name):
    """lax, jaxconv (auto) or jaxconv:NAME, jaxconv with one family or variant forced (`algorithm=NAME`)."""
    from jax import lax
    if name == "lax":
        return lax.conv_general_dilated
    if name == "jaxconv":
        import jaxconv
        return jaxconv.conv_general_dilated
    if name.startswith("jaxconv:"):
        from jaxconv import registry
        algorithm = name.split(":", 1)[1]
        if algorithm not in registry.names():
            raise ValueError(f"unknown jaxconv algorithm {algorithm!r} in implementation {name!r}")
        return _forced_conv(algorithm)
    raise ValueError(f"unknown implementation {name!r}")


def _forced_conv(algorithm):
    """conv_general_dilated's signature with `algorithm` forced (its gradients take the same request)."""
    from jaxconv import api

    def conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
             feature_group_count=1, batch_group_count=1, precision=None, preferred_element_type=None):
        return api._conv(lhs, rhs, None, window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
                         rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
                         feature_group_count=feature_group_count, batch_group_count=batch_group_count,
                         precision=precision, preferred_element_type=preferred_element_type, activation=None,
                         algorithm=algorithm, fn="conv_general_dilated")
    return conv


def _precision(prec_name):
    from jax import lax
    return None if prec_name is None else getattr(lax.Precision, prec_name)


def conv_kwargs(case, dtype) -> dict:
    """The keyword arguments of conv_general_dilated (lax's names) for a case at a suite dtype name."""
    _, prec_name, _ = _cases.dtype_info(dtype)
    return dict(window_strides=tuple(case.stride), padding=tuple(tuple(p) for p in case.padding),
                lhs_dilation=tuple(case.lhs_dil), rhs_dilation=tuple(case.dilation),
                dimension_numbers=case.dimension_numbers(), feature_group_count=case.groups,
                batch_group_count=case.batch_groups, precision=_precision(prec_name))


def case_problems(case, dtype) -> dict:
    """{op: jaxconv.algorithms.Problem} of a case at a suite dtype name, as its lowering sees them (an op with no
    work has no entry)."""
    import jax

    from jaxconv.algorithms import problems
    jdt = _cases.dtype_info(dtype)[0]
    xs, ws, _ = case.shapes()
    return problems(jax.ShapeDtypeStruct(xs, jdt), jax.ShapeDtypeStruct(ws, jdt), **conv_kwargs(case, dtype))


def auto_variants(case, dtype, ops=("fwd", "dgrad", "wgrad"), gpu=None) -> dict | None:
    """{op: the variant auto runs} for a case at a suite dtype name: the CUDA lowering's choice (autotune cache
    included), xla.conv where XLA's convolution runs. None off the GPU (gpu=None asks JAX; gpu=True answers for the
    registry's device, a default Hopper on a machine without one), where the CPU handlers have one kernel set."""
    import jax

    from jaxconv import registry
    if gpu is None:
        gpu = jax.default_backend() == "gpu"
    if not gpu or not registry.has_kernels():
        return None
    from jaxconv.primitives.lowering import choose
    probs = case_problems(case, dtype)
    out = {}
    for op in ops:
        p = probs.get(op)
        if p is not None:
            try:
                out[op] = choose(op, p.spec, p.nck, p.dtype, p.out_dtype).name
            except ValueError as e:  # nothing runs it: the measurement reports the lowering's error
                out[op] = f"none: {e}"
    return out


def make_op(conv, case, dtype, op):
    """Returns f(x, w, dy) -> tuple of outputs for one input set. dgrad/wgrad/fwd+bwd are pieces of jax.vjp of
    the implementation itself, so both sides compute the same thing through their own differentiation rules."""
    import jax
    kw = conv_kwargs(case, dtype)

    def f(x, w):
        return conv(x, w, **kw)

    op = _cases.canon_op(op)
    if op == "fwd":
        return lambda x, w, dy: (f(x, w),)
    if op == "dgrad":
        def dgrad(x, w, dy):
            _, vjp = jax.vjp(lambda x_: f(x_, w), x)
            return vjp(dy)
        return dgrad
    if op == "wgrad":
        def wgrad(x, w, dy):
            _, vjp = jax.vjp(lambda w_: f(x, w_), w)
            return vjp(dy)
        return wgrad

    def fwdbwd(x, w, dy):
        y, vjp = jax.vjp(f, x, w)
        dx, dw = vjp(dy)
        return y, dx, dw
    return fwdbwd


def _w_scale(case):
    ws = case.shapes()[1]
    fan_in = math.prod(ws) // max(ws[-1] if case.layout == "channels_last" else ws[0], 1)
    return 1.0 / math.sqrt(max(1, fan_in))


_GEN_CACHE = {}


def _device_gen(shapes, dtype_name, w_scale):
    """One jitted generator per (shapes, dtype): distinct keys give distinct sets without recompiling."""
    import jax
    import jax.numpy as jnp
    key = (shapes, dtype_name, w_scale)
    if key not in _GEN_CACHE:
        jdt = jnp.dtype(dtype_name)
        gdt = jnp.float32 if jdt.itemsize < 4 else jdt

        @jax.jit
        def gen(k):
            k1, k2, k3 = jax.random.split(k, 3)
            return (jax.random.normal(k1, shapes[0], gdt).astype(jdt),
                    (jax.random.normal(k2, shapes[1], gdt) * w_scale).astype(jdt),
                    jax.random.normal(k3, shapes[2], gdt).astype(jdt))
        _GEN_CACHE[key] = gen
    return _GEN_CACHE[key]


def make_inputs(case, dtype, nsets, seed=0, host_limit_bytes=256 << 20):
    """nsets distinct (x, w, dy) sets of normal random data (never zeros) on the default device. Small sets (and all
    sets on the CPU backend) are drawn with numpy and transferred (no compile); large GPU sets on the device."""
    import jax
    import jax.numpy as jnp
    npdt, _, itemsize = _cases.dtype_info(dtype)
    shapes = tuple(tuple(s) for s in case.shapes())
    ws = _w_scale(case)
    total = nsets * sum(math.prod(s) for s in shapes) * 4
    if jax.default_backend() == "cpu" or total <= host_limit_bytes:
        jdt = jnp.dtype(npdt)
        hdt = np.float64 if npdt == "float64" else np.float32
        out = []
        for i in range(nsets):
            rng = np.random.default_rng([seed, i])
            x = rng.standard_normal(shapes[0], dtype=hdt)
            w = rng.standard_normal(shapes[1], dtype=hdt) * hdt(ws)
            dy = rng.standard_normal(shapes[2], dtype=hdt)
            out.append(tuple(jax.device_put(a.astype(jdt)) for a in (x, w, dy)))
        return out
    gen = _device_gen(shapes, npdt, ws)
    base = jax.random.key(seed)
    return [gen(jax.random.fold_in(base, i)) for i in range(nsets)]


def batched(fn_one, T, name):
    def run(sets):
        return tuple(fn_one(*s) for s in sets)
    run.__name__ = run.__qualname__ = name
    return run


def hlo_counts(text):
    """Counts of the ops that matter in the compiled HLO text."""
    cnt = {}
    for m in re.finditer(r'custom_call_target="([^"]+)"', text):
        cnt[m.group(1)] = cnt.get(m.group(1), 0) + 1
    cnt["convolution"] = len(re.findall(r"\sconvolution\(", text))
    cnt["fusion"] = len(re.findall(r"\sfusion\(", text))
    return cnt


def expected_jaxconv_calls(op, T):
    return {"fwd": {"jaxconv_fwd": T}, "dgrad": {"jaxconv_dgrad": T}, "wgrad": {"jaxconv_wgrad": T},
            "fwd+bwd": {"jaxconv_fwd": T, "jaxconv_dgrad": T, "jaxconv_wgrad": T}}[op]


def missing_jaxconv_ops(counts, op, T) -> dict:
    """{target: (found, expected)} when jaxconv's program holds fewer convolution ops than it should: each op is one
    jaxconv custom call, or XLA's own convolution where the registry picks its xla.conv variant (so a silent
    fallback to something else would show as missing ops)."""
    exp = expected_jaxconv_calls(op, T)
    xla = counts.get("convolution", 0) + sum(v for k, v in counts.items() if k.startswith("__cudnn$conv"))
    have = sum(counts.get(k, 0) for k in exp) + xla
    if have >= sum(exp.values()):
        return {}
    return {k: (counts.get(k, 0), v) for k, v in exp.items() if counts.get(k, 0) < v}


def _rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    denom = float(np.max(np.abs(b))) or 1.0
    return float(np.max(np.abs(a - b))) / denom if a.size else 0.0


@contextlib.contextmanager
def _reported_while_slow(log, what, every_s):
    """Calls log(...) every every_s seconds while the block runs. XLA compiles with the GIL released, so a cuDNN
    autotuning that takes minutes shows in the log instead of a silent run cut off by a time guard."""
    if log is None:
        yield
        return
    t0, stop = time.perf_counter(), threading.Event()

    def watch():
        while not stop.wait(every_s):
            log(f"{what}: still running after {time.perf_counter() - t0:.0f} s")

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def time_entry(case, dtype, op, impls=("jaxconv", "lax"), Ts=(1, 2, 4, 8, 16), repeats=10, min_repeats=3,
               budget_s=20.0, mem_budget=8 << 30, profile="auto", seed=0, log=None, compiler_options=None,
               slow_compile_s=30.0):
    """Times one (case, dtype, op) for every implementation. Returns a result dict (see report.py for the schema).

    compiler_options: {impl: XLA compile options} for that implementation's compilations (e.g. lax's
    xla_gpu_autotune_level, cli.py's --lax-autotune-level); an unknown option name raises.
    log: a callable taking one line; a compilation still running after slow_compile_s seconds is reported to it, and
    again every slow_compile_s seconds.
    """
    timers = []
    try:
        return _time_entry(case, dtype, op, impls, Ts, repeats, min_repeats, budget_s, mem_budget, profile, seed,
                           timers, compiler_options or {}, log, slow_compile_s)
    finally:
        for timer in timers:
            timer.release()


def _time_entry(case, dtype, op, impls, Ts, repeats, min_repeats, budget_s, mem_budget, profile, seed, timers,
                compiler_options, log, slow_compile_s):
    import jax
    op = _cases.canon_op(op)
    _, _, itemsize = _cases.dtype_info(dtype)
    xs, ws, ys = (math.prod(s) for s in case.shapes())
    set_bytes = (xs + ws + ys) * itemsize
    out_bytes = {"fwd": ys, "dgrad": xs, "wgrad": ws, "fwd+bwd": xs + ws + ys}[op] * itemsize
    # Inputs for max(T) sets stay resident, outputs of one call of T sets (x2 for the previous call's buffers).
    Ts = sorted(set(int(t) for t in Ts))
    while len(Ts) > 2 and Ts[-1] * (set_bytes + 2 * out_bytes) > mem_budget:
        Ts.pop()
    notes = []
    if Ts[-1] * (set_bytes + 2 * out_bytes) > mem_budget:
        raise MemoryError(f"one input set needs {set_bytes / 2**30:.2f} GiB; over the memory budget")
    sets = make_inputs(case, dtype, max(Ts), seed)
    jax.block_until_ready(sets)

    res = dict(impls={}, Ts=list(Ts), notes=notes)
    compiled, fns = {}, {}

    use_marks = stream_timer.available()

    def compile_lowered(impl, lowered, T):
        what = f"{case.name} {dtype} {op}: compiling {impl} (T={T})"
        with _reported_while_slow(log, what, slow_compile_s):
            return lowered.compile(compiler_options=compiler_options.get(impl))

    def compile_one(impl, T):
        r = res["impls"][impl]
        name = f"bench_{impl}_{re.sub('[^a-z0-9]', '', op)}_t{T}_u{_UID[0]}"
        t0 = time.perf_counter()
        fn, timer = batched(fns[impl], T, name), None
        if use_marks:
            timer = stream_timer.StreamTimer()
            timers.append(timer)
            fn = timer.wrap(fn)
        c = compile_lowered(impl, jax.jit(fn).lower(sets[:T]), T)
        r["compile_s"] = r.get("compile_s", 0.0) + time.perf_counter() - t0
        compiled[impl][T] = (c, "jit_" + name, timer)
        return c

    def outputs(impl, T):
        """The T output tuples of one call (the marks' tokens dropped)."""
        c, _, timer = compiled[impl][T]
        out = c(sets[:T])
        return out[0] if timer is not None else out

    def warm(impl, T):
        c, _, _ = compiled[impl][T]
        for _ in range(2):
            t0 = time.perf_counter()
            jax.block_until_ready(c(sets[:T]))
            est[(impl, T)] = time.perf_counter() - t0

    # 1) smallest T first: compile, warm up, estimate the cost per op (an upper bound: includes dispatch)
    est = {}
    _UID[0] += 1
    for impl in impls:
        res["impls"][impl] = dict(hlo={})
        if compiler_options.get(impl):
            res["impls"][impl]["compiler_options"] = dict(compiler_options[impl])
        compiled[impl] = {}
        try:
            fns[impl] = make_op(_impl_fn(impl), case, dtype, op)
            compile_one(impl, Ts[0])
            warm(impl, Ts[0])
        except Exception as e:
            res["impls"][impl]["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            compiled.pop(impl)
    live = list(compiled)
    if not live:
        return res
    # 2) fit the T list and the repeats to the time budget before compiling the large T values
    per_op = {i: est[(i, Ts[0])] / Ts[0] for i in live}
    round_s = lambda ts: sum(per_op[i] * t for i in live for t in ts)
    reps = repeats
    while reps > min_repeats and reps * round_s(Ts) > budget_s:
        reps -= 1
    while len(Ts) > 3 and min_repeats * round_s(Ts) > budget_s:
        notes.append(f"dropped T={Ts.pop()} (time budget)")
    # 3) compile and warm up the rest
    for impl in list(live):
        r = res["impls"][impl]
        try:
            for T in Ts[1:]:
                compile_one(impl, T)
                warm(impl, T)
            try:
                r["hlo"] = hlo_counts(compiled[impl][Ts[-1]][0].as_text())
            except Exception as e:  # as_text is best-effort
                r["hlo"] = {"error": str(e)}
            if impl == "jaxconv" and "error" not in r["hlo"]:
                exp = expected_jaxconv_calls(op, Ts[-1])
                got = {k: v for k, v in r["hlo"].items() if k.startswith("jaxconv") and k != stream_timer.TARGET}
                bad = missing_jaxconv_ops(r["hlo"], op, Ts[-1])
                extra = {k: v for k, v in got.items() if k not in exp}
                if bad:
                    r.setdefault("flags", []).append(f"hlo_missing_calls:{bad}")
                if extra:
                    r.setdefault("flags", []).append(f"hlo_extra_calls:{extra}")
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            compiled.pop(impl)
            live.remove(impl)
    if not live:
        return res
    one_round = sum(est[(i, t)] for i in live for t in Ts)
    while reps > min_repeats and reps * one_round > budget_s:
        reps -= 1
    res["Ts"] = list(Ts)
    res["repeats"] = reps

    # Correctness cross-check on set 0 (T=1): both implementations compute the same thing.
    if "jaxconv" in live and "lax" in live:
        try:
            a = outputs("jaxconv", Ts[0])[0]
            b = outputs("lax", Ts[0])[0]
            res["rel_err"] = max(_rel_err(u, v) for u, v in zip(a, b))
        except Exception as e:
            res["rel_err_error"] = str(e)[:200]

    samples = {impl: {T: [] for T in Ts} for impl in live}  # device time between the marks (else wall)
    rng = random.Random(seed)
    for rep in range(reps):
        order = list(Ts)
        rng.shuffle(order)
        for T in order:
            imp_order = live if rep % 2 == 0 else live[::-1]
            for impl in imp_order:
                c, _, timer = compiled[impl][T]
                args = sets[:T]
                t0 = time.perf_counter()
                out = c(args)
                jax.block_until_ready(out)
                wall = time.perf_counter() - t0
                samples[impl][T].append(timer.elapsed_s() if timer is not None else wall)
                del out

    fits, profs = {}, {}
    for impl in live:
        r = res["impls"][impl]
        fit = fits[impl] = fit_samples(samples[impl])
        r["fit"] = {k: v for k, v in fit.items() if k not in ("min_fit",)}
        if fit.get("min_fit"):
            r["fit"]["min_fit_b"] = fit["min_fit"]["b"]
        r["samples"] = {str(t): v for t, v in samples[impl].items()}
        r["timing"] = "stream marks" if use_marks else "wall"
        r.setdefault("flags", []).extend(fit["flags"])
    # The profiler runs for every implementation when any fit is poor, so that a ratio never divides a fitted
    # slope by a profiler time (on short kernels the two differed by up to 3x on the same build).
    if profile == "always" or (profile in ("auto", "first") and not all(f["ok"] for f in fits.values())):
        for impl in live:
            c, mod, timer = compiled[impl][Ts[0]]
            if timer is not None:  # the marked program's argument copies would count as busy time
                name = mod[len("jit_"):] + "_prof"
                lowered = jax.jit(batched(fns[impl], Ts[0], name)).lower(sets[:Ts[0]])
                c, mod = compile_lowered(impl, lowered, Ts[0]), "jit_" + name
            per = max(est.get((impl, Ts[0]), 0.01), 1e-6)
            ncalls = int(max(2, min(10, 2.0 / per)))
            prof = profile_device_time(c, (sets[:Ts[0]],), mod, ncalls=ncalls)
            if prof.get("ok"):
                prof["per_op_us"] = prof["per_call_us"] / Ts[0]
            res["impls"][impl]["profiler"] = profs[impl] = prof
    tmax = Ts[-1]
    for impl, (t, ci, src) in choose_sources(fits, profs, tmax, {i: samples[i][tmax] for i in live}).items():
        r = res["impls"][impl]
        r["time_s"], r["ci90_s"], r["time_source"] = t, ci, src
    return res


def choose_sources(fits, profs, tmax, tmax_samples):
    """Per implementation (time_s, ci90_s, time_source), one source for all where possible.

    All fits good: the fits (profiler times, if taken, stay a cross-check). Otherwise, when every implementation
    has a profiler time: the profiler for all, a good fit included. Otherwise each falls back alone: a good fit
    stays; a poor one takes its profiler time, else the fit over per-T minima, else the fastest time at the
    largest T over T (an upper bound)."""
    def prof_us(i):
        p = profs.get(i) or {}
        return p["per_op_us"] if p.get("ok") and p.get("per_op_us", 0) > 0 else None

    all_fit = all(f["ok"] for f in fits.values())
    all_prof = all(prof_us(i) is not None for i in fits)
    out = {}
    for impl, fit in fits.items():
        if all_fit or (fit["ok"] and not all_prof):
            out[impl] = (fit["b"], fit["ci"], "fit")
        elif prof_us(impl) is not None:
            out[impl] = (prof_us(impl) * 1e-6, [None, None], "profiler")
        elif fit.get("min_fit") and fit["min_fit"]["b"] > 0:
            out[impl] = (fit["min_fit"]["b"], fit["min_fit"]["ci"], "min-fit")
        else:
            out[impl] = (min(tmax_samples[impl]) / tmax, [None, None], "upper-bound(min time/T)")
    return out
