"""The sweep mode of the CLI: `--sweep N --seed S` (or `--sweep-case I[,J...] --seed S`): draw the cases
(sweep.py), time each with the sweep's method (sweep_timing.py), then re-time the lowest ratios once more and
write the reports (sweep_report.py). Progress goes to stderr, one line per case; the summary to stdout, last."""
from __future__ import annotations

import datetime
import os
import sys
import time

from . import cases as _cases
from . import device as _device
from . import harness as _harness
from . import sweep as _sweep
from . import sweep_report as _report
from . import sweep_timing as _timing

DEFAULT_DTYPES = ("bfloat16", "float32")
DEFAULT_OPS = ("fwd+bwd",)
DEFAULT_BUDGET_S = 400.0     # no case starts after this: a 150-case sweep then fits one 10-minute device call
DEFAULT_REPEATS = 5
DEFAULT_RECHECK = 5           # at most; one per 10 cases in smaller sweeps
ROUND_BUDGET_S = 2.0         # the timed rounds of one measurement take about this at most (at least 3 rounds)


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def _fmt_measurement(m):
    r = m.get("ratio")
    if r is None:
        return f"{m['dtype']} {m['op']} FAILED ({_timing.failure_of(m)[:120]})"
    lx, jc = m["impls"]["lax"]["time_s"], m["impls"]["jaxconv"]["time_s"]
    s = f"{m['dtype']} {m['op']} lax {lx * 1e6:.4g} jc {jc * 1e6:.4g} µs -> {r:.3g}"
    return s + (" (outputs differ)" if m.get("mismatch") else "")


def variants_of(case, dtype, op, gpu=None):
    """{op: the variant auto runs} for one measurement (fwd+bwd: all three ops); None off the GPU or where the case
    has no problem at that dtype (gpu: as harness.auto_variants)."""
    ops = ("fwd", "dgrad", "wgrad") if op == "fwd+bwd" else (op,)
    try:
        return _harness.auto_variants(case, dtype, ops, gpu=gpu)
    except (TypeError, ValueError):
        return None


class _Clock:
    """Seconds spent per phase of the run."""

    def __init__(self):
        self.total = {"draw": 0.0, "inputs": 0.0, "compile": 0.0, "timing": 0.0}

    def add(self, phase, t0):
        self.total[phase] += time.perf_counter() - t0
        return time.perf_counter()


def measure_case(index, case, dtypes, ops, repeats, compiler_options, clock, tag):
    """One measurement per (dtype, op) of case `index` (whose number also seeds its input data)."""
    nsets = _timing.nsets_for(case)
    inputs = _timing.InputSets(case, dtypes, nsets, data_seed=index)
    t0 = time.perf_counter()
    progs = _timing.compile_case(case, dtypes, ops, nsets, compiler_options=compiler_options, tag=tag,
                                 host_work=inputs.prepare)
    t0 = clock.add("compile", t0)
    try:
        sets = inputs.get()
        t0 = clock.add("inputs", t0)
        out = []
        for dt in dtypes:
            for op in ops:
                out.append(_timing.time_programs(progs, dt, op, sets[dt], repeats=repeats,
                                                 round_budget_s=ROUND_BUDGET_S))
        clock.add("timing", t0)
        return out
    finally:
        _timing.release(progs)


def _recheck(records, k, repeats, compiler_options, clock, t_start, budget):
    """Measures the k lowest ratios again from scratch (new compilation, same inputs): the run-to-run spread."""
    out = []
    for r, m in _report.worst(records, k):
        if time.perf_counter() - t_start > budget:
            break
        c = dict(index=r["index"], name=r["name"], dtype=m["dtype"], op=m["op"], ratio=m["ratio"])
        try:
            again = measure_case(r["index"], r["case_obj"], [m["dtype"]], [m["op"]], repeats, compiler_options,
                                 clock, f"recheck{r['index']}")[0]
        except Exception as e:  # the first measurement stands; the recheck reports why it has no second
            again = dict(error=f"{type(e).__name__}: {str(e)[:400]}")
        c.update(ratio_again=again.get("ratio"), measurement=again)
        if again.get("ratio"):
            c["again_over_first"] = again["ratio"] / m["ratio"]
        out.append(c)
        second = f"{again['ratio']:.3g}" if again.get("ratio") else f"FAILED ({_timing.failure_of(again)[:120]})"
        _log(f"[recheck] {r['name']} {m['dtype']} {m['op']}: {m['ratio']:.3g}, then {second}")
    return out


