"""Small convolutions that reach every CUDA kernel variant and op, for compute-sanitizer runs: the cases below (each
family forced; edge cases such as barrier phases that wrap over many tiles) and, as "variant <name> <i>", every case
of the variant catalogue (tests/variant_cases.py) with its variant forced.

Run under `compute-sanitizer --tool {memcheck,racecheck,initcheck}`; exits non-zero if any result is wrong
(references are computed on the CPU backend so the sanitizer sees only GPU work that jaxconv launched, plus
XLA's own small kernels). Debug poison is on: outputs start as NaN, so an unwritten element fails the check.
"""

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv

# The tests' helpers: the variant catalogue and the channels-last lax arguments of the references.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import conv_utils as cu  # noqa: E402

jaxconv.set_debug_poison(True)
CPU = jax.devices("cpu")[0]
GPU = jax.devices()[0]

# (name, nspatial, x shape (channels-last), window, C->K, groups, stride, dilation, padding, algorithm[, precision])
# precision defaults to "highest"; "default" runs float32 as TF32 on the tensor-core kernels.
CASES = [
    ("direct 2d", 2, (2, 13, 11, 5), (3, 3), 7, 1, (2, 1), (1, 2), "SAME", "direct"),
    ("direct 3d grouped", 3, (1, 5, 6, 7, 4), (2, 3, 2), 6, 2, (1, 2, 1), (1, 1, 1), "VALID", "direct"),
    ("direct 1d", 1, (3, 37, 3), (5,), 4, 1, (3,), (2,), ((4, -1),), "direct"),
    ("depthwise 2d", 2, (2, 17, 19, 8), (3, 3), 8, 8, (1, 1), (1, 1), "SAME", "depthwise"),
    ("depthwise 2d strided", 2, (1, 16, 15, 6), (7, 7), 6, 6, (2, 2), (1, 1), "SAME", "depthwise"),
    ("depthwise cl 1d causal", 1, (2, 203, 16), (4,), 16, 16, (1,), (1,), ((3, 0),), "depthwise"),
    ("depthwise cl 2d", 2, (2, 19, 23, 24), (3, 3), 24, 24, (1, 1), (1, 1), "SAME", "depthwise"),
    ("depthwise 5x5 s2 pads", 2, (2, 13, 12, 12), (5, 5), 12, 12, (2, 2), (1, 1), ((2, 1), (0, 2)), "depthwise"),
    ("depthwise reg f32 3x3 c144", 2, (1, 9, 10, 144), (3, 3), 144, 144, (1, 1), (1, 1), "SAME", "depthwise"),
    # Hopper TMA 3x3 kernel: more tiles than persistent blocks times buffers (the barriers' phases wrap)
    ("depthwise tma 3x3 waves", 2, (512, 20, 28, 32), (3, 3), 32, 32, (1, 1), (1, 1), "SAME", "depthwise"),
    ("depthwise tma 3x3 s2 waves", 2, (512, 21, 29, 32), (3, 3), 32, 32, (2, 2), (1, 1), "SAME", "depthwise"),
    # ... 48-channel tiles: the only tile (48) and three at stride 2 (144)
    ("depthwise tma 3x3 c48 waves", 2, (256, 20, 28, 48), (3, 3), 48, 48, (1, 1), (1, 1), "SAME", "depthwise"),
    ("depthwise tma 3x3 s2 c144", 2, (48, 21, 29, 144), (3, 3), 144, 144, (2, 2), (1, 1), "SAME", "depthwise"),
    # ... packed remainder tiles: 80 = 2 x 32 + 16 over an odd batch, and 8 channels in groups of 4 images
    ("depthwise tma 3x3 c80 packed", 2, (47, 20, 28, 80), (3, 3), 80, 80, (1, 1), (1, 1), "SAME", "depthwise"),
    ("depthwise tma 3x3 c8 packed", 2, (255, 20, 28, 8), (3, 3), 8, 8, (1, 1), (1, 1), "SAME", "depthwise"),
    # ... whole-pixel tiles (56 = 32 + 24 channels in one box row) over many tiles
    ("depthwise tma 3x3 c56 whole", 2, (64, 20, 28, 56), (3, 3), 56, 56, (1, 1), (1, 1), "SAME", "depthwise"),
    ("depthwise cl 2d strided", 2, (1, 21, 18, 16), (3, 3), 16, 16, (2, 2), (1, 1), "SAME", "depthwise"),
    ("depthwise reg s2 up", 2, (2, 15, 13, 24), (3, 3), 24, 24, (2, 2), (1, 1), ((1, 0), (1, 1)), "depthwise"),
    ("depthwise reg 5x5 s2 up", 2, (1, 14, 17, 12), (5, 5), 12, 12, (2, 2), (1, 1), ((2, 2), (1, 2)), "depthwise"),
    ("depthwise reg 7x7 c264", 2, (1, 9, 10, 264), (7, 7), 264, 264, (1, 1), (1, 1), "SAME", "depthwise"),
    # tensor-core 7x7 kernel (16-bit only): a half channel tile, asymmetric and negative pads, odd sizes, a partial
    # image tile
    ("depthwise mma 7x7 c24", 2, (3, 19, 37, 24), (7, 7), 24, 24, (1, 1), (1, 1), ((3, 2), (4, 3)), "depthwise"),
    ("depthwise mma 7x7 c8", 2, (2, 30, 61, 8), (7, 7), 8, 8, (1, 1), (1, 1), ((-1, 2), (5, 0)), "depthwise"),
    # the filter gradient's blocks summing several tiles each (more tiles than blocks)
    ("depthwise mma 7x7 tiles", 2, (300, 9, 13, 16), (7, 7), 16, 16, (1, 1), (1, 1), ((3, 3), (3, 3)), "depthwise"),
    ("depthwise reg 1d k3", 1, (2, 45, 12), (3,), 12, 12, (1,), (1,), ((1, 1),), "depthwise"),
    ("long 1d", 1, (2, 3001, 1), (257,), 1, 1, (1,), (1,), "SAME", "long1d"),
    ("long 1d two chunks", 1, (1, 20011, 2), (1500,), 1, 1, (1,), (1,), "SAME", "long1d"),
    ("small 2d dilated", 2, (1, 45, 47, 1), (3, 3), 1, 1, (1, 1), (4, 4), "SAME", "small"),
    ("small 2d strided", 2, (2, 23, 19, 3), (7, 7), 16, 1, (2, 2), (1, 1), ((3, 2), (3, 3)), "small"),
    ("small 1d", 1, (2, 301, 4), (5,), 4, 1, (1,), (3,), "SAME", "small"),
    ("small 1to1 stencil", 2, (1, 131, 137, 1), (3, 3), 1, 1, (1, 1), (1, 1), "SAME", "small"),
    ("small plane 3x3 dil", 2, (2, 37, 248, 1), (3, 3), 1, 1, (1, 1), (3, 8), ((5, 1), (8, 8)), "small"),
    ("small plane 5x5", 2, (1, 29, 64, 1), (5, 5), 1, 1, (1, 1), (1, 1), "SAME", "small"),
    ("direct 64to1 reduce stencil", 2, (1, 21, 19, 64), (3, 3), 1, 1, (1, 1), (2, 2), "SAME", "direct"),
    ("direct 4to1 wgrad strided", 2, (2, 17, 14, 4), (3, 3), 1, 1, (2, 1), (1, 3), ((2, 0), (-1, 2)), "direct"),
    ("small 16to1 dilated", 2, (1, 67, 71, 16), (3, 3), 1, 1, (1, 1), (2, 2), "SAME", "small"),
    ("small rowseg 3to64 s2", 2, (2, 40, 41, 3), (7, 7), 64, 1, (2, 2), (1, 1), ((3, 3), (3, 3)), "small"),
    ("small rowseg 1to16 hdil", 2, (1, 30, 35, 1), (5, 5), 16, 1, (1, 1), (2, 1), "SAME", "small"),
    ("small 3to4 stencil", 2, (2, 37, 70, 3), (3, 3), 4, 1, (1, 1), (1, 1), "SAME", "small"),
    # 4 -> 4 pixel kernels: fwd / dgrad / wgrad; stride 2 (its dgrad on the gather kernel), a partial 3-tap slice
    ("small 4to4 pixel", 2, (2, 37, 70, 4), (3, 3), 4, 1, (1, 1), (1, 1), "SAME", "small"),
    # bf16: the tensor-core pixel kernel, checked and unchecked (inside the row) segments
    ("small 4to4 pixel wide", 2, (1, 19, 200, 4), (3, 3), 4, 1, (1, 1), (1, 1), "SAME", "small"),
    # 16-bit filter gradient on tensor cores: a 3-D window, W stride 2 and dilation 3, two column tiles
    ("small 4to4 pixel wgrad 3d", 3, (1, 4, 17, 150, 4), (2, 3, 2), 4, 1, (1, 1, 2), (1, 2, 3),
     ((0, 1), (1, 1), (2, 1)), "small"),
    ("small 4to4 pixel s2 5x5", 2, (2, 37, 70, 4), (5, 5), 4, 1, (2, 2), (1, 1), ((2, 1), (0, 2)), "small"),
    ("small 1to4 odd tile", 2, (3, 12, 13, 1), (2, 4), 4, 1, (1, 1), (1, 1), ((1, 0), (-1, 4)), "small"),
    ("auto 2d", 2, (2, 12, 12, 3), (3, 3), 16, 1, (1, 1), (2, 2), "SAME", "auto"),
    # tensor cores: bf16 reaches the Hopper kernels, float32 HIGHEST the mma.sync 3xTF32 ones
    ("igemm 2d", 2, (2, 13, 11, 16), (3, 3), 24, 1, (1, 1), (1, 1), "SAME", "implicit_gemm"),
    # float32 HIGHEST on few tiles: the mma.sync forward (bias, gelu) and data gradient split over the reduced
    # channels into f32 slices (9 and 2 slices, the last of each partial), reduced with the epilogue
    ("igemm 3xtf32 split", 2, (1, 11, 13, 132), (3, 3), 24, 1, (1, 1), (1, 1), ((1, 0), (2, 1)), "implicit_gemm"),
    ("igemm sm80 strided", 2, (2, 15, 14, 8), (3, 3), 16, 1, (2, 2), (1, 1), ((1, 0), (1, 1)),
     "implicit_gemm_sm80"),
    ("igemm first layer c3", 2, (2, 23, 21, 3), (7, 7), 64, 1, (2, 2), (1, 1), ((3, 3), (3, 3)), "implicit_gemm"),
    # 32x32 3 -> 64 at batch 1 (27 columns, one wave): the register-gathered forward in both dtypes (the case above
    # takes it in float32 HIGHEST only)
    ("igemm first layer c3 3x3 one wave", 2, (1, 32, 32, 3), (3, 3), 64, 1, (1, 1), (1, 1), "SAME", "implicit_gemm"),
    # ... on a wider, dilated image: most 16-pixel tiles lie inside x and gather without bounds tests
    ("igemm first layer c3 3x3 interior tiles", 2, (1, 61, 83, 3), (3, 3), 64, 1, (1, 1), (2, 2), "SAME",
     "implicit_gemm"),
    # 320 tiles, more than one wave: the 3xTF32 forward stages its operands split, several tiles per block (the case
    # above fits one wave and splits in registers)
    ("igemm first layer c3 waves", 2, (4, 160, 96, 3), (7, 7), 64, 1, (2, 2), (1, 1), ((3, 3), (3, 3)),
     "implicit_gemm"),
    ("igemm wide wgrad c128", 2, (2, 9, 11, 128), (3, 3), 136, 1, (1, 1), (1, 1), "SAME", "implicit_gemm"),
    ("igemm 1x1 split wgrad", 2, (4, 28, 28, 64), (1, 1), 128, 1, (1, 1), (1, 1), "VALID", "implicit_gemm"),
    ("igemm 3d", 3, (1, 4, 9, 10, 8), (3, 3, 3), 16, 1, (1, 1, 1), (1, 1, 1), "SAME", "implicit_gemm"),
    # TF32 first layer: the unrolled window's GEMMs in TF32 (the case above runs float32 HIGHEST)
    ("igemm tf32 first layer c3", 2, (2, 23, 21, 3), (7, 7), 64, 1, (2, 2), (1, 1), ((3, 3), (3, 3)),
     "implicit_gemm", "default"),
    # TF32: the unit-stride data gradient as the Hopper forward with the flipped filter
    ("igemm tf32 flipped dgrad", 2, (2, 11, 13, 64), (3, 3), 72, 1, (1, 1), (2, 1), ((2, 0), (1, 1)),
     "implicit_gemm", "default"),
    # The strided data gradient as one Hopper forward per phase scattered into dx (bf16 and TF32), odd sizes
    ("igemm phased dgrad", 2, (2, 15, 13, 64), (3, 3), 72, 1, (2, 2), (1, 1), ((1, 1), (1, 1)), "implicit_gemm",
     "default"),
    # TF32 1x1 GEMMs (fwd: the filter transposed to K-major first; wgrad: the mma.sync GEMM, split M)
    ("igemm tf32 1x1 gemm", 2, (3, 29, 31, 36), (1, 1), 136, 1, (1, 1), (1, 1), "VALID", "implicit_gemm", "default"),
    # The Hopper TF32 forward (and the flipped TF32 dgrad) split over the reduction into f32 slices, reduced with
    # the bias and activation: 2 tiles of 72 k tiles (9 splits), a partial M tile
    ("igemm tf32 split fwd", 2, (2, 7, 7, 256), (3, 3), 256, 1, (1, 1), (1, 1), "SAME", "implicit_gemm", "default"),
    # The TF32 filter gradient as the swapped large-window forward (x and dy transposed, split, strided dw): a stride
    # (the forward's dilation), odd sizes, partial tiles
    ("igemm tf32 swapped wgrad", 2, (8, 15, 13, 40), (3, 3), 136, 1, (2, 2), (1, 1), ((1, 1), (1, 1)),
     "implicit_gemm", "default"),
]


