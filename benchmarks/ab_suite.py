"""A/B of two jaxconv builds over a suite: one pass per call, compared afterwards.

Two builds cannot share a process (their FFI targets have the same names), so each pass runs in its own process
with one build's package first on PYTHONPATH (the benchmark package may be copied from the newer tree: it needs
nothing of jaxconv but conv_general_dilated and the stream timer). Alternate the builds, A B A B ..., and compare:

    PYTHONPATH=old python benchmarks/ab_suite.py run --label A --out a1.json [--suite S] [--lax]
    PYTHONPATH=new python benchmarks/ab_suite.py run --label B --out b1.json
    ... a2.json, b2.json ...
    python benchmarks/ab_suite.py compare a1.json b1.json a2.json b2.json [--limit 1.03]

A pass times every (case, dtype, op) of the suite with the sweep's method (jaxconv/bench/sweep_timing.py: device
time between in-stream marks, median of rounds). Where that is under --kernel-time-under microseconds per op, the
pass also records the device busy time of the program's kernels under jax.profiler (median of 5 calls): marks
around a few microseconds of work also time the gaps between launches, which vary from process to process.
`compare` pairs the passes in order (A1 with B1, A2 with B2, ...), takes each measurement's median B/A time ratio
over the pairs (of the kernel times, over the pairs that have them on both sides, where any pair does; else of the
marked spans), and A's spread (A1 against A2, and A's rounds within a pass) as its noise; it lists the measurements
slower than --limit beyond that noise and exits 1 when there are any.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

DEFAULT_OPS = ("fwd", "dgrad", "wgrad")


def _run(args) -> int:
  import jax

  from jaxconv.bench import cases as _cases
  from jaxconv.bench import sweep_timing as _timing
  suite = _cases.load_suite(args.suite or _cases.default_suite_path())
  if args.filter:
    import re
    suite = [c for c in suite if re.search(args.filter, c.name)]
  impls = ("lax", "jaxconv") if args.lax else ("jaxconv",)
  out = dict(label=args.label, device=jax.devices()[0].device_kind, jax=jax.__version__, measurements={})
  t_start = time.perf_counter()
  for i, case in enumerate(suite):
    dtypes = [d for d in case.dtypes if not args.dtypes or d in args.dtypes.split(",")]
    ops = [o for o in args.ops.split(",") if o in [_cases.canon_op(x) for x in case.ops]]
    if not dtypes or not ops:
      continue
    nsets = _timing.nsets_for(case)
    inputs = _timing.InputSets(case, dtypes, nsets, data_seed=i)
    progs = _timing.compile_case(case, dtypes, ops, nsets, impls=impls, tag=f"ab{i}", host_work=inputs.prepare,
                                 threads=args.threads)
    try:
      sets = inputs.get()
      for dt in dtypes:
        for op in ops:
          m = _timing.time_programs(progs, dt, op, sets[dt], impls=impls, repeats=args.repeats)
          rec = {impl: m["impls"][impl].get("time_s") for impl in impls}
          samples = m["impls"]["jaxconv"].get("samples_s") or []
          rec["spread"] = max(samples) / min(samples) - 1.0 if samples and min(samples) > 0 else None
          rec["error"] = "" if rec.get("jaxconv") else _timing.failure_of(m)
          if rec.get("jaxconv") and rec["jaxconv"] * 1e6 < args.kernel_time_under:
            rec["kernel"] = kernel_time(progs[("jaxconv", dt, op)], sets[dt])
          out["measurements"][f"{case.name}|{dt}|{op}"] = rec
    finally:
      _timing.release(progs)
    print(f"[{time.perf_counter() - t_start:6.1f} s] {case.name}", file=sys.stderr, flush=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  return 0


def kernel_time(prog, sets):
  """Seconds per op of the device busy time of a compiled pass program's kernels (jax.profiler), or None."""
  from jaxconv.bench.trace import profile_device_time
  module = re.search(r"HloModule ([\w.\-]+)", prog.compiled.as_text()).group(1)
  prof = profile_device_time(lambda s: prog.compiled(s), (sets,), module, ncalls=5)
  return prof["median_run_us"] * 1e-6 / len(sets) if prof.get("ok") and prof["median_run_us"] > 0 else None


