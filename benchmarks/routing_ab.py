"""Does auto pick the fastest variant? Over random sweep draws, time lax and every variant that applies to each op
(xla.conv, XLA's own convolution, among them), each forced, with the sweep's method; then judge a registry's choice
offline against those times.

`run` draws cases from the sweep's distribution (jaxconv/bench/sweep.py) of the given seeds, keeps each (case, dtype,
op) that has a candidate (registry.candidates, filtered by --variant; with --floor-only, only the problems whose auto
choice is xla.conv: the measurement that decides whether a variant placed after XLA's floor moves before it),
shuffles them (seeded) and times lax and each candidate until the budget is spent:

    python benchmarks/routing_ab.py run --seeds 200,201 --budget 500 --out routing.json
    python benchmarks/routing_ab.py run --floor-only --variant implicit_gemm.padded_k_sm90 --seeds 100 --out f.json

`report` re-derives each measured problem from its seed, asks this build's registry what auto runs there (for the
device the times were taken on), and reports lax/choice against lax/best-candidate: the regret of the routing, per
op and per chosen variant, and the worst rows. Edit a cost rule, rebuild, and `report` the same file again: the
routing change is judged on measured times without a GPU.

    python benchmarks/routing_ab.py report routing.json [more.json ...]

Use seeds the sweep's targets are not judged on.
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time

REGRET = 1.1  # a choice this much slower than the best candidate is listed as a miss


def _forced(variant: str) -> str:
  return f"jaxconv:{variant}"


def candidates(probs, op, variants=None, dev=None):
  """The variants that run op's problem and whose forced program can be built, in the table's order."""
  from jaxconv import registry
  pr = probs[op]
  return [v for v in registry.candidates(op, pr.params, pr.dtype, pr.out_dtype, dev=dev)
          if (not variants or v in variants) and forward_runs(probs["fwd"], v, dev)]


def select(seeds, per_seed, dtypes, scale, variants=None, floor_only=False, dev=None):
  """[(tag, case, dtype, op, auto, candidates)] of the draws: every (case, dtype, op) with a candidate (with
  `variants`, one of them besides auto's choice, which is always a candidate); with floor_only, those whose auto
  choice is xla.conv."""
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
          auto = registry.resolve(op, pr.params, pr.dtype, pr.out_dtype, dev).name
          if floor_only and auto != XLA_VARIANT:
            continue
          # Auto's own choice is always timed, so that a routing can be judged against the named variants.
          cands = candidates(probs, op, set(variants) | {auto} if variants else None, dev)
          if set(cands) - ({auto} if variants else set()):
            out.append((f"{seed}/{i}", case, dt, op, auto, cands))
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
  """Times lax and the candidates of each selected problem until the budget is spent: [row dict]."""
  from jaxconv.bench import sweep_timing as _timing
  rows, t0 = [], time.perf_counter()
  for tag, case, dt, op, auto, cands in todo:
    if time.perf_counter() - t0 > budget_s:
      break
    impls = ("lax", *(_forced(v) for v in cands))
    n = _timing.nsets_for(case)
    inputs = _timing.InputSets(case, [dt], n, data_seed=1)
    try:
      progs = _timing.compile_case(case, [dt], [op], n, impls=impls, host_work=inputs.prepare, tag="routing")
      try:
        m = _timing.time_programs(progs, dt, op, inputs.get()[dt], impls=impls)
      finally:
        _timing.release(progs)
    except Exception as e:  # one broken problem must not end the run: it is reported with its error
      m = dict(impls={"run": dict(error=f"{type(e).__name__}: {str(e)[:300]}")})
    us = {k: r["time_s"] * 1e6 for k, r in m["impls"].items() if r.get("time_s")}
    errors = {k: r["error"] for k, r in m["impls"].items() if r.get("error")}
    row = dict(tag=tag, spec=case.short(), dtype=dt, op=op, auto=auto, candidates=cands, us=us, errors=errors,
               rel_err=m.get("rel_err"))
    rows.append(row)
    lx = us.get("lax", float("nan"))
    times = "  ".join(f"{v} {us.get(_forced(v), float('nan')):.1f}" for v in cands)
    log(f"{tag:9} {dt:9} {op:5} lax {lx:9.1f} µs | {times} | auto {auto}  {case.short()} {errors or ''}")
  return rows


def summarize(rows) -> dict:
  """{variant: the sweep's ratio_summary of lax/variant} over the rows that timed it."""
  from jaxconv.bench.stats import ratio_summary
  ratios = collections.defaultdict(list)
  for r in rows:
    lx = r["us"].get("lax")
    for v in r["candidates"]:
      t = r["us"].get(_forced(v))
      if lx and t:
        ratios[v].append(lx / t)
  return {v: ratio_summary(x) for v, x in sorted(ratios.items())}


def judge(rows, choose) -> dict:
  """A routing judged on measured rows. choose(row) -> the variant name a registry runs there. Returns the sweep's
  ratio summaries of lax/choice ("choice") and lax/best candidate ("best") over the rows where both were timed, per
  op and in all, the rows whose choice was not timed, and each (row, choice, best variant, regret) sorted by regret."""
  from jaxconv.bench.stats import ratio_summary
  got, best, misses, untimed = collections.defaultdict(list), collections.defaultdict(list), [], []
  for r in rows:
    lx = r["us"].get("lax")
    timed = {v: r["us"][_forced(v)] for v in r["candidates"] if r["us"].get(_forced(v))}
    if not lx or not timed:
      continue
    c = choose(r)
    if c not in timed:
      untimed.append((r, c))
      continue
    b = min(timed, key=timed.get)
    for key in (r["op"], "all"):
      got[key].append(lx / timed[c])
      best[key].append(lx / timed[b])
    misses.append((r, c, b, timed[c] / timed[b]))
  misses.sort(key=lambda t: -t[3])
  return dict(choice={k: ratio_summary(v) for k, v in got.items()},
              best={k: ratio_summary(v) for k, v in best.items()}, untimed=untimed, misses=misses)


def registry_choice(scale, dev):
  """choose(row) for judge(): this build's registry on the row's problem, re-derived from its seed and index."""
  from jaxconv import registry
  from jaxconv.bench import harness, sweep

  def choose(r):
    seed, i = (int(s) for s in r["tag"].split("/"))
    pr = harness.case_problems(sweep.draw_case(seed, i, scale), r["dtype"])[r["op"]]
    return registry.resolve(r["op"], pr.params, pr.dtype, pr.out_dtype, dev).name
  return choose


def _line(name, s):
  return (f"{name:28} {s['n']:5d} {s['min']:7.3f} {s['p10']:7.3f} {s['median']:7.3f} {s['geomean']:7.3f} "
          f"{s['below_0_9']:5d}")


def report(paths, top=15, log=print) -> dict:
  """Judges this build's registry on the measurements of `paths` (run's JSON files of one scale and device)."""
  from jaxconv import registry
  data = [json.load(open(p)) for p in paths]
  scales, devs = {d["scale"] for d in data}, {tuple(d["device_info"]) for d in data}
  if len(scales) != 1 or len(devs) != 1:
    raise ValueError(f"report: the files mix scales {sorted(scales)} or devices {sorted(devs)}")
  if not registry.has_kernels():
    raise RuntimeError("report: this build has no CUDA kernels, so no predicates to route with")
  rows = [r for d in data for r in d["rows"]]
  dev = devs.pop()
  out = dict(recorded=judge(rows, lambda r: r["auto"]), this_build=judge(rows, registry_choice(scales.pop(), dev)))
  log(f"{len(rows)} measured (case, dtype, op) on {data[0]['device']} {dev}; lax time / time "
      f"(> 1: faster than lax)")
  log(f"{'routing':28} {'n':>5} {'min':>7} {'p10':>7} {'median':>7} {'geomean':>7} {'<0.9':>5}")
  for key in ("fwd", "dgrad", "wgrad", "all"):
    for name, j in (("recorded auto", out["recorded"]), ("this build's auto", out["this_build"])):
      if key in j["choice"]:
        log(_line(f"{name} {key}", j["choice"][key]))
    if key in out["this_build"]["best"]:
      log(_line(f"best candidate {key}", out["this_build"]["best"][key]))
  j = out["this_build"]
  if j["untimed"]:
    log(f"{len(j['untimed'])} rows where this build chooses a variant that was not timed there")
  by_choice = collections.Counter(c for _, c, b, g in j["misses"] if g > REGRET)
  log(f"choices over {REGRET}x slower than the best candidate: {sum(by_choice.values())} of {len(j['misses'])} "
      f"({', '.join(f'{v} {n}' for v, n in by_choice.most_common())})")
  for r, c, b, g in j["misses"][:top]:
    if g <= REGRET:
      break
    us = r["us"]
    log(f"  {g:5.2f}x {r['dtype']:9} {r['op']:5} {c} {us[_forced(c)]:.1f} µs, {b} {us[_forced(b)]:.1f} µs, lax "
        f"{us['lax']:.1f} µs  {r['spec']} ({r['tag']})")
  return out


def _run(args, ap) -> int:
  import jax

  from jaxconv import registry
  from jaxconv.bench import sweep
  unknown = [v for v in args.variant or () if v not in registry.variant_names()]
  if unknown:
    ap.error(f"--variant: unknown variant(s) {unknown}; `python -m jaxconv.algorithms` lists them")
  scale = args.scale or sweep.scale_for_backend(jax.default_backend())
  seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
  dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
  todo = select(seeds, args.cases_per_seed, dtypes, scale, args.variant, args.floor_only)
  random.Random(args.shuffle_seed).shuffle(todo)
  print(f"{len(todo)} (case, dtype, op) with candidates{' where auto runs XLA' if args.floor_only else ''} "
        f"(seeds {seeds}, {args.cases_per_seed} cases each, scale {scale})", flush=True)
  rows = measure(todo, args.budget, log=lambda s: print(s, flush=True))
  summary = summarize(rows)
  for variant, s in summary.items():
    print(f"{variant}: {s['n']} measured, lax/variant min {s['min']:.3f} p10 {s['p10']:.3f} median "
          f"{s['median']:.3f} geomean {s['geomean']:.3f}, {s['at_least_1']} of {s['n']} at least 1")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(device=jax.devices()[0].device_kind, device_info=list(registry.device()), jax=jax.__version__,
                     seeds=seeds, scale=scale, floor_only=args.floor_only, selected=len(todo), rows=rows,
                     summary=summary), f, indent=1)
  return 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  run = sub.add_parser("run", help="time lax and every candidate over sweep draws")
  run.add_argument("--variant", action="append", help="time only these variants (repeat)")
  run.add_argument("--floor-only", action="store_true", help="only problems auto leaves to XLA")
  run.add_argument("--seeds", default="200,201")
  run.add_argument("--cases-per-seed", type=int, default=200)
  run.add_argument("--dtypes", default="float32,bfloat16")
  run.add_argument("--scale", default=None, help="the sweep's scale (default: the platform's)")
  run.add_argument("--budget", type=float, default=300.0, help="seconds of timing")
  run.add_argument("--shuffle-seed", type=int, default=0)
  run.add_argument("--out", default=None, help="JSON file of every measurement and the summary")
  rep = sub.add_parser("report", help="judge this build's routing on measured files")
  rep.add_argument("files", nargs="+")
  rep.add_argument("--top", type=int, default=15, help="worst choices listed")
  args = ap.parse_args(argv)
  if args.cmd == "run":
    return _run(args, ap)
  report(args.files, args.top)
  return 0


if __name__ == "__main__":
  sys.exit(main())
