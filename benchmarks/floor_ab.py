"""Is a variant after XLA's floor faster than it? Where auto runs XLA's convolution (xla.conv) and the named variants
apply, time lax against each variant forced, per op, over random sweep draws.

The registry places a variant after the floor until it is measured against XLA on the problems the floor takes; this
is that measurement. It draws cases from the sweep's distribution (jaxconv/bench/sweep.py) of the given seeds, keeps
each (case, dtype, op) whose auto choice on this GPU is xla.conv and that some --variant applies to (the first that
does), shuffles them (seeded), and times lax, jaxconv (auto) and the variant with the sweep's method
(jaxconv/bench/sweep_timing.py) until the budget is spent:

    python benchmarks/floor_ab.py --variant implicit_gemm.padded_k_sm90 --variant implicit_gemm.padded_k_sm80 \\
        --seeds 100,101,102 --budget 300 --out floor_ab.json

It prints a line per measurement and a summary of lax/variant per variant (the sweep's statistics: min, p10,
median, geometric mean, how many at least 1), and writes every measurement as JSON. Use seeds the sweep's targets are not judged on.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time


def select(variants, seeds, per_seed, dtypes, scale, dev=None):
  """[(tag, case, dtype, op, variant)] of the draws whose auto choice is xla.conv and that a variant applies to."""
  from jaxconv import registry
  from jaxconv.bench import harness, sweep
  from jaxconv.primitives.lowering import XLA_VARIANT
  out = []
  for seed in seeds:
    for i in range(per_seed):
      case = sweep.draw_case(seed, i, scale)
      for dt in dtypes:
        try:
          probs = harness.case_problems(case, dt)
        except (TypeError, ValueError):  # a dtype the case cannot take (the sweep skips these too)
          continue
        for op, pr in probs.items():
          if registry.resolve(op, pr.params, pr.dtype, pr.out_dtype, dev).name != XLA_VARIANT:
            continue
          applies = {n for n, why, _ in registry.explain(op, pr.params, pr.dtype, pr.out_dtype, dev) if not why}
          first = next((v for v in variants if v in applies), None)
          if first and forward_runs(probs["fwd"], first, dev):
            out.append((f"{seed}/{i}", case, dt, op, first))
  return out


def forward_runs(fwd, variant, dev=None) -> bool:
  """Whether a forced variant's program can be built: a forced request is checked against its forward at trace time
  (jaxconv/_normalize.py), and the gradients' programs trace the forward they differentiate. The lowering's own
  choice of the forced forward answers it."""
  from jaxconv.primitives.lowering import choose
  try:
    choose("fwd", fwd.spec.replace(algorithm=variant), fwd.nck, fwd.dtype, fwd.out_dtype, dev)
  except ValueError:
    return False
  return True


def measure(todo, budget_s, log=print):
  """Times lax, auto and the variant of each selected problem until the budget is spent: [row dict]."""
  from jaxconv.bench import sweep_timing as _timing
  rows, t0 = [], time.perf_counter()
  for tag, case, dt, op, variant in todo:
    if time.perf_counter() - t0 > budget_s:
      break
    impls = ("lax", "jaxconv", f"jaxconv:{variant}")
    n = _timing.nsets_for(case)
    inputs = _timing.InputSets(case, [dt], n, data_seed=1)
    try:
      progs = _timing.compile_case(case, [dt], [op], n, impls=impls, host_work=inputs.prepare, tag="floor")
      try:
        m = _timing.time_programs(progs, dt, op, inputs.get()[dt], impls=impls)
      finally:
        _timing.release(progs)
    except Exception as e:  # one broken problem must not end the run: it is reported with its error
      m = dict(impls={"run": dict(error=f"{type(e).__name__}: {str(e)[:300]}")})
    us = {k: r["time_s"] * 1e6 for k, r in m["impls"].items() if r.get("time_s")}
    errors = {k: r["error"] for k, r in m["impls"].items() if r.get("error")}
    lx, v = us.get("lax"), us.get(f"jaxconv:{variant}")
    row = dict(tag=tag, spec=case.short(), dtype=dt, op=op, variant=variant, us=us, errors=errors,
               rel_err=m.get("rel_err"), ratio=lx / v if lx and v else None)
    rows.append(row)
    log(f"{tag:9} {dt:9} {op:5} {variant:32} lax {lx or float('nan'):9.1f}  variant {v or float('nan'):9.1f} µs  "
        f"lax/variant {row['ratio'] or float('nan'):6.3f}  {case.short()} {errors or ''}")
  return rows


def summarize(rows) -> dict:
  """{variant: the sweep's ratio_summary of lax/variant} over the rows with a ratio."""
  from jaxconv.bench.stats import ratio_summary
  out = {}
  for variant in sorted({r["variant"] for r in rows}):
    v = [r["ratio"] for r in rows if r["variant"] == variant and r["ratio"]]
    if v:
      out[variant] = ratio_summary(v)
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--variant", action="append", required=True, help="a variant name (repeat: the first that applies)")
  ap.add_argument("--seeds", default="100,101,102")
  ap.add_argument("--cases-per-seed", type=int, default=200)
  ap.add_argument("--dtypes", default="float32,bfloat16")
  ap.add_argument("--scale", default=None, help="the sweep's scale (default: the platform's)")
  ap.add_argument("--budget", type=float, default=300.0, help="seconds of timing")
  ap.add_argument("--shuffle-seed", type=int, default=0)
  ap.add_argument("--out", default=None, help="JSON file of every measurement and the summary")
  args = ap.parse_args(argv)

  import jax

  from jaxconv import registry
  from jaxconv.bench import sweep
  unknown = [v for v in args.variant if v not in registry.variant_names()]
  if unknown:
    ap.error(f"--variant: unknown variant(s) {unknown}; `python -m jaxconv.algorithms` lists them")
  scale = args.scale or sweep.scale_for_backend(jax.default_backend())
  seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
  dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
  todo = select(args.variant, seeds, args.cases_per_seed, dtypes, scale)
  random.Random(args.shuffle_seed).shuffle(todo)
  print(f"{len(todo)} (case, dtype, op) where auto runs XLA's convolution and a variant applies "
        f"(seeds {seeds}, {args.cases_per_seed} cases each, scale {scale})", flush=True)
  rows = measure(todo, args.budget, log=lambda s: print(s, flush=True))
  summary = summarize(rows)
  for variant, s in summary.items():
    print(f"{variant}: {s['n']} measured, lax/variant min {s['min']:.3f} p10 {s['p10']:.3f} median "
          f"{s['median']:.3f} geomean {s['geomean']:.3f}, {s['at_least_1']} of {s['n']} at least 1")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, seeds=seeds, scale=scale,
                     selected=len(todo), rows=rows, summary=summary), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
