"""Dense convolution layers on the CPU: jaxconv vs XLA:CPU (lax.conv_general_dilated), op by op.

A measuring tool, not a test. For every row (a dense layer: ResNet-style 3x3 and 1x1 convolutions) and every
op (fwd, dgrad, wgrad) it jits one jaxconv function and one lax function on the same random-normal inputs
(same dtype, default precision: both compute in float32 for float32, float64 for float64, and float32
accumulation for bfloat16), warms both, then times them interleaved (the order alternates every repeat),
each call waited for with block_until_ready, and reports the median of the repeats of each and the ratio
jaxconv / lax ("ratio"), then the geometric mean, median and max of the ratios, per op and over all. The ratio
of the two fastest repeats ("min r") is printed beside it: on a machine shared with other work it is the
steadier of the two.

dgrad and wgrad are the linear transposes of the forward convolution in x and in w (jax.linear_transpose),
which is what jax.grad runs for each of them: jaxconv's dgrad/wgrad custom calls, and lax's transposed
convolutions.

  PYTHONPATH=. python benchmarks/cpu_dense.py                 # the whole table
  PYTHONPATH=. python benchmarks/cpu_dense.py --filter 3x3 --ops fwd --min-time 0.5
  PYTHONPATH=. python benchmarks/cpu_dense.py --json out.json  # also write every sample

Run it on an otherwise idle machine, and run it twice to see the noise.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxconv

# name: (layout, N, H, W, C, K, window, stride, dtype)
ROWS = [
    # float32, channels-last (NHWC / HWIO)
    ("r1_56x56_64to64_3x3_b1", "NHWC", 1, 56, 56, 64, 64, 3, 1, "float32"),
    ("r1_56x56_64to64_3x3_b8", "NHWC", 8, 56, 56, 64, 64, 3, 1, "float32"),
    ("r1_56x56_64to256_1x1_b4", "NHWC", 4, 56, 56, 64, 256, 1, 1, "float32"),
    ("r1_56x56_256to64_1x1_b4", "NHWC", 4, 56, 56, 256, 64, 1, 1, "float32"),
    ("r2_56x56_64to128_3x3_s2_b4", "NHWC", 4, 56, 56, 64, 128, 3, 2, "float32"),
    ("r2_28x28_128to128_3x3_b8", "NHWC", 8, 28, 28, 128, 128, 3, 1, "float32"),
    ("r2_56x56_256to512_1x1_s2_b2", "NHWC", 2, 56, 56, 256, 512, 1, 2, "float32"),
    ("r3_14x14_256to256_3x3_b8", "NHWC", 8, 14, 14, 256, 256, 3, 1, "float32"),
    ("r3_28x28_128to256_3x3_s2_b4", "NHWC", 4, 28, 28, 128, 256, 3, 2, "float32"),
    ("r4_8x8_256to256_3x3_b2", "NHWC", 2, 8, 8, 256, 256, 3, 1, "float32"),
    ("r4_8x8_128to256_1x1_b1", "NHWC", 1, 8, 8, 128, 256, 1, 1, "float32"),
    ("c16_32x32_16to16_3x3_b8", "NHWC", 8, 32, 32, 16, 16, 3, 1, "float32"),
    ("c32_16x16_32to64_3x3_s2_b8", "NHWC", 8, 16, 16, 32, 64, 3, 2, "float32"),
    # float32, channels-first (NCHW / OIHW)
    ("nchw_56x56_64to64_3x3_b1", "NCHW", 1, 56, 56, 64, 64, 3, 1, "float32"),
    ("nchw_28x28_128to128_3x3_b4", "NCHW", 4, 28, 28, 128, 128, 3, 1, "float32"),
    ("nchw_56x56_64to256_1x1_b2", "NCHW", 2, 56, 56, 64, 256, 1, 1, "float32"),
    ("nchw_28x28_64to128_3x3_s2_b4", "NCHW", 4, 28, 28, 64, 128, 3, 2, "float32"),
    ("nchw_14x14_256to256_3x3_b4", "NCHW", 4, 14, 14, 256, 256, 3, 1, "float32"),
    ("nchw_32x32_16to32_3x3_b8", "NCHW", 8, 32, 32, 16, 32, 3, 1, "float32"),
    # float64 and bfloat16
    ("f64_28x28_64to64_3x3_b2", "NHWC", 2, 28, 28, 64, 64, 3, 1, "float64"),
    ("f64_nchw_14x14_128to128_3x3_b2", "NCHW", 2, 14, 14, 128, 128, 3, 1, "float64"),
    ("bf16_28x28_128to128_3x3_b4", "NHWC", 4, 28, 28, 128, 128, 3, 1, "bfloat16"),
    ("bf16_56x56_64to256_1x1_b2", "NHWC", 2, 56, 56, 64, 256, 1, 1, "bfloat16"),
    ("bf16_nchw_28x28_64to128_3x3_s2_b4", "NCHW", 4, 28, 28, 64, 128, 3, 2, "bfloat16"),
]

OPS = ("fwd", "dgrad", "wgrad")


def _shapes(layout, n, h, w, c, k, win, stride):
  pad = (win - 1) // 2
  oh, ow = (h + 2 * pad - win) // stride + 1, (w + 2 * pad - win) // stride + 1
  if layout == "NHWC":
    return (n, h, w, c), (win, win, c, k), (n, oh, ow, k), ("NHWC", "HWIO", "NHWC"), pad
  return (n, c, h, w), (k, c, win, win), (n, k, oh, ow), ("NCHW", "OIHW", "NCHW"), pad


def _functions(conv, op, x_shape, w_shape, dtype):
  """The jitted function of `op` for one convolution function conv(x, w)."""
  if op == "fwd":
    return jax.jit(conv)
  if op == "dgrad":
    def dgrad(dy, w):
      return jax.linear_transpose(lambda x: conv(x, w), jax.ShapeDtypeStruct(x_shape, dtype))(dy)[0]
    return jax.jit(dgrad)

  def wgrad(x, dy):
    return jax.linear_transpose(lambda w: conv(x, w), jax.ShapeDtypeStruct(w_shape, dtype))(dy)[0]
  return jax.jit(wgrad)


def _time_once(fn, args):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0


def measure_row(row, op, min_time, min_reps, max_reps, seed):
  name, layout, n, h, w, c, k, win, stride, dtype_name = row
  dtype = jnp.dtype(dtype_name)
  x_shape, w_shape, y_shape, dn, pad = _shapes(layout, n, h, w, c, k, win, stride)
  kwargs = dict(window_strides=(stride, stride), padding=((pad, pad), (pad, pad)), dimension_numbers=dn)
  impls = {
      "jaxconv": lambda x, wt: jaxconv.conv_general_dilated(x, wt, **kwargs),
      "lax": lambda x, wt: lax.conv_general_dilated(x, wt, **kwargs),
  }
  rng = np.random.default_rng(seed)
  arrays = {s: jnp.asarray(rng.standard_normal(shape).astype(np.float64), dtype=dtype)
            for s, shape in (("x", x_shape), ("w", w_shape), ("y", y_shape))}
  args = {"fwd": (arrays["x"], arrays["w"]), "dgrad": (arrays["y"], arrays["w"]),
          "wgrad": (arrays["x"], arrays["y"])}[op]
  fns = {impl: _functions(conv, op, x_shape, w_shape, dtype) for impl, conv in impls.items()}
  # Same results (a loose check: the benchmark is no test, but it must not time a wrong computation).
  outs = {impl: np.asarray(jax.block_until_ready(f(*args)), dtype=np.float64) for impl, f in fns.items()}
  ref = outs["lax"]
  err = float(np.linalg.norm(outs["jaxconv"] - ref) / max(np.linalg.norm(ref), 1e-30))
  for f in fns.values():  # warm
    for _ in range(2):
      _time_once(f, args)
  samples = {impl: [] for impl in fns}
  t_start = time.perf_counter()
  rep = 0
  while rep < max_reps and (rep < min_reps or time.perf_counter() - t_start < min_time):
    order = list(fns) if rep % 2 == 0 else list(reversed(list(fns)))
    for impl in order:
      samples[impl].append(_time_once(fns[impl], args))
    rep += 1
  med = {impl: statistics.median(s) for impl, s in samples.items()}
  low = {impl: min(s) for impl, s in samples.items()}
  return {"row": name, "op": op, "dtype": dtype_name, "layout": layout, "reps": rep, "rel_err": err,
          "jaxconv_ms": med["jaxconv"] * 1e3, "lax_ms": med["lax"] * 1e3,
          "ratio": med["jaxconv"] / med["lax"], "ratio_of_min": low["jaxconv"] / low["lax"],
          "samples_ms": {i: [v * 1e3 for v in s] for i, s in samples.items()}}


def _loadavg():
  try:
    with open("/proc/loadavg") as f:
      return " ".join(f.read().split()[:3])
  except OSError:
    return "unknown"


def _summary(results, label):
  ratios = [r["ratio"] for r in results]
  if not ratios:
    return f"{label:8s} (no rows)"
  gm = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
  worst = max(results, key=lambda r: r["ratio"])
  return (f"{label:8s} rows {len(ratios):3d}  geomean {gm:6.2f}  median {statistics.median(ratios):6.2f}  "
          f"max {worst['ratio']:6.2f} ({worst['row']} {worst['op']})")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--filter", default="", help="regex on the row name")
  ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of fwd,dgrad,wgrad")
  ap.add_argument("--min-time", type=float, default=1.0, help="seconds of timed calls per row and op (both impls)")
  ap.add_argument("--min-reps", type=int, default=7)
  ap.add_argument("--max-reps", type=int, default=200)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--json", default="", help="write all results (with samples) here")
  args = ap.parse_args(argv)
  jax.config.update("jax_enable_x64", True)  # for the float64 rows; every array here has an explicit dtype
  ops = [o for o in args.ops.split(",") if o]
  rows = [r for r in ROWS if re.search(args.filter, r[0])]
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {len(rows)} rows x {ops}, "
        f"min_time {args.min_time}s, reps {args.min_reps}-{args.max_reps}", flush=True)
  print(f"load average at start: {_loadavg()}")
  print(f"{'row':36s} {'op':5s} {'dtype':8s} {'jaxconv ms':>11s} {'lax ms':>9s} {'ratio':>6s} {'min r':>6s} "
        f"{'reps':>4s} {'relerr':>8s}", flush=True)
  results = []
  for i, row in enumerate(rows):
    for op in ops:
      r = measure_row(row, op, args.min_time, args.min_reps, args.max_reps, args.seed + i)
      results.append(r)
      print(f"{r['row']:36s} {op:5s} {r['dtype']:8s} {r['jaxconv_ms']:11.3f} {r['lax_ms']:9.3f} "
            f"{r['ratio']:6.2f} {r['ratio_of_min']:6.2f} {r['reps']:4d} {r['rel_err']:8.1e}", flush=True)
  print()
  for op in ops:
    print(_summary([r for r in results if r["op"] == op], op))
  print(_summary(results, "all"))
  print(f"load average at end: {_loadavg()}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"argv": sys.argv, "jax": jax.__version__, "results": results}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
