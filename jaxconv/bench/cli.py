"""Command line: python -m jaxconv.bench ..."""
from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time

from . import cases as _cases

DESCRIPTION = """\
Device-time benchmarks of jaxconv.conv_general_dilated against lax.conv_general_dilated (and optionally
torch), in the same process, on the same inputs and precision, on JAX's default backend (CPU: jaxconv's CPU
custom calls vs XLA:CPU; GPU: jaxconv's CUDA kernels vs cuDNN). Method: GUIDE.md section 4 (T-slope fit,
90% t-interval, R^2, poor fits flagged and cross-checked with jax.profiler). Writes results.json,
results.md, speedup.png, roofline.png under --out, and one progress line per measurement on stderr."""

EPILOG = _cases.CASE_SPEC_HELP + """
dtypes: bfloat16, float16, float32 (lax DEFAULT precision: TF32 on GPU), float32-high, float32-highest (true FP32),
  float64.  ops: fwd, dgrad, wgrad, fwdbwd (= fwd+bwd: forward and both gradients).
--ops / --dtypes, when given, replace the lists of every selected case.

sweep mode (--sweep N --seed S): N random realistic convolutions drawn from the distribution in docs/sweep.md
  (python -m jaxconv.bench.sweep prints it), each timed fwd+bwd (or --ops) in bfloat16 and float32 (or --dtypes)
  against lax with a cheap device-time method: in-stream marks around one jitted call over 1-4 input sets, one
  compile per side, median of --repeats rounds (default 5). --budget is then the whole run's seconds (default 400;
  no case starts after it, the rest are reported as not measured). Sizes: --sweep-scale full (default on a GPU) or
  tiny (default on the CPU). Writes results.json, results.md (min, p10, median, geomean of lax/jaxconv per dtype
  and op, the 10 lowest with replay commands, failures) and sweep.png under --out.

examples:
  python -m jaxconv.bench --sweep 150 --seed 0 --out /tmp/sweep   # both dtypes, fwd+bwd; < 8 min on an H200
  python -m jaxconv.bench --sweep-case 17 --seed 0 --dtypes float32 --ops fwd,dgrad,wgrad   # one case again
  python -m jaxconv.bench --sweep 20 --seed 3 --list            # the drawn cases, no timing
  python -m jaxconv.bench --quick                               # tiny built-in cases, < 2 min on a laptop CPU
  python -m jaxconv.bench --filter 'resnet50_res4|msd' --dtypes bfloat16 --ops fwd,fwdbwd --out /tmp/b
  python -m jaxconv.bench --case 32:14x14:256->256:3x3:p1 --case seed_msd_1to1_3x3_4096 --out /tmp/b
  python -m jaxconv.bench --list
"""