def run_case(name, nsp, xshape, window, k, groups, stride, dilation, padding, algorithm, dtype,
             precision="highest"):
  c = xshape[-1]
  wshape = (*window, c // groups, k)
  conv = {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}[nsp]
  if np.dtype(dtype).kind in "biu":
    return run_integer_case(name, conv, nsp, xshape, wshape, groups, stride, dilation, padding, algorithm, dtype)
  rng = np.random.default_rng(0)
  x = rng.standard_normal(xshape).astype(np.float32)
  w = rng.standard_normal(wshape).astype(np.float32) / np.sqrt(c * np.prod(window))
  b = rng.standard_normal(k).astype(np.float32)

  def f(x, w, b):
    return conv(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups,
                activation="gelu", algorithm=algorithm, precision=precision)

  def ref(x, w, b):  # lax on the CPU, float32 HIGHEST
    y = jax.lax.conv_general_dilated(x, w, **cu.channels_last_lax_kw(nsp, stride, padding, dilation),
                                     feature_group_count=groups, precision="highest")
    return jax.nn.gelu(y + b, approximate=True)

  def both(fn):
    loss = lambda x, w, b: jnp.sum(jnp.sin(fn(x, w, b).astype(jnp.float32)))
    return lambda x, w, b: (fn(x, w, b), jax.grad(loss, (0, 1, 2))(x, w, b))

  args = [jnp.asarray(a, dtype) for a in (x, w)] + [jnp.asarray(b, dtype)]
  got = jax.jit(both(f))(*[jax.device_put(a, GPU) for a in args])
  want = jax.jit(both(ref))(*[jax.device_put(a.astype(jnp.float32), CPU) for a in args])
  # 16-bit: the cotangent is rounded too, and the filter gradient of a one-channel layer sums few products per
  # element of mixed sign, so its error relative to the float32 reference reaches a few percent. TF32: 10-bit
  # mantissas.
  tol = 5e-2 if dtype != jnp.float32 else 1e-4 if precision == "highest" else 3e-3
  worst = 0.0
  leaves = list(zip(jax.tree.leaves(got), jax.tree.leaves(want)))
  if dtype != jnp.float32:
    # The bias gradient is XLA's own reduction of a bf16 cotangent (ill-conditioned for lax too): the
    # kernels' outputs are y, dx and dw.
    leaves = leaves[:3]
  for g, r in leaves:
    g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
    err = np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)
    worst = max(worst, err if np.all(np.isfinite(g)) else np.inf)
  ok = worst <= tol
  print(f"{'ok ' if ok else 'BAD'} {name:24s} {jnp.dtype(dtype).name:8s} rel.err {worst:.2e}", flush=True)
  return ok