def compare(passes, limit):
  """(rows, noise): rows = [(key, median B/A ratio over pairs, A's spread, timed by kernels)], worst first. A's
  spread is the larger of the A/A spread across passes and the spread of A's rounds within a pass (marked spans
  only: a kernel time is one median)."""
  a, b = passes[0::2], passes[1::2]
  keys = sorted(set.intersection(*(set(p["measurements"]) for p in passes)))
  rows, spreads = [], []
  for k in keys:
    # A pass records kernel times only where its own marked span was short, so a row near that bound has them in
    # some passes: the pairs that have them on both sides decide, and A's kernel times give the noise.
    kern = [(x["measurements"][k].get("kernel"), y["measurements"][k].get("kernel")) for x, y in zip(a, b)]
    kern = [(x, y) for x, y in kern if x and y and x > 0 and y > 0]
    by_kernels = bool(kern)
    if by_kernels:
      pairs = kern
      ta = [t for t in (p["measurements"][k].get("kernel") for p in a) if t and t > 0]
    else:
      pairs = [(x["measurements"][k].get("jaxconv"), y["measurements"][k].get("jaxconv")) for x, y in zip(a, b)]
      if any(t is None or t <= 0 for pair in pairs for t in pair):
        continue
      ta = [x for x, _ in pairs]
    ratio = statistics.median(y / x for x, y in pairs)
    within = [0.0 if by_kernels else p["measurements"][k].get("spread") or 0.0 for p in a]
    spread = max(max(ta) / min(ta) - 1.0, statistics.median(within))
    spreads.append(spread)
    rows.append((k, ratio, spread, by_kernels))
  rows.sort(key=lambda r: -r[1])
  noise = statistics.median(spreads) if spreads else 0.0
  return rows, noise


def _compare(args) -> int:
  passes = []
  for path in args.passes:
    with open(path) as f:
      passes.append(json.load(f))
  if len(passes) < 2 or len(passes) % 2:
    raise SystemExit("compare: give the passes as A B [A B ...]")
  rows, noise = compare(passes, args.limit)
  slower = [r for r in rows if r[1] > args.limit * (1.0 + r[2])]
  kernels = sum(r[3] for r in rows)
  failed = sorted(k for p in passes for k, m in p["measurements"].items() if m.get("error"))
  print(f"{len(rows)} measurements ({kernels} by kernel time), {len(passes) // 2} A/B pairs; median A spread "
        f"{noise * 100:.1f}%; {len(failed)} failed {failed[:5]}")
  print(f"B/A time ratio: median {statistics.median(r[1] for r in rows):.3f}, "
        f"max {rows[0][1]:.3f} ({rows[0][0]}), min {rows[-1][1]:.3f} ({rows[-1][0]})")
  print(f"slower than {args.limit:.2f}x beyond their own A/A spread: {len(slower)}")
  for k, r, s, by_kernels in slower[:40]:
    print(f"  {r:.3f}  (A/A spread {s * 100:.1f}%{', kernel time' if by_kernels else ''})  {k}")
  return 1 if slower else 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  r = sub.add_parser("run", help="one pass of the build first on PYTHONPATH")
  r.add_argument("--label", required=True)
  r.add_argument("--out", required=True)
  r.add_argument("--suite")
  r.add_argument("--filter", help="regular expression on case names")
  r.add_argument("--dtypes", help="comma list (default: each case's)")
  r.add_argument("--ops", default=",".join(DEFAULT_OPS))
  r.add_argument("--repeats", type=int, default=5)
  r.add_argument("--lax", action="store_true", help="also time lax (for a baseline)")
  r.add_argument("--threads", type=int, default=8, help="threads compiling jaxconv's programs")
  r.add_argument("--kernel-time-under", type=float, default=20.0, metavar="US",
                 help="also record the kernels' device busy time (jax.profiler) of measurements under this many "
                 "microseconds per op (default 20; 0: never)")
  c = sub.add_parser("compare", help="compare passes given as A B [A B ...]")
  c.add_argument("passes", nargs="+")
  c.add_argument("--limit", type=float, default=1.03)
  args = ap.parse_args(argv)
  return _run(args) if args.cmd == "run" else _compare(args)


if __name__ == "__main__":
  sys.exit(main())