def build_parser():
    p = argparse.ArgumentParser(prog="python -m jaxconv.bench", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", help="suite JSON (default: benchmarks/suite.json of the source tree; "
                                   "with --quick and no --suite/--case: built-in tiny cases)")
    p.add_argument("--case", action="append", default=[], metavar="SPEC", help="one case; repeatable (see below)")
    p.add_argument("--filter", metavar="REGEX", help="select suite cases whose name matches (re.search)")
    p.add_argument("--ops", help="comma list of fwd,dgrad,wgrad,fwdbwd")
    p.add_argument("--dtypes", help="comma list, e.g. bfloat16,float32,float32-highest")
    p.add_argument("--quick", action="store_true",
                   help="fast smoke run: built-in tiny cases (unless --suite/--case), T=1,2,4, 5 repeats")
    p.add_argument("--out", help="output directory (default: bench_results/<UTC timestamp>)")
    p.add_argument("--torch", action="store_true", help="also time torch.nn.functional.conv*d when importable")
    p.add_argument("--impls", default="jaxconv,lax", help="implementations to time (default jaxconv,lax)")
    p.add_argument("--ts", help="T values (default 1,2,4,8,16; --quick 1,2,4)")
    p.add_argument("--repeats", type=int, help="samples per T (default 10; --quick 5); reduced to fit --budget")
    p.add_argument("--budget", type=float, help="seconds of timing per (case, dtype, op) (default 20; --quick 1.5); "
                                                "with --sweep: seconds for the whole run (default 400)")
    p.add_argument("--profile", choices=("auto", "always", "never", "first"),
                   help="jax.profiler cross-check: auto = only for poor fits (default), always, never, "
                        "first = the first measurement plus poor fits (--quick default)")
    p.add_argument("--lax-autotune-level", type=int, choices=range(5), metavar="{0..4}",
                   help="XLA's xla_gpu_autotune_level for lax's compilations only. XLA's default, 4, also checks "
                        "every candidate cuDNN algorithm's results against a reference; 2 autotunes on initialised "
                        "data without that check, so lax still runs the fastest algorithm it measured (one that the "
                        "check would have rejected only makes lax look faster); 0 does not autotune and takes cuDNN's "
                        "heuristic choice. For large float32 problems autotuning can outlast a device session (the "
                        "1M x 2047 conv1d's HIGHEST gradients: over 200 s at 4, over 520 s at 2; 0.2 s at 0). "
                        "Recorded in the metadata and the report")
    p.add_argument("--jaxconv-tensor-cores", action="store_true",
                   help="jaxconv's kernels use tensor cores: its own floor uses the best path's peak")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    p.add_argument("--seed", type=int, default=0, help="input data seed; with --sweep: the seed of the drawn cases")
    p.add_argument("--sweep", type=int, metavar="N", help="random sweep: draw N cases from the seed (see below)")
    p.add_argument("--sweep-case", metavar="I[,J...]",
                   help="measure only these case indices of the seed's sweep (replays one case of a sweep)")
    p.add_argument("--sweep-scale", metavar="{full,tiny}",
                   help="case sizes: full (default on a GPU) or tiny (default on the CPU)")
    p.add_argument("--sweep-recheck", type=int, metavar="K",
                   help="re-time the K lowest ratios after the sweep, compiled again (default 5, or one per 10 "
                        "cases in smaller sweeps; 0: none)")
    p.add_argument("--list", action="store_true", help="list the selected cases (compact form) and exit")
    return p


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def select_cases(args):
    suite_path = args.suite
    if suite_path is None and not (args.quick and not args.case):
        suite_path = _cases.default_suite_path()
    suite = _cases.load_suite(suite_path) if suite_path else []
    if args.case:
        sel = [_cases.parse_case_spec(s, suite) for s in args.case]
    elif args.quick and args.suite is None:
        sel = _cases.quick_cases()
    else:
        if not suite:
            raise SystemExit("no suite found: pass --suite FILE or --case SPEC")
        sel = suite
    if args.filter:
        import re
        rx = re.compile(args.filter)
        sel = [c for c in sel if rx.search(c.name)]
    import dataclasses
    if args.ops:
        ops = tuple(_cases.canon_op(o) for o in args.ops.split(",") if o.strip())
        sel = [dataclasses.replace(c, ops=ops) for c in sel]
    if args.dtypes:
        dts = tuple(_cases.canon_dtype(d) for d in args.dtypes.split(",") if d.strip())
        sel = [dataclasses.replace(c, dtypes=dts) for c in sel]
    return sel, suite_path


def _check_sweep_args(parser, args):
    """Rejects flags the sweep mode does not take and malformed values, with argparse's usage message."""
    if args.sweep is not None and args.sweep_case is not None:
        parser.error("--sweep and --sweep-case are exclusive: --sweep N draws cases 0..N-1, --sweep-case picks some")
    if args.sweep is not None and args.sweep < 1:
        parser.error(f"--sweep N needs N >= 1, got {args.sweep}")
    if args.sweep_case is not None:
        try:
            idx = [int(v) for v in args.sweep_case.split(",") if v.strip()]
        except ValueError:
            parser.error(f"--sweep-case takes case indices like 17 or 3,17,40, got {args.sweep_case!r}")
        if not idx or min(idx) < 0:
            parser.error(f"--sweep-case takes non-negative case indices, got {args.sweep_case!r}")
        args.sweep_case = idx
    from .sweep import SCALES
    if args.sweep_scale is not None and args.sweep_scale not in SCALES:
        parser.error(f"--sweep-scale must be one of {', '.join(SCALES)}, got {args.sweep_scale!r}")
    clash = [flag for flag, on in (("--case", args.case), ("--suite", args.suite), ("--filter", args.filter),
                                   ("--quick", args.quick), ("--torch", args.torch), ("--ts", args.ts),
                                   ("--profile", args.profile), ("--jaxconv-tensor-cores", args.jaxconv_tensor_cores),
                                   ("--impls", args.impls != "jaxconv,lax")) if on]
    if clash:
        parser.error(f"{', '.join(clash)} cannot be combined with --sweep/--sweep-case (the sweep draws its own "
                     "cases and times lax against jaxconv)")
    for name, v, lo in (("--budget", args.budget, 0.0), ("--repeats", args.repeats, 1),
                        ("--sweep-recheck", args.sweep_recheck, 0)):
        if v is not None and not v >= lo:
            parser.error(f"{name} must be >= {lo}, got {v}")
    for flag, v in (("--dtypes", args.dtypes), ("--ops", args.ops)):
        if v is not None and not v.replace(",", "").strip():
            parser.error(f"{flag} is empty")
    try:
        for d in (args.dtypes or "").split(","):
            if d.strip():
                _cases.canon_dtype(d)
        for o in (args.ops or "").split(","):
            if o.strip():
                _cases.canon_op(o)
    except ValueError as e:
        parser.error(str(e))


def run(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.sweep is not None or args.sweep_case is not None:
        _check_sweep_args(parser, args)
        from . import sweep_run
        return sweep_run.run(args, argv)
    for flag in ("sweep_scale", "sweep_recheck"):
        if getattr(args, flag) is not None:
            parser.error(f"--{flag.replace('_', '-')} needs --sweep or --sweep-case")
    cases, suite_path = select_cases(args)
    if args.list:
        for c in cases:
            print(f"{c.name:48s} {c.short():40s} dtypes={','.join(c.dtypes)} ops={','.join(c.ops)} "
                  f"fwd GFLOP={c.flops('fwd') / 1e9:.3g}")
        return 0
    if not cases:
        raise SystemExit("no cases selected")
    t_start = time.perf_counter()
    if any("float64" in c.dtypes for c in cases):
        import jax
        jax.config.update("jax_enable_x64", True)
    import jax

    from . import device as _device, report as _report
    from .harness import time_entry, make_inputs
    from . import torch_bench

    quick = args.quick
    Ts = tuple(int(t) for t in args.ts.split(",")) if args.ts else ((1, 2, 4) if quick else (1, 2, 4, 8, 16))
    repeats = args.repeats or (5 if quick else 10)
    budget = args.budget or (1.5 if quick else 20.0)
    profile = args.profile or ("first" if quick else "auto")
    impls = tuple(i.strip() for i in args.impls.split(",") if i.strip())
    out = args.out or os.path.join("bench_results", datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    os.makedirs(out, exist_ok=True)

    meta = _device.run_metadata(sys.argv[:1] + list(argv if argv is not None else sys.argv[1:]))
    if "jaxconv" in impls and isinstance(meta.get("jaxconv_build_info"), str):
        raise SystemExit(f"jaxconv is not usable ({meta['jaxconv_build_info']}); use --impls lax to test the harness")
    peaks = _device.peaks_for(meta["platform"], meta["device_kind"], quick)
    compiler_options = {}
    if args.lax_autotune_level is not None:
        compiler_options["lax"] = {"xla_gpu_autotune_level": args.lax_autotune_level}
    meta.update(peaks=peaks, suite=_device.display_path(suite_path), quick=quick, Ts=list(Ts), repeats=repeats,
                compiler_options=compiler_options,
                budget_s=budget, profile=profile, impls=list(impls) + (["torch"] if args.torch else []),
                jaxconv_tensor_cores=args.jaxconv_tensor_cores, method=_report.METHOD)
    mem_budget = _device.memory_budget_bytes(meta["platform"])
    _log(f"[jaxconv.bench] {meta['device_kind']} ({meta['platform']}), jax {meta['jax']}; {peaks['notes']}")
    if args.torch and not torch_bench.available():
        _log("[jaxconv.bench] --torch: torch is not importable; skipping torch")

    todo = [(c, d, o) for c in cases for d in c.dtypes for o in c.ops]
    entries, errors = [], []
    json_path, md_path = os.path.join(out, "results.json"), os.path.join(out, "results.md")
    first = True
    for i, (c, dt, op) in enumerate(todo):
        t0 = time.perf_counter()
        try:
            prof = profile if profile != "first" else ("always" if first else "auto")
            res = time_entry(c, dt, op, impls=impls, Ts=Ts, repeats=repeats, min_repeats=3 if not quick else 2,
                             budget_s=budget, mem_budget=mem_budget, profile=prof, seed=args.seed,
                             compiler_options=compiler_options, log=lambda m: _log(f"[jaxconv.bench] {m}"))
            first = False
            if args.torch and torch_bench.available():
                sets = make_inputs(c, dt, 1, args.seed)
                res["impls"]["torch"] = torch_bench.time_torch(c, dt, op, sets, budget_s=min(budget, 10.0))
            entry = dict(case_obj=c, dtype=dt, op=op, **res)
            _report.derive(entry, peaks, args.jaxconv_tensor_cores)
            entries.append(entry)
        except Exception as e:  # one bad case must not end a long run
            errors.append(f"{c.name} {dt} {op}: {type(e).__name__}: {str(e)[:300]}")
            entry = None
        dt_s = time.perf_counter() - t0
        if entry is not None:
            parts = []
            for nm, r in entry["impls"].items():
                if "error" in r:
                    parts.append(f"{nm} ERROR")
                    continue
                t = r.get("time_s")
                ci = r.get("ci90_s") or [None, None]
                s = f"{nm} {t * 1e6:.4g} µs" if t is not None and math.isfinite(t) else f"{nm} ?"
                if ci[0] is not None and t:
                    s += f" ±{50 * (ci[1] - ci[0]) / t:.0f}%"
                if r.get("time_source", "fit") != "fit":
                    s += f" [{r['time_source']}]"
                if r.get("flags"):
                    s += " !" + ",".join(str(f)[:24] for f in r["flags"])
                parts.append(s)
            ratio = entry.get("ratio_lax_over_jaxconv")
            parts.append(f"lax/jc {ratio:.3g}" if ratio else "")
            _log(f"[{i + 1}/{len(todo)}] {c.name} {dt} {op}: " + " | ".join(p for p in parts if p) + f"  ({dt_s:.1f}s)")
        else:
            _log(f"[{i + 1}/{len(todo)}] {c.name} {dt} {op}: ERROR {errors[-1]}")
        meta["elapsed_s"] = time.perf_counter() - t_start
        _report.write_json(json_path, meta, entries, errors)
    _report.write_markdown(md_path, meta, peaks, entries, errors, meta["impls"])
    files = [json_path, md_path]
    if not args.no_plots and entries:
        try:
            files += _report.write_plots(out, meta, peaks, entries, args.jaxconv_tensor_cores)
        except Exception as e:
            errors.append(f"plots: {type(e).__name__}: {e}")
            _log(f"[jaxconv.bench] plots failed: {e}")
    meta["elapsed_s"] = time.perf_counter() - t_start
    _report.write_json(json_path, meta, entries, errors)
    _log(f"[jaxconv.bench] {len(entries)} measurements, {len(errors)} errors, {meta['elapsed_s']:.1f}s; wrote "
         + ", ".join(files))
    return 0 if not errors else 1


def run_quick_selftest(out_dir=None, impls=("jaxconv", "lax")) -> dict:
    """For CI: runs `--quick` (tiny cases, < 2 min on a 2-core CPU) into out_dir (a temp dir by default), checks the
    outputs exist and parse, and returns the results JSON as a dict. Raises AssertionError on a broken harness.
    Also checks that the profiler cross-check degrades gracefully (a bogus trace dir gives ok=False, no raise)."""
    import json
    import tempfile
    from .trace import parse_trace_dir
    d = out_dir or tempfile.mkdtemp(prefix="jaxconv_bench_quick_")
    rc = run(["--quick", "--out", d, "--impls", ",".join(impls)])
    with open(os.path.join(d, "results.json")) as f:
        res = json.load(f)
    assert os.path.getsize(os.path.join(d, "results.md")) > 0
    for png in ("speedup.png", "roofline.png"):
        with open(os.path.join(d, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", png
    assert res["results"], "no results"
    bad = parse_trace_dir(os.path.join(d, "no_such_trace_dir"), "jit_nothing", 1)
    assert bad["ok"] is False and bad.get("reason"), bad
    for e in res["results"]:
        for nm, r in e["impls"].items():
            assert "error" in r or (r.get("time_s") is not None), (e["case"]["name"], nm, r)
    res["return_code"] = rc
    res["out_dir"] = d
    return res


def main():
    sys.exit(run())