def run_integer_case(name, conv, nsp, xshape, wshape, groups, stride, dilation, padding, algorithm, dtype):
  """An integer or bool case: the forward only (no gradients, bias or activation), exact against lax on the CPU."""
  rng = np.random.default_rng(0)
  lo, hi = (0, 2) if np.dtype(dtype) == np.dtype(bool) else (-8, 8)
  x, w = (rng.integers(lo, hi, size=s).astype(dtype) for s in (xshape, wshape))
  kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
  got = jax.jit(lambda a, b: conv(a, b, algorithm=algorithm, **kw))(jax.device_put(x, GPU), jax.device_put(w, GPU))
  with jax.default_device(CPU):  # XLA:CPU's integer semantics (wraparound)
    want = jax.lax.conv_general_dilated(jax.device_put(x, CPU), jax.device_put(w, CPU),
                                        **cu.channels_last_lax_kw(nsp, stride, padding, dilation),
                                        feature_group_count=groups)
  ok = np.array_equal(np.asarray(got), np.asarray(want))
  print(f"{'ok ' if ok else 'BAD'} {name:24s} {np.dtype(dtype).name:8s} exact {ok}", flush=True)
  return ok


def catalogue_cases():
  """(case tuple as above, dtype) of every variant catalogue case, its variant forced, float64 run as float32."""
  import variant_cases
  out = []
  for name, cases in variant_cases.CATALOGUE.items():
    if name == "xla.conv":  # no jaxconv kernel; and cuDNN's graph capture breaks under the sanitizers
      continue
    for i, c in enumerate(cases):
      nsp = c.nspatial
      tup = lambda v: (v,) * nsp if isinstance(v, int) else tuple(v)
      dtype = {"float64": jnp.float32}.get(c.dtype, jnp.dtype(c.dtype))
      out.append(((f"variant {name} {i}", nsp, c.x, c.w[:-2], c.w[-1], c.groups, tup(c.stride), tup(c.dilation),
                   c.padding, name, c.precision), dtype))
  return out


def main():
  # Optional regular expression searched in case names ("igemm|depthwise"). Selecting no case is an error: a
  # sanitizer run over nothing would report clean.
  only = sys.argv[1] if len(sys.argv) > 1 else ""
  runs = [(c, dt) for c in CASES for dt in (jnp.float32, jnp.bfloat16)] + catalogue_cases()
  runs = [(c, dt) for c, dt in runs if re.search(only, c[0])]
  if not runs:
    sys.exit(f"sanitizer_cases.py: no case name matches {only!r}")
  ok = True
  for case, dtype in runs:
    ok &= run_case(*case[:10], dtype, *case[10:])
  print(f"sanitizer cases: {len(runs)} runs,", "all correct" if ok else "WRONG RESULTS")
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  main()
