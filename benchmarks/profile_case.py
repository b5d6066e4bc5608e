"""Device time of single benchmark cases per kernel, for choosing and tuning kernels. Two modes:

Under a kernel profiler (warm-up calls, then measured ones, one case, one implementation):

  ncu --clock-control none --kernel-name regex:LongKernel --launch-skip 2 --launch-count 1 \
      python3 benchmarks/profile_case.py 1:1000000:1->1:2047 --dtype float32-highest --op fwd

With --trace, in this process: every case x algorithm (and lax) under jax.profiler, one table of the device busy
time per op and the kernels that took it:

  python3 benchmarks/profile_case.py seed_tutorial_28x28_5x5_1to16_b64 resnet50_conv1_b32 --trace \
      --dtype bfloat16,float32-highest --algorithm auto,small,direct,implicit_gemm

CASE is anything `python -m jaxconv.bench --case` takes (a suite name or the compact form). A forced algorithm
that cannot run a case is reported and skipped.
"""

import argparse
import zlib

import jax

from jaxconv.bench import cases, harness
from jaxconv.bench.trace import profile_device_time


def _conv(impl, algorithm):
  if impl == "lax" or algorithm == "auto":
    return harness._impl_fn(impl)
  return harness._impl_fn(f"jaxconv:{algorithm}")


def _short(kernel_name):
  """The kernel name cut to 60 characters, and a tag of the whole name: template instances (tile shapes) that
  share the first 60 characters stay apart."""
  return f"{kernel_name[:60]}#{zlib.crc32(kernel_name.encode()) & 0xffff:04x}"


def _op_fn(case, dtype, op, impl, algorithm, name):
  run = lambda x, w, dy: harness.make_op(_conv(impl, algorithm), case, dtype, op)(x, w, dy)
  run.__name__ = run.__qualname__ = name
  return jax.jit(run)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("case", nargs="+")
  ap.add_argument("--dtype", default="float32-highest", help="comma list with --trace")
  ap.add_argument("--op", default="fwd", help="fwd, dgrad, wgrad or fwdbwd (comma list with --trace)")
  ap.add_argument("--impl", default="jaxconv", choices=("jaxconv", "lax"))
  ap.add_argument("--algorithm", default="auto", help="jaxconv algorithm to force (comma list with --trace)")
  ap.add_argument("--calls", type=int, default=3)
  ap.add_argument("--trace", action="store_true", help="time in this process with jax.profiler (see above)")
  args = ap.parse_args()
  suite = cases.load_suite(cases.default_suite_path())
  if not args.trace:
    case = cases.parse_case_spec(args.case[0], suite)
    fn = _op_fn(case, args.dtype, args.op, args.impl, args.algorithm, "profile_case")
    (x, w, dy), = harness.make_inputs(case, args.dtype, 1)
    for _ in range(args.calls):
      jax.block_until_ready(fn(x, w, dy))
    return

  print("| case | dtype | op | impl | µs per op | kernels (µs per op) |\n|---|---|---|---|---|---|", flush=True)
  uid = 0
  for spec in args.case:
    case = cases.parse_case_spec(spec, suite)
    for dtype in args.dtype.split(","):
      (x, w, dy), = harness.make_inputs(case, dtype, 1)
      for op in args.op.split(","):
        impls = [("jaxconv", a) for a in args.algorithm.split(",")] + [("lax", "auto")]
        for impl, algo in impls:
          uid += 1
          name = f"profile_case_{uid}"
          label = "lax" if impl == "lax" else algo
          try:
            fn = _op_fn(case, dtype, op, impl, algo, name)
            jax.block_until_ready(fn(x, w, dy))
          except Exception as e:  # a forced algorithm that does not apply: say so, go on
            print(f"| {case.name} | {dtype} | {op} | {label} | - | {type(e).__name__}: {str(e)[:100]} |", flush=True)
            continue
          prof = profile_device_time(fn, (x, w, dy), "jit_" + name, ncalls=args.calls)
          if not prof.get("ok"):
            print(f"| {case.name} | {dtype} | {op} | {label} | - | {prof.get('reason')} |", flush=True)
            continue
          n = max(prof["ncalls"], 1)
          kern = "; ".join(f"{_short(k['name'])} x{k['count'] // n} {k['total_us'] / n:.2f}" for k in prof["top"][:4])
          print(f"| {case.name} | {dtype} | {op} | {label} | {prof['median_run_us']:.2f} | {kern} |", flush=True)


if __name__ == "__main__":
  main()
