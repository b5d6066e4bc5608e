"""Runs one benchmark case's op a few times for a kernel profiler to catch (warm-up calls, then measured ones):

  ncu --kernel-name regex:LongKernel --launch-skip 2 --launch-count 1 \
      python3 benchmarks/profile_case.py 1:1000000:1->1:2047 --dtype float32-highest --op fwd

CASE is anything `python -m jaxconv.bench --case` takes (a suite name or the compact form).
"""

import argparse

import jax

from jaxconv.bench import cases, harness


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("case")
  ap.add_argument("--dtype", default="float32-highest")
  ap.add_argument("--op", default="fwd", choices=("fwd", "dgrad", "wgrad", "fwdbwd"))
  ap.add_argument("--impl", default="jaxconv", choices=("jaxconv", "lax"))
  ap.add_argument("--calls", type=int, default=3)
  args = ap.parse_args()
  case = cases.parse_case_spec(args.case, cases.load_suite(cases.default_suite_path()))
  fn = jax.jit(harness.make_op(harness._impl_fn(args.impl), case, args.dtype, args.op))
  (x, w, dy), = harness.make_inputs(case, args.dtype, 1)
  for _ in range(args.calls):
    jax.block_until_ready(fn(x, w, dy))


if __name__ == "__main__":
  main()