def run(args, argv) -> int:
    """Runs the sweep for parsed CLI args (cli.py checked them). Returns the exit status: 1 if a measurement
    failed (the reports list it), else 0."""
    t_start = time.perf_counter()
    dtypes = tuple(_cases.canon_dtype(d) for d in args.dtypes.split(",") if d.strip()) if args.dtypes \
        else DEFAULT_DTYPES
    ops = tuple(_cases.canon_op(o) for o in args.ops.split(",") if o.strip()) if args.ops else DEFAULT_OPS
    if "float64" in dtypes:
        import jax
        jax.config.update("jax_enable_x64", True)

    meta = _device.run_metadata(sys.argv[:1] + list(argv if argv is not None else sys.argv[1:]))
    scale = args.sweep_scale or _sweep.scale_for_backend(meta["platform"])
    indices = list(range(args.sweep)) if args.sweep is not None else args.sweep_case
    clock = _Clock()
    t0 = time.perf_counter()
    cases = [_sweep.draw_case(args.seed, i, scale) for i in indices]
    clock.add("draw", t0)
    if args.list:
        for i, c in zip(indices, cases):
            print(f"{i:4d} {c.name:28s} {c.short():56s} {_sweep.case_padding_mode(c):10s} "
                  f"fwd GFLOP={c.flops('fwd') / 1e9:.3g}")
        return 0
    if isinstance(meta.get("jaxconv_build_info"), str):
        raise SystemExit(f"jaxconv is not usable ({meta['jaxconv_build_info']})")
    out = args.out or os.path.join("bench_results", "sweep_" + datetime.datetime.now(datetime.timezone.utc)
                                   .strftime("%Y%m%dT%H%M%SZ"))
    os.makedirs(out, exist_ok=True)
    budget = args.budget if args.budget is not None else DEFAULT_BUDGET_S
    repeats = args.repeats or DEFAULT_REPEATS
    recheck_k = args.sweep_recheck if args.sweep_recheck is not None else min(DEFAULT_RECHECK, -(-len(indices) // 10))
    compiler_options = {}
    if args.lax_autotune_level is not None:
        compiler_options["lax"] = {"xla_gpu_autotune_level": args.lax_autotune_level}
    meta.update(mode="sweep", seed=args.seed, n_cases=len(indices), indices=indices, scale=scale,
                scale_bounds=vars(_sweep.SCALES[scale]), distribution_version=_sweep.DISTRIBUTION_VERSION,
                dtypes=list(dtypes), ops=list(ops), budget_s=budget, repeats=repeats, recheck=recheck_k,
                round_budget_s=ROUND_BUDGET_S, compiler_options=compiler_options, method=_report.METHOD,
                kernel_variant="per measurement, 'variants': the variant auto runs for each op (GPU only)")
    _log(f"[jaxconv.bench] sweep seed {args.seed}: {_report.n_cases_label(meta)}, scale {scale}, {meta['device_kind']} "
         f"({meta['platform']}), jax {meta['jax']}; dtypes {','.join(dtypes)}; ops {','.join(ops)}; "
         f"budget {budget:g} s")

    json_path, md_path = os.path.join(out, "results.json"), os.path.join(out, "results.md")
    records, skipped = [], []

    def update_meta():
        meta.update(elapsed_s=time.perf_counter() - t_start, skipped_indices=skipped,
                    **{f"{k}_s": v for k, v in clock.total.items()})

    for n, (i, case) in enumerate(zip(indices, cases), 1):
        rec = dict(index=i, name=case.name, config=_report.config_json(case), case_obj=case, measurements=[])
        records.append(rec)
        if time.perf_counter() - t_start > budget:
            rec["skipped"] = "budget"
            skipped.append(i)
            continue
        t_case = time.perf_counter()
        try:
            rec["measurements"] = measure_case(i, case, dtypes, ops, repeats, compiler_options, clock, f"sweep{i}")
            for m in rec["measurements"]:
                m["variants"] = variants_of(case, m["dtype"], m["op"])
        except Exception as e:  # one broken case must not end the sweep: each of its measurements fails
            err = f"{type(e).__name__}: {str(e)[:400]}"
            rec["measurements"] = [dict(dtype=dt, op=op, impls={}, error=err) for dt in dtypes for op in ops]
        rec["elapsed_s"] = time.perf_counter() - t_case
        parts = [_fmt_measurement(m) for m in rec["measurements"]]
        _log(f"[{n}/{len(indices)}] {case.name} {case.short()} ({case.flops('fwd') / 1e9:.3g} GFLOP fwd): "
             + " | ".join(parts) + f"  ({rec['elapsed_s']:.1f} s)")
        update_meta()
        _report.write_json(json_path, meta, records, None, None)
    if skipped:
        _log(f"[jaxconv.bench] budget of {budget:g} s spent: {len(skipped)} cases not measured")

    recheck = _recheck(records, recheck_k, repeats, compiler_options, clock, t_start, budget)
    summary = _report.summarize(records, dtypes, ops)
    update_meta()
    files = [json_path, md_path]
    if not args.no_plots:
        try:
            files.append(_report.write_plot(os.path.join(out, "sweep.png"), meta, records, dtypes, ops))
        except Exception as e:  # the numbers matter more than the picture
            _log(f"[jaxconv.bench] plot failed: {type(e).__name__}: {e}")
    update_meta()
    _report.write_json(json_path, meta, records, summary, recheck)
    _report.write_markdown(md_path, meta, records, summary, recheck)
    for line in _report.console_lines(meta, records, summary):
        print(line)
    print(f"wrote {', '.join(files)} ({meta['elapsed_s']:.0f} s: compiling {clock.total['compile']:.0f} s, timing "
          f"{clock.total['timing']:.0f} s)", flush=True)
    return 1 if summary["all"]["failed"] else 0
