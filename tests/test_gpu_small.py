"""GPU checks of the small-channel family (algorithm="small"), aimed at its stencil fast path (csrc/kernels/small/
stencil.cu): unit stride and no lhs dilation along H and W, H-dilation 1/2/4/8, channel buckets (c, k) in
{(1, 1), (1, <=4), (1, <=16), (<=4, 1), (<=4, <=4), (<=16, 1)}, tiles of 8R x 32P outputs (1->1: 64 x 128, or 64 x
64 below 264 such tiles; 1->k<=4, c<=4: 32 x 64; 16->1: 32 x 32; 1->16: 16 x 32). Sizes on, one over and under the
tiles, odd and prime sizes, symmetric, asymmetric and negative pads, VALID, batch > 1, 3-D (dim 0 is general:
stride and dilation there), fused bias + activation, f32 outputs of half inputs, every dtype, and the data / filter
gradients (dgrad with stride 1 takes the same stencil with a flipped filter). Cases the stencil does not take
(fewer than 8 output rows or columns, H-dilation 3, stride 2, k > 16) check the gather kernel, including its
64-channel bucket split over 4 threads (k = 20, 33). The forward with k % 8 == 0 and 3/5 W taps at W stride 1 or
3/7 at stride 2 takes the row-segment kernel first (the rs_ cases: each pixels-per-thread plan, narrow rows,
H-dilation, 3-D, the stem at batch 1). 4 -> 4 takes the pixel kernels before the stencil and the tiled filter
gradient (px_ cases: fwd / dgrad at delta 1, wgrad without lhs dilation). The one-output-channel kernels of
plane_stencil.cu come first: c == k == 1 with W % 8 == 0 and "same" column padding (register stencil, all three
ops) and the c -> 1 3x3 forward (also reached from the direct family for c > 16).
Skipped cleanly without CUDA."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conv_utils as cu
import jaxconv

pytestmark = pytest.mark.gpu


# (x shape NHWC / NDHWC, window, padding, dilation, stride, k)
CASES = {
    "1to1_prime": ((1, 127, 131, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "1to1_tile_exact": ((1, 64, 128, 1), (3, 3), ((1, 1), (1, 1)), (1, 1), (1, 1), 1),
    "1to1_tile_plus1_asym_b2": ((2, 65, 129, 1), (3, 3), ((2, 0), (0, 2)), (1, 1), (1, 1), 1),
    "1to1_tile_minus1": ((1, 63, 127, 1), (3, 3), ((1, 1), (1, 1)), (1, 1), (1, 1), 1),
    # >= 264 tiles of 64 x 128: the 128-column tiles (the small cases above take 64-column tiles)
    "1to1_big_tiles": ((3, 600, 1300, 1), (3, 3), ((1, 2), (2, 1)), (2, 1), (1, 1), 1),
    "1to1_dil2": ((1, 100, 257, 1), (3, 3), ((2, 2), (2, 2)), (2, 2), (1, 1), 1),
    "1to1_dil4_unequal_pads": ((1, 97, 200, 1), (3, 3), ((4, 1), (0, 5)), (4, 4), (1, 1), 1),
    "1to1_dil8": ((1, 130, 150, 1), (3, 3), ((8, 8), (8, 8)), (8, 8), (1, 1), 1),
    "1to1_dil8_valid": ((1, 30, 140, 1), (3, 3), "VALID", (8, 8), (1, 1), 1),
    "1to1_dil_w3": ((1, 41, 77, 1), (3, 3), ((1, 1), (3, 3)), (1, 3), (1, 1), 1),
    "1to1_8_rows_wide": ((1, 8, 4099, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "1to1_7x7_dil8": ((1, 40, 300, 1), (7, 7), "SAME", (8, 8), (1, 1), 1),
    "1to1_negative_pad": ((1, 40, 70, 1), (3, 3), ((-1, 2), (2, -1)), (1, 1), (1, 1), 1),
    "1to1_5x1": ((3, 19, 33, 1), (5, 1), ((2, 2), (0, 0)), (1, 1), (1, 1), 1),
    "1to3_dil4_1": ((1, 31, 70, 1), (3, 3), ((4, 4), (1, 1)), (4, 1), (1, 1), 3),
    "1to4_tile_plus1": ((2, 33, 65, 1), (3, 3), "SAME", (1, 1), (1, 1), 4),
    "1to5_5x3_asym": ((1, 17, 40, 1), (5, 3), ((0, 4), (1, 1)), (1, 1), (1, 1), 5),
    "1to16_tutorial": ((4, 28, 28, 1), (5, 5), ((2, 2), (2, 2)), (1, 1), (1, 1), 16),
    "1to16_tile_plus1": ((1, 17, 33, 1), (3, 3), "SAME", (2, 2), (1, 1), 16),
    "2to2": ((1, 37, 53, 2), (3, 3), "SAME", (1, 1), (1, 1), 2),
    "3to2_dil2_valid_b2": ((2, 32, 64, 3), (3, 3), "VALID", (2, 2), (1, 1), 2),
    "4to1_dil2": ((1, 67, 45, 4), (3, 3), ((2, 2), (2, 2)), (2, 2), (1, 1), 1),
    "4to4_tile_plus1": ((1, 33, 65, 4), (3, 3), "SAME", (1, 1), (1, 1), 4),
    "4to4_tile_exact_dil8": ((1, 32, 64, 4), (3, 3), ((8, 8), (8, 8)), (8, 8), (1, 1), 4),
    "16to1_dil2": ((1, 33, 33, 16), (3, 3), ((2, 2), (2, 2)), (2, 2), (1, 1), 1),
    "9to1_dil2x3": ((2, 40, 50, 9), (3, 3), ((2, 2), (3, 3)), (2, 3), (1, 1), 1),
    "16to1_tile_exact_dil1": ((1, 32, 32, 16), (3, 3), "SAME", (1, 1), (1, 1), 1),
    # c == k == 1 register stencil (plane_stencil.cu: 3x3/5x5, W-dilation 1/2/4/8 with "same" column padding,
    # W % 8 == 0; 240-column warp strips of 4 rows (2 on small images) spaced by the H-dilation)
    "plane_3x3_b3": ((3, 37, 248, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "plane_dil2_rows_valid": ((1, 50, 480, 1), (3, 3), ((0, 0), (2, 2)), (2, 2), (1, 1), 1),
    "plane_dil4_16_cols_b2": ((2, 61, 16, 1), (3, 3), ((4, 4), (4, 4)), (4, 4), (1, 1), 1),
    "plane_dil8_rowdil3_asym": ((1, 83, 232, 1), (3, 3), ((5, 1), (8, 8)), (3, 8), (1, 1), 1),
    "plane_5x5_b2": ((2, 29, 64, 1), (5, 5), "SAME", (1, 1), (1, 1), 1),
    "plane_5x5_dil4": ((1, 45, 104, 1), (5, 5), ((2, 2), (8, 8)), (1, 4), (1, 1), 1),
    "plane_negative_row_pad": ((1, 40, 72, 1), (3, 3), ((-1, 2), (1, 1)), (1, 1), (1, 1), 1),
    "plane_8_cols": ((1, 9, 8, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "plane_one_row": ((1, 1, 64, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "plane_517x2048_dil2": ((1, 517, 2048, 1), (3, 3), "SAME", (2, 2), (1, 1), 1),
    # c -> 1 3x3 forward (plane_stencil.cu's reduce kernel: c / (8 or 16 bytes of channels) lanes per pixel)
    "2to1_dil_w2": ((1, 33, 41, 2), (3, 3), ((1, 1), (0, 2)), (1, 2), (1, 1), 1),
    "8to1_valid_b3": ((3, 20, 37, 8), (3, 3), "VALID", (2, 3), (1, 1), 1),
    "16to1_neg_pad": ((2, 23, 30, 16), (3, 3), ((-1, 3), (2, 0)), (1, 1), (1, 1), 1),
    # gather fallback (the stencil needs >= 8 output rows, H-dilation 1/2/4/8, unit stride)
    "fallback_1x1": ((1, 1, 1, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "fallback_1x4099": ((1, 1, 4099, 1), (1, 3), "SAME", (1, 1), (1, 1), 1),
    "fallback_5x7": ((3, 5, 7, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "fallback_narrow": ((1, 40, 5, 1), (3, 3), "SAME", (1, 1), (1, 1), 1),
    "fallback_dil3": ((1, 45, 50, 2), (3, 3), "SAME", (3, 1), (1, 1), 4),
    "fallback_stride2": ((1, 45, 50, 1), (3, 3), "SAME", (1, 1), (2, 2), 1),
    # first layers (fwd: the row-segment kernel below; gradients: the gather kernels) and the gather's 64-channel
    # bucket split over 4 threads (16 channels x 4 pixels each; k = 20 and 33 are not multiples of 8)
    "3to64_7x7_s2": ((2, 37, 41, 3), (7, 7), ((3, 3), (3, 3)), (1, 1), (2, 2), 64),
    "3to64_3x3": ((1, 32, 32, 3), (3, 3), "SAME", (1, 1), (1, 1), 64),
    "2to20_partial_chunks": ((1, 19, 23, 2), (3, 3), ((1, 0), (2, 1)), (1, 2), (1, 1), 20),
    "1to33_dil2": ((2, 21, 30, 1), (3, 3), "SAME", (2, 2), (1, 1), 33),
    # the row-segment kernel (fwd, k % 8 == 0, (W taps, W stride) in (3, 1), (5, 1), (3, 2), (7, 2)): 8, 4 and 2
    # pixels per thread, pixel groups of a warp spanning rows, H-dilation, 3-D, the stem at batch 1
    "rs_3to64_p8": ((2, 140, 256, 3), (3, 3), "SAME", (1, 1), (1, 1), 64),
    "rs_2to64_p2": ((3, 90, 100, 2), (3, 3), ((1, 1), (2, 0)), (1, 1), (1, 1), 64),
    "rs_2to64_w14_p4": ((24, 100, 14, 2), (3, 3), "SAME", (1, 1), (1, 1), 64),
    "rs_2to64_s2_p8": ((8, 130, 260, 2), (3, 3), "SAME", (1, 1), (2, 2), 64),
    "rs_4to16_s2_odd": ((2, 33, 47, 4), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2), 16),
    "rs_1to8_5x5_b8": ((8, 132, 40, 1), (5, 5), ((2, 2), (2, 2)), (1, 1), (1, 1), 8),
    "rs_1to16_5x5_hdil3": ((1, 40, 45, 1), (5, 5), "SAME", (3, 1), (1, 1), 16),
    "rs_3to64_stem_b1": ((1, 61, 67, 3), (7, 7), ((3, 3), (3, 3)), (1, 1), (2, 2), 64),
    "rs_3d_2to8": ((1, 5, 9, 21, 2), (2, 3, 3), ((0, 1), (1, 1), (1, 1)), (2, 1, 1), (1, 1, 1), 8),
    "1to24_dil2": ((4, 90, 70, 1), (3, 3), "SAME", (2, 2), (1, 1), 24),
    "1to12_5x5_dil2": ((2, 30, 77, 1), (5, 5), "SAME", (2, 2), (1, 1), 12),
    # 3-D: dim 0 is general in the stencil (stride and dilation along D)
    "3d_1to1": ((2, 5, 19, 37, 1), (3, 3, 3), ((1, 1), (1, 1), (2, 2)), (2, 1, 2), (2, 1, 1), 1),
    "3d_4to4": ((1, 4, 17, 33, 4), (2, 3, 3), ((0, 1), (1, 1), (1, 1)), (1, 2, 1), (1, 1, 1), 4),
    # 4 -> 4 pixel kernels (fwd / dgrad at delta 1: the unrolled 3x3 at unit column stride and dilation, with and
    # without column checks per segment, or any window at 1 or 2 pixels per thread; 8-row blocks; wgrad: 3-tap
    # slices, 256-column tiles, row chunks of each image, or for 16-bit data with at most 4 x 4 taps at unit row
    # stride the tensor-core kernel): odd sizes, asymmetric and negative pads, stride 2 (its dgrad takes the gather
    # kernel), a 5x5 window (a partial 3-tap slice), 7x1 (one tap per slice)
    "px_4to4_prime_asym_b2": ((2, 61, 97, 4), (3, 3), ((2, 0), (1, 3)), (1, 1), (1, 1), 4),
    "px_4to4_3x3_wide_inner": ((1, 45, 333, 4), (3, 3), ((1, 1), (0, 2)), (1, 1), (1, 1), 4),
    "px_4to4_p2_tail": ((1, 517, 520, 4), (3, 3), "SAME", (1, 2), (1, 1), 4),
    "px_4to4_s2": ((2, 45, 70, 4), (3, 3), "SAME", (1, 1), (2, 2), 4),
    "px_4to4_5x5_dil2": ((1, 40, 70, 4), (5, 5), "SAME", (2, 2), (1, 1), 4),
    "px_4to4_chunks_cross_images": ((4, 130, 40, 4), (3, 3), ((1, 1), (0, 2)), (1, 1), (1, 1), 4),
    "px_4to4_7x1_neg_pad": ((1, 50, 300, 4), (7, 1), ((-1, 3), (0, 0)), (1, 1), (1, 1), 4),
    # H stride 2 and H dilation 2 with window rows above the image (the forward's 3x3 stays on the unrolled
    # kernels: only the column stride and dilation must be 1)
    "px_4to4_hstride2_hdil2": ((2, 37, 131, 4), (3, 3), ((3, 0), (1, 1)), (2, 1), (2, 1), 4),
    # a 4x2 window (the 16-bit filter gradient's widest 4 rows), W stride 2 and W dilation 3, negative W padding
    "px_4to4_4x2_ws2_wdil3": ((3, 29, 203, 4), (4, 2), ((2, 1), (3, -1)), (1, 3), (1, 2), 4),
    # W padding below zero on one side: staged source columns start inside the row
    "px_4to4_wneg_pad": ((1, 23, 150, 4), (3, 3), ((1, 1), (-1, 2)), (1, 1), (1, 1), 4),
}
QUICK_DTYPE_CASES = ["1to1_prime", "1to1_dil8", "plane_3x3_b3", "plane_dil8_rowdil3_asym", "plane_5x5_b2",
                     "8to1_valid_b3", "16to1_neg_pad", "1to16_tutorial", "4to4_tile_plus1", "16to1_dil2",
                     "3to2_dil2_valid_b2", "3d_1to1", "fallback_5x7", "3to64_7x7_s2", "rs_4to16_s2_odd",
                     "rs_3to64_stem_b1", "px_4to4_prime_asym_b2", "px_4to4_s2"]


def _run_case(name, dtype, rng, grads=True):
  shape, win, padding, dil, stride, k = CASES[name]
  ns = len(shape) - 2
  fn = {2: jaxconv.conv2d, 3: jaxconv.conv3d}[ns]
  conv = functools.partial(fn, stride=stride, padding=padding, dilation=dil, algorithm="small", precision="highest")
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, shape, dtype))
    w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), dtype))
    y = jax.jit(conv)(x, w)
    ct = cu.to_gpu(cu.randn(rng, y.shape, dtype))
    if grads:
      dx, dw = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))(x, w, ct)
    x, w, ct, y = (np.asarray(a) for a in (x, w, ct, y))
    if grads:
      dx, dw = np.asarray(dx), np.asarray(dw)
  kw = cu.channels_last_lax_kw(ns, stride, padding, dil)
  tol = cu.tolerance(dtype)
  cu.assert_close(y, cu.ref_conv(x, w, **kw), tol, f"fwd {name} {dtype}")
  if grads:
    rdx, rdw = cu.ref_conv_vjp(x, w, ct, **kw)
    cu.assert_close(dx, rdx, tol, f"dgrad {name} {dtype}")
    # the filter gradient of the big case sums 2.3M products per element: f32 accumulation error ~1e-5
    wtol = max(tol, 1e-4) if name == "1to1_big_tiles" else tol
    cu.assert_close(dw, rdw, wtol, f"wgrad {name} {dtype}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_small_f32(name, rng):
  _run_case(name, "float32", rng)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
@pytest.mark.parametrize("name", QUICK_DTYPE_CASES)
def test_small_dtypes(name, dtype, rng):
  _run_case(name, dtype, rng)


# 16-bit 4 -> 4 3x3 at unit column stride and dilation (fwd, and dgrad at stride 1): the tensor-core pixel kernel;
# 16-bit filter gradients of up to 4 x 4 taps at unit row stride: the tensor-core filter gradient (column strips
# inside the row and past its edges, W stride and dilation, 3-D windows, a 4x2 window); the 5x5 takes the FMA
# kernels. Segments inside the row and past its end, rows outside the image, H stride / dilation, 3-D windows,
# batches, negative W padding, rows narrower than a warp's 64 columns.
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["px_4to4_3x3_wide_inner", "px_4to4_chunks_cross_images", "px_4to4_hstride2_hdil2",
                                  "3d_4to4", "px_4to4_wneg_pad", "4to4_tile_plus1", "px_4to4_4x2_ws2_wdil3",
                                  "px_4to4_5x5_dil2"])
def test_small_4to4_mma(name, dtype, rng):
  _run_case(name, dtype, rng)


def _window_reach(bad):
  """Pixels of a 3x3 SAME unit-stride output whose windows hold a pixel where `bad` (N, H, W) is set."""
  p = np.pad(bad, ((0, 0), (1, 1), (1, 1)))
  h, w = bad.shape[1:]
  return np.any([p[:, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=0)


# The tensor-core pixel kernel multiplies each source pixel's neighbours by zero weights (its B's padding): an inf or
# NaN there must not reach outputs whose windows miss it (inf * 0 = nan). Non-finite values at the image's edges and
# inside, in one channel or all, in the source (fwd) and the cotangent (dgrad, the flipped window).
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_small_4to4_mma_nonfinite_reaches_only_its_windows(dtype, rng):
  shape = (2, 23, 70, 4)
  conv = functools.partial(jaxconv.conv2d, padding="SAME", algorithm="small", precision="highest")

  def spoil(a):
    a[1, -1, -1, :] = np.inf
    a[0, 5, 33, 2] = -np.inf
    a[0, 12, 0, 1] = np.nan
    a[1, 0, 40, 3] = np.inf
    return a

  x, ct = spoil(cu.randn(rng, shape, dtype)), spoil(cu.randn(rng, shape, dtype))
  w = cu.randn(rng, (3, 3, 4, 4), dtype)
  xg, wg, ctg = cu.to_gpu(x), cu.to_gpu(w), cu.to_gpu(ct)
  y = np.asarray(jax.jit(conv)(xg, wg)).astype(np.float64)
  dx = np.asarray(jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct)[0])(xg, wg, ctg)).astype(np.float64)
  kw = cu.channels_last_lax_kw(2, (1, 1), "SAME", (1, 1))
  fin = lambda a: np.where(np.isfinite(a.astype(np.float64)), a.astype(np.float64), 0.0)
  ry, rdx = cu.ref_conv(fin(x), w, **kw), cu.ref_conv_vjp(fin(x), w, fin(ct), **kw)[0]
  for out, ref, src, what in ((y, ry, x, "fwd"), (dx, rdx, ct, "dgrad")):
    reach = _window_reach(~np.all(np.isfinite(src.astype(np.float64)), axis=-1))
    np.testing.assert_array_equal(~np.isfinite(out), np.repeat(reach[..., None], 4, axis=-1), what)
    # elsewhere the values themselves (the warps that met a non-finite output recomputed theirs)
    cu.assert_close(out[~reach], ref[~reach], cu.tolerance(dtype), f"{what} finite outputs {dtype}")


# The tensor-core filter gradient (16-bit 4 -> 4) multiplies source pixels in the padding (zeros) by dy, and source
# rows whose dy row lies outside the image by zeros; the float32 (FMA) one multiplies a clamped source column for taps
# past the row's edge and zeroes those taps' sums afterwards. Either way an inf or NaN of the source must reach
# exactly the filter entries that hold a product of it (the sum of the real products, built here term by term in
# float64).
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_small_4to4_wgrad_nonfinite_reaches_only_its_entries(dtype, rng):
  shape = (2, 23, 70, 4)
  conv = functools.partial(jaxconv.conv2d, padding="SAME", algorithm="small", precision="highest")
  x, ct, w = cu.randn(rng, shape, dtype), cu.randn(rng, shape, dtype), cu.randn(rng, (3, 3, 4, 4), dtype)
  bad = {(0, 0, 10, 1): np.inf, (1, 22, 69, 3): -np.inf, (0, 12, 33, 2): np.nan, (1, 5, 0, 0): np.inf}
  for pos, v in bad.items():
    x[pos] = v
  xg, wg, ctg = cu.to_gpu(x), cu.to_gpu(w), cu.to_gpu(ct)
  dw = np.asarray(jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct)[1])(xg, wg, ctg)).astype(np.float64)
  kw = cu.channels_last_lax_kw(2, (1, 1), "SAME", (1, 1))
  x64, ct64 = cu.f64(x), cu.f64(ct)
  ref = cu.ref_conv_vjp(np.where(np.isfinite(x64), x64, 0.0), w, ct64, **kw)[1]
  for (n, i, j, ci), v in bad.items():
    for f1 in range(3):
      for f2 in range(3):
        o1, o2 = i + 1 - f1, j + 1 - f2  # the output pixel whose window puts (i, j) under tap (f1, f2)
        if 0 <= o1 < shape[1] and 0 <= o2 < shape[2]:
          ref[f1, f2, ci, :] += v * ct64[n, o1, o2, :]
  for what, test in (("nan", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
    np.testing.assert_array_equal(test(dw), test(ref), f"{what} entries {dtype}")
  fin = np.isfinite(ref)
  assert np.sum(~fin) >= 4 * 9 and np.sum(fin) >= 4 * 9  # the case has both kinds
  cu.assert_close(dw[fin], ref[fin], cu.tolerance(dtype), f"finite entries {dtype}")


# Three 4 -> 4 layers back to back and their gradients in one jit (each pixel kernel reads what the previous one
# wrote; grids of more than one wave: 684 blocks of the forward), against float64.
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_small_4to4_dependent_chain(dtype, rng):
  conv = functools.partial(jaxconv.conv2d, padding="SAME", algorithm="small", precision="highest")
  shape = (2, 300, 517, 4)
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, shape, dtype))
    ws = [cu.to_gpu((0.3 * cu.randn(rng, (3, 3, 4, 4), dtype)).astype(cu.np_dtype(dtype))) for _ in range(3)]
    ct = cu.to_gpu(cu.randn(rng, shape, dtype))

    def chain(x, *ws):
      for w in ws:
        x = conv(x, w)
      return x

    y, vjp = jax.vjp(jax.jit(chain), x, *ws)
    grads = jax.jit(vjp)(ct)
    y, grads = np.asarray(y), [np.asarray(g) for g in grads]
  kw = cu.channels_last_lax_kw(2, (1, 1), "SAME", (1, 1))
  xs = [cu.f64(np.asarray(x))]
  for w in ws:
    xs.append(cu.ref_conv(xs[-1], np.asarray(w), **kw))
  d, rws = cu.f64(np.asarray(ct)), []
  for i in (2, 1, 0):
    d, dw = cu.ref_conv_vjp(xs[i], np.asarray(ws[i]), d, **kw)
    rws.insert(0, dw)
  # 16-bit intermediates are rounded between the layers; the float64 reference keeps them exact
  tol = 3 * cu.tolerance(dtype)
  cu.assert_close(y, xs[-1], tol, f"chain fwd {dtype}")
  cu.assert_close(grads[0], d, tol, f"chain dx {dtype}")
  for i in range(3):
    cu.assert_close(grads[i + 1], rws[i], tol, f"chain dw{i} {dtype}")


@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("name", ["1to1_tile_plus1_asym_b2", "plane_3x3_b3", "8to1_valid_b3", "1to16_tutorial",
                                  "4to4_tile_plus1", "16to1_dil2", "3d_1to1", "2to20_partial_chunks",
                                  "rs_2to64_p2", "rs_1to16_5x5_hdil3", "px_4to4_p2_tail"])
def test_small_bias_activation(name, act, rng):
  _bias_activation_case(name, act, "float32", rng)


# the 16-bit epilogue of the tensor-core pixel kernel (bias and activation on its accumulator fragments)
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_small_4to4_mma_bias_activation(dtype, act, rng):
  _bias_activation_case("px_4to4_prime_asym_b2", act, dtype, rng)


def _bias_activation_case(name, act, dtype, rng):
  shape, win, padding, dil, stride, k = CASES[name]
  ns = len(shape) - 2
  fn = {2: jaxconv.conv2d, 3: jaxconv.conv3d}[ns]
  x = cu.to_gpu(cu.randn(rng, shape, dtype))
  w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), dtype))
  b = cu.to_gpu(cu.randn(rng, (k,), dtype))
  y = jax.jit(functools.partial(fn, stride=stride, padding=padding, dilation=dil, activation=act,
                                algorithm="small", precision="highest"))(x, w, b)
  ref = cu.activation_ref(
      cu.ref_conv(np.asarray(x), np.asarray(w),
                  **cu.channels_last_lax_kw(ns, stride, padding, dil)) + cu.f64(np.asarray(b)), act)
  cu.assert_close(y, ref, cu.tolerance(dtype), f"{name} {dtype} act={act}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["1to1_dil2", "plane_dil2_rows_valid", "1to16_tutorial", "4to1_dil2",
                                  "rs_2to64_s2_p8", "rs_1to8_5x5_b8", "px_4to4_s2", "px_4to4_p2_tail",
                                  "px_4to4_prime_asym_b2"])
def test_small_half_inputs_f32_output(name, dtype, rng):
  shape, win, padding, dil, stride, k = CASES[name]
  x = cu.to_gpu(cu.randn(rng, shape, dtype))
  w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), dtype))
  b = cu.to_gpu(cu.randn(rng, (k,), np.float32))
  y = jax.jit(functools.partial(jaxconv.conv2d, stride=stride, padding=padding, dilation=dil, algorithm="small",
                                preferred_element_type=jnp.float32, activation="relu"))(x, w, b)
  assert y.dtype == jnp.float32
  ref = cu.ref_conv(np.asarray(x), np.asarray(w),
                    **cu.channels_last_lax_kw(2, stride, padding, dil)) + cu.f64(np.asarray(b))
  cu.assert_close(y, np.maximum(ref, 0), cu.tolerance(dtype, "float32"), name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("c,shape,padding,dil", [
    (32, (2, 19, 45, 32), "SAME", (2, 2)),
    (64, (1, 40, 33, 64), ((2, -1), (3, 1)), (1, 3)),
    (128, (1, 9, 70, 128), "VALID", (1, 1)),
    (256, (1, 11, 13, 256), "SAME", (4, 1)),  # bf16: 32 lanes per pixel; f32 (64 would be needed): direct kernel
])
def test_c_to_1_beyond_small_channel(c, shape, padding, dil, dtype, rng):
  """c -> 1 with c > 16 (outside the small-channel family): the direct family's forward takes the reduce
  stencil, with fused bias + relu; the gradients stay on the direct kernels."""
  conv = functools.partial(jaxconv.conv2d, padding=padding, dilation=dil, activation="relu", precision="highest")
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, shape, dtype))
    w = cu.to_gpu(cu.randn(rng, (3, 3, c, 1), dtype))
    b = cu.to_gpu(cu.randn(rng, (1,), dtype))
    y = np.asarray(jax.jit(conv)(x, w, b))
  ref = cu.ref_conv(np.asarray(x), np.asarray(w), **cu.channels_last_lax_kw(2, (1, 1), padding, dil))
  cu.assert_close(y, np.maximum(ref + cu.f64(np.asarray(b)), 0), cu.tolerance(dtype), f"c={c} {dtype}")


# 256: the register stencil (its filter gradient reduces per block); 4 channels: the pixel kernels
@pytest.mark.parametrize("width,c", [(257, 1), (256, 1), (300, 4)])
def test_small_auto_matches_forced_and_is_deterministic(width, c, rng):
  x = cu.to_gpu(cu.randn(rng, (2, 131, width, c), np.float32))
  w = cu.to_gpu(cu.randn(rng, (3, 3, c, c), np.float32))
  f = functools.partial(jaxconv.conv2d, padding="SAME", dilation=2)
  forced = jax.jit(functools.partial(f, algorithm="small"))
  y1, y2 = np.asarray(forced(x, w)), np.asarray(forced(x, w))
  assert np.array_equal(y1, y2)
  assert np.array_equal(np.asarray(jax.jit(f)(x, w)), y1)
  g = jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w, algorithm="small"))), argnums=(0, 1)))
  (a1, b1), (a2, b2) = g(x, w), g(x, w)
  assert np.array_equal(np.asarray(a1), np.asarray(a2)) and np.array_equal(np.asarray(b1), np.asarray(b2))


@pytest.mark.parametrize("width", [32767, 32768])  # 32768: the register stencil (W % 8 == 0)
def test_small_more_than_2_31_elements(width, tmp_path_factory):
  cu.run_gpu_memory_test(tmp_path_factory, _small_more_than_2_31_elements, width)


def _small_more_than_2_31_elements(width):
  """bf16 1->1 3x3 over 3 images of 32767 x width (> 2**31 elements in all; each image < 2**30, the family's
  per-image bound): 64-bit batch offsets in the stencils' loads and stores, the far corner of the last image
  and the middle of the first against a float64 reference on slices."""
  shape = (3, 32767, width, 1)
  assert np.prod(shape, dtype=np.int64) > 2 ** 31
  _check_sliced(shape)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # float32: the FMA kernel, byte offsets past 2**35
def test_small_4to4_more_than_2_31_elements(dtype, tmp_path_factory):
  cu.run_gpu_memory_test(tmp_path_factory, _small_4to4_more_than_2_31_elements, dtype)


def _small_4to4_more_than_2_31_elements(dtype):
  """4->4 3x3 (the pixel kernel) over 5 images of 16383 x 8192 x 4 (> 2**31 elements, each image < 2**30)."""
  shape = (5, 16383, 8192, 4)
  assert np.prod(shape, dtype=np.int64) > 2 ** 31
  _check_sliced(shape, jnp.dtype(dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_small_4to4_wgrad_more_than_2_31_elements(dtype, tmp_path_factory):
  cu.run_gpu_memory_test(tmp_path_factory, _small_4to4_wgrad_more_than_2_31_elements, dtype)


def _small_4to4_wgrad_more_than_2_31_elements(dtype):
  """4->4 3x3 filter gradient over 5 x 16383 x 8192 x 4: dy is nonzero at a few pixels only, placed past 2**31
  elements and at image edges, so the float64 reference is the sum of their few products with x."""
  shape = (5, 16383, 8192, 4)
  assert np.prod(shape, dtype=np.int64) > 2 ** 31
  dt = jnp.dtype(dtype)
  kx, kd = jax.random.split(jax.random.key(2))
  x = jax.random.normal(kx, shape, dt)
  pix = [(4, 16382, 8191), (4, 9000, 0), (3, 0, 4000), (2, 5000, 5000), (0, 0, 0)]
  vals = jax.random.normal(kd, (len(pix), 4), dt)
  idx = tuple(np.array(a) for a in zip(*pix))
  conv = functools.partial(jaxconv.conv2d, padding="SAME", algorithm="small")

  @jax.jit
  def dw_of(x, vals):
    ct = jnp.zeros(shape, dt).at[idx].set(vals)
    return jax.vjp(lambda w: conv(x, w), jnp.zeros((3, 3, 4, 4), dt))[1](ct)[0]

  dw = cu.f64(np.asarray(dw_of(x, vals)))
  v64 = cu.f64(np.asarray(vals))
  ref = np.zeros((3, 3, 4, 4))
  for (n, o1, o2), v in zip(pix, v64):
    for f1 in range(3):
      for f2 in range(3):
        i, j = o1 - 1 + f1, o2 - 1 + f2
        if 0 <= i < shape[1] and 0 <= j < shape[2]:
          ref[f1, f2] += np.outer(cu.f64(np.asarray(x[n, i, j])), v)
  cu.assert_close(dw, ref, cu.tolerance(dtype), "wgrad past 2**31 elements")


def _check_sliced(shape, dtype=jnp.bfloat16):
  c = shape[-1]
  kx, kw_ = jax.random.split(jax.random.key(1))
  x = jax.random.normal(kx, shape, dtype)
  w = jax.random.normal(kw_, (3, 3, c, c), dtype)
  y = jax.jit(functools.partial(jaxconv.conv2d, padding="SAME", algorithm="small"))(x, w)
  H, W = shape[1], shape[2]
  w_np = np.asarray(w)
  kw = cu.channels_last_lax_kw(2, (1, 1), "VALID", (1, 1))
  for n, i0, j0 in [(2, H - 5, W - 5), (0, H // 2, W // 2), (2, 0, 0)]:
    # padded 6x6 input window around outputs [i0, i0 + 4) x [j0, j0 + 4)
    xs = np.zeros((1, 6, 6, c), np.float64)
    lo_i, lo_j = max(i0 - 1, 0), max(j0 - 1, 0)
    hi_i, hi_j = min(i0 + 5, H), min(j0 + 5, W)
    xs[0, lo_i - (i0 - 1):hi_i - (i0 - 1), lo_j - (j0 - 1):hi_j - (j0 - 1), :] = cu.f64(
        x[n, lo_i:hi_i, lo_j:hi_j, :])
    want = cu.ref_conv(xs, w_np, **kw)
    got = np.asarray(y[n:n + 1, i0:i0 + 4, j0:j0 + 4, :])
    cu.assert_close(got, want[:, :got.shape[1], :got.shape[2]], cu.tolerance(jnp.dtype(dtype)),
                    f"slice n={n} i={i0} j={j0}")
