"""Times every kernel variant that applies to each op of suite cases (jaxconv.autotune) and prints one table: the
data behind the registry's order and cost rules (csrc/dispatch/variants.def, cost_rules.cc).

    python benchmarks/algorithm_survey.py --filter 'resnet50_.*_b32' --dtypes bfloat16 --out survey.json

Needs a GPU. Times are autotune's (median of blocking calls over 8 distinct input sets, per op), good for
ranking candidates, not a substitute for python -m jaxconv.bench. The cache is written to a temporary
directory unless --keep-cache.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import jax
import jax.numpy as jnp


def _case_args(case, dtype):
  """(lhs, rhs ShapeDtypeStructs, conv kwargs, name) of a suite case for a dtype name of the suite."""
  from jaxconv.bench import cases as bench_cases
  from jaxconv.bench import harness
  dt = jnp.dtype(bench_cases.dtype_info(dtype)[0])
  x_shape, w_shape = case.shapes()[:2]
  return (jax.ShapeDtypeStruct(x_shape, dt), jax.ShapeDtypeStruct(w_shape, dt), harness.conv_kwargs(case, dtype),
          case.name)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--suite", default=os.path.join(os.path.dirname(__file__), "suite.json"))
  ap.add_argument("--filter", default=".", help="regex on case names")
  ap.add_argument("--dtypes", default="bfloat16", help="comma list: bfloat16,float32,float32-highest")
  ap.add_argument("--ops", default="fwd,dgrad,wgrad")
  ap.add_argument("--out", default=None, help="JSON file for the raw results")
  ap.add_argument("--keep-cache", action="store_true", help="store the winners in the user's autotune cache")
  args = ap.parse_args(argv)

  import jaxconv
  from jaxconv.bench import cases as bench_cases
  if not args.keep_cache:
    os.environ["JAXCONV_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxconv-survey-")
  suite = bench_cases.load_suite(args.suite)
  ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
  rows, raw = [], []
  for case in suite:
    if not re.search(args.filter, case.name):
      continue
    for dtype in args.dtypes.split(","):
      lhs, rhs, kw, name = _case_args(case, dtype)
      try:
        res = jaxconv.autotune(lhs, rhs, ops=ops, **kw)
      except Exception as err:  # report and go on: one failing case should not hide the others
        print(f"{name} {dtype}: {type(err).__name__}: {err}", file=sys.stderr)
        continue
      for op, r in res.items():
        times = {k: round(float(v), 2) for k, v in sorted(r.times_us.items(), key=lambda kv: kv[1])}
        raw.append(dict(case=name, dtype=dtype, op=op, winner=r.winner, times_us=times))
        rows.append(f"| {name} | {dtype} | {op} | {r.winner} | " +
                    ", ".join(f"{k} {v:.1f}" for k, v in times.items()) + " |")
        print(rows[-1], flush=True)
  print("\n| case | dtype | op | winner | µs per candidate (fastest first) |\n|---|---|---|---|---|")
  print("\n".join(rows))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, results=raw), f, indent=1)


if __name__ == "__main__":
  main()
