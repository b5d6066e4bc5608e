"""GPU checks of the tensor-core family (algorithm="implicit_gemm": the Hopper kernels where they apply, else
the mma.sync ones; "implicit_gemm_sm80": the mma.sync kernels only), csrc/kernels/implicit_gemm/: fwd, data and
filter gradients against a float64 reference on fresh random
data, at channel counts on, over and under the kernels' tiles (8 .. 264), input channels off the alignment
(67 and 1x1 windows: zero-padded; 1, 2, 3, 7 with a window: the unrolled-window route), output channels off it
(45: zero-padded by the padded-k variants), odd and prime spatial sizes,
asymmetric padding, strides 1 and 2 (strided data gradients with c >= 64 run on the Hopper as one forward per
phase; the others on mma.sync), dilation, 1-D, 2-D and 3-D, every path's dtype (bf16, f16, f32 as TF32 at DEFAULT,
3xTF32 at HIGHEST).

Tolerances (relative L2 vs float64): bf16/f16 1e-2 (the result is rounded to 8/11 bits); TF32 3e-3 (inputs
rounded to 10-bit mantissas: ~5e-4 expected); 3xTF32 2e-5 (about FP32: the small parts' lost bits are below
2^-21 of each operand). Skipped cleanly without CUDA."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conv_utils as cu
import jaxconv

pytestmark = pytest.mark.gpu

# (x shape channels-last, window, padding, dilation, stride, k)
CASES = {
    "res_3x3": ((2, 14, 14, 64), (3, 3), "SAME", (1, 1), (1, 1), 64),
    "prime_asym_pad": ((3, 13, 17, 24), (3, 3), ((1, 2), (0, 1)), (1, 1), (1, 1), 40),
    "stride2_3x3": ((2, 15, 15, 32), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2), 48),
    "1x1_tile_plus8": ((4, 7, 9, 136), (1, 1), "VALID", (1, 1), (1, 1), 8),
    "1x1_stride2": ((2, 14, 13, 64), (1, 1), "VALID", (1, 1), (2, 2), 128),
    "dil2": ((1, 20, 21, 16), (3, 3), "SAME", (2, 2), (1, 1), 16),
    "7x7_s2_c8": ((2, 30, 29, 8), (7, 7), ((3, 3), (3, 3)), (1, 1), (2, 2), 64),
    "k264_c136": ((1, 9, 11, 136), (3, 3), "SAME", (1, 1), (1, 1), 264),
    # c % 128 == 0 with k > 64: the Hopper filter gradient's 128-wide N tiles. These two take 64-row tiles (k = 136:
    # a partial M tile; stride 2); c384_k264 128-row ones (81 tiles fill one wave; 64-row tiles would need two).
    "wgrad_wide_c128_k136": ((2, 9, 11, 128), (3, 3), "SAME", (1, 1), (1, 1), 136),
    "wgrad_wide_c256_s2": ((2, 13, 12, 256), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2), 128),
    "wgrad_wide_c384_k264": ((1, 7, 7, 384), (3, 3), "SAME", (1, 1), (1, 1), 264),
    # k <= 64: the Hopper kernels' 128x64 tiles (bf16/f16; tf32 fwd), here with a partial N tile (40 of 64). The small
    # cases above with N over 64 (fewer 128x128 tiles than an H100 has SMs) take 64x128 tiles in bf16/f16, 128x64 in
    # tf32. At least 132 128x128 tiles: fwd (wide_fwd) and dgrad (wide_dgrad, c = 136) on the 128-wide tiles.
    "narrow_k40_c72": ((2, 15, 13, 72), (3, 3), "SAME", (1, 1), (1, 1), 40),
    "wide_fwd": ((6, 40, 40, 64), (3, 3), "SAME", (1, 1), (1, 1), 256),
    "wide_dgrad": ((1, 96, 96, 136), (3, 3), "SAME", (1, 1), (1, 1), 64),
    "valid_5x3": ((2, 11, 12, 48), (5, 3), "VALID", (1, 1), (1, 1), 56),
    # the TF32 data gradient with unit strides as the Hopper forward of dy with the flipped filter (c % 4 == 0,
    # c >= 64, k * taps >= 576; also res_3x3, wide_dgrad, k264_c136): dilation, asymmetric and zero pads, 3-D
    "flipped_dgrad_dil_asym": ((2, 17, 19, 64), (3, 3), ((2, 0), (1, 1)), (2, 1), (1, 1), 72),
    "flipped_dgrad_3d": ((1, 4, 9, 10, 64), (3, 3, 3), ((0, 2), (1, 1), (2, 0)), (1, 1, 1), (1, 1, 1), 24),
    # strided data gradients with c >= 64 and no dilation on the Hopper: the forward of dy with each phase's taps
    # flipped, written to every s-th row of dx (phased_dgrad_sm90.cu; also wgrad_wide_c256_s2 above).
    # ResNet's 3x3/2 on even sizes; odd sizes (phases of unequal rows); a 5x3 window, asymmetric pads, stride (2, 1)
    # (phase pads 1 and 2); 3-D stride 2 (8 phases); 147 tiles a phase (128x128 tiles; the others take 128x64).
    "phased_dgrad_res3": ((2, 16, 16, 128), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2), 128),
    "phased_dgrad_odd": ((3, 15, 13, 64), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2), 72),
    "phased_dgrad_5x3_asym": ((2, 17, 12, 64), (5, 3), ((2, 1), (1, 1)), (1, 1), (2, 1), 96),
    "phased_dgrad_3d": ((1, 6, 9, 10, 64), (3, 3, 3), ((1, 1), (1, 1), (1, 1)), (1, 1, 1), (2, 2, 2), 64),
    "phased_dgrad_wide": ((6, 112, 112, 128), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2), 128),
    "conv1d": ((2, 101, 32), (5,), ((2, 2),), (1,), (1,), 24),
    "conv3d": ((1, 5, 9, 10, 16), (3, 3, 3), "SAME", (1, 1, 1), (1, 1, 1), 16),
    # input channels off the 16-byte alignment, windows of one tap and c67: zero-padded to it in the workspace
    # (x, w; dx cropped back)
    "c67_k72": ((1, 9, 10, 67), (3, 3), ((1, 0), (1, 1)), (1, 1), (1, 1), 72),
    "1x1_c5_k16": ((2, 9, 7, 5), (1, 1), "VALID", (1, 1), (1, 1), 16),
    # first layers (c * element size < 16 bytes, a window): the unrolled window (im2col_gemm.cu): the forward in one
    # fused kernel up to 160 taps * c, else 1x1 problems on the unrolled window, dx gathered back (col2im); taps*c
    # on and off the alignment, stride, dilation, asymmetric padding, 1-D/3-D
    "c3_7x7_s2_first_layer": ((2, 37, 41, 3), (7, 7), ((3, 3), (3, 3)), (1, 1), (2, 2), 64),
    "c1_k8": ((2, 17, 19, 1), (3, 3), "SAME", (1, 1), (1, 1), 8),
    "c2_5x3_dil_asym": ((2, 19, 23, 2), (5, 3), ((2, 1), (0, 3)), (2, 1), (1, 2), 16),
    "c7_3x3_k24": ((3, 11, 13, 7), (3, 3), "SAME", (1, 1), (1, 1), 24),
    "c1_conv1d_s2": ((3, 257, 1), (9,), ((4, 4),), (1,), (2,), 8),
    "c3_conv3d": ((2, 7, 9, 8, 3), (3, 3, 3), "SAME", (1, 1, 1), (2, 1, 1), 16),
    # the fused forward (taps * c <= 160; the cases above too): k = 136 in three k blocks (the last 8 of 64 wide),
    # asymmetric pads; 150 output columns in three 50-pixel tiles, k = 16
    "c3_5x5_k136": ((3, 19, 23, 3), (5, 5), ((2, 1), (1, 2)), (1, 1), (1, 1), 136),
    "c1_row150_k16": ((2, 9, 150, 1), (3, 3), "SAME", (1, 1), (1, 1), 16),
    # batch-1 first layers, grids of one wave: the register-gathered forward (im2col_gemm.cu, FragFwdKernel; also the
    # cases above with fewer warps than a wave, at <= 32 columns or in 3xTF32): the case study's 32x32 3 -> 64 (27
    # columns, every math) and ResNet's stem (147 columns in five 32-column chunks, 12544 pixels; 3xTF32 only, the
    # other maths on the fused forward)
    "c3_32x32_b1": ((1, 32, 32, 3), (3, 3), ((1, 1), (1, 1)), (1, 1), (1, 1), 64),
    "c3_stem_b1": ((1, 224, 224, 3), (7, 7), ((3, 3), (3, 3)), (1, 1), (2, 2), 64),
    # ... with 16-pixel tiles whose windows all lie inside x (gathered without bounds tests) beside edge tiles, on
    # odd widths that start tiles mid-row: a dilated 3x3 (27 columns, every math) and c = 1 with k = 16 (NI = 2)
    "c3_3x3_dil2_b1": ((1, 61, 83, 3), (3, 3), "SAME", (2, 2), (1, 1), 64),
    "c1_5x5_b1_k16": ((1, 100, 77, 1), (5, 5), ((2, 2), (2, 2)), (1, 1), (1, 1), 16),
    # taps * c = 175 columns: the chunked forward (over the fused forward's 160); two column tiles of the fused
    # filter gradient (160 + 15); k = 72: two k blocks
    "c5_5x7_k72": ((2, 23, 29, 5), (5, 7), ((2, 2), (3, 3)), (1, 1), (1, 2), 72),
    # a 3430-element patch per tile, more than the fused filter gradient prefetches (3072); 343 columns: 3 tiles (the
    # chunked forward)
    "c7_7x7_wide_patch": ((1, 12, 100, 7), (7, 7), "SAME", (1, 1), (1, 1), 16),
    # 17 images of 6400 output pixels: more than one chunk of unrolled windows (32 MB each), a short last chunk
    "c3_chunks": ((17, 160, 160, 3), (7, 7), ((3, 3), (3, 3)), (1, 1), (2, 2), 16),
    # 1x1 stride 1: plain GEMMs on the Hopper (gemm1x1_sm90.cu: 16-bit operands, and float32 at DEFAULT as TF32),
    # odd M (pixels), c/k over and under the 128 tiles; 1x1_gemm_split's M = 97*101 makes the filter gradient
    # split over M with a tail range; c36_k48: 16-byte rows for float32 only (bf16/f16 take the conv kernels).
    "1x1_gemm_c64_k256": ((3, 7, 9, 64), (1, 1), "VALID", (1, 1), (1, 1), 256),
    "1x1_gemm_c256_k64": ((2, 13, 11, 256), (1, 1), "VALID", (1, 1), (1, 1), 64),
    "1x1_gemm_c520_k136": ((1, 5, 5, 520), (1, 1), "VALID", (1, 1), (1, 1), 136),
    "1x1_gemm_split": ((1, 97, 101, 64), (1, 1), "VALID", (1, 1), (1, 1), 128),
    # GEMM N <= 64 (fwd/wgrad k, dgrad c): 64-wide tiles, here partial (40 of 64)
    "1x1_gemm_c72_k40": ((2, 9, 11, 72), (1, 1), "VALID", (1, 1), (1, 1), 40),
    "1x1_gemm_c36_k48": ((2, 11, 7, 36), (1, 1), "VALID", (1, 1), (1, 1), 48),
    # The Hopper TF32 forward split over the reduction (GEMM N > 64 and 128x128 tiles filling at most half the
    # SMs), also taken by the TF32 data gradient (the flipped forward): ResNet-50 res5's 7x7 at batch 2, 4 tiles of
    # 144 k tiles (18 splits; a partial M tile of 98 rows); k264_c136 above splits 5 ways (fwd) and 9 ways (dgrad)
    # with partial channel tiles; bf16/f16 run these unsplit.
    "split_res5_7x7": ((2, 7, 7, 512), (3, 3), "SAME", (1, 1), (1, 1), 512),
    # The mma.sync 3xTF32 forward and unit-stride data gradient (float32 HIGHEST) on at most 66 128x128 tiles, split
    # over the reduced channels 16 at a time: a batch-1 bottleneck 3x3 (2 tiles, 8 slices of one chunk each); c = 132
    # (fwd: 9 slices, the last chunk 4 channels wide) and k = 24 (dgrad: 2 slices, the second 8 wide) with asymmetric
    # pads; 50 tiles (fwd: 5 slices dealt 9 chunks, the last slice's second step past c); dilation with asymmetric
    # pads (fwd 4, dgrad 3 slices). The cases above with few tiles split too; 3xTF32 filter gradients by the same plan.
    "split_bottleneck_b1": ((1, 14, 14, 128), (3, 3), "SAME", (1, 1), (1, 1), 128),
    "split_c132_k24": ((1, 11, 13, 132), (3, 3), ((1, 0), (2, 1)), (1, 1), (1, 1), 24),
    "split_uneven_c132": ((2, 50, 64, 132), (3, 3), "SAME", (1, 1), (1, 1), 24),
    "split_dil2_asym": ((1, 17, 19, 64), (3, 3), ((2, 1), (1, 2)), (2, 2), (1, 1), 48),
    # The TF32 filter gradient as the Hopper large-window forward with batch and channels swapped (batch % 4 == 0;
    # a 1-D/2-D window of the output's extent, (out - 1) * stride < 129): k <= 64 (128x64 tiles), a stride (the
    # forward's dilation) with odd sizes, partial tiles (c * taps = 360 rows, k = 136) and 8 "channels" (the batch)
    # of a 32-wide k tile; a dilation (its stride) with asymmetric pads; 1-D; res2's 56x56 (a long split reduction).
    "swapped_wgrad_res": ((4, 14, 14, 64), (3, 3), "SAME", (1, 1), (1, 1), 64),
    "swapped_wgrad_s2_odd": ((8, 15, 13, 40), (3, 3), ((1, 1), (1, 1)), (1, 1), (2, 2), 136),
    "swapped_wgrad_dil_asym": ((4, 17, 19, 24), (3, 5), ((2, 0), (1, 3)), (2, 1), (1, 1), 72),
    "swapped_wgrad_conv1d": ((8, 120, 32), (5,), ((2, 2),), (1,), (1,), 24),
    "swapped_wgrad_56": ((4, 56, 56, 64), (3, 3), "SAME", (1, 1), (1, 1), 64),
    # ... and more (tile, split) units than the GPU has SMs (135 tiles x 5 splits of 399 k tiles: 80 each, the last
    # 79), so the persistent ping-pong split kernel's warpgroups take turns over units of unequal length.
    "swapped_wgrad_units": ((4, 19, 21, 640), (3, 3), "SAME", (1, 1), (1, 1), 264),
}
ALGOS = ("implicit_gemm", "implicit_gemm_sm80")
# dtype name -> (operand dtype, precision, tolerance)
MATHS = {
    "bf16": ("bfloat16", None, 1e-2),
    "f16": ("float16", None, 1e-2),
    "tf32": ("float32", "default", 3e-3),
    "3xtf32": ("float32", "highest", 2e-5),
}


def _conv_fn(ns):
  return {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}[ns]


def _run(name, math, algo, rng):
  shape, win, padding, dil, stride, k = CASES[name]
  dtype, precision, tol = MATHS[math]
  ns = len(shape) - 2
  conv = functools.partial(_conv_fn(ns), stride=stride, padding=padding, dilation=dil, algorithm=algo,
                           precision=precision)
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, shape, dtype))
    w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), dtype))
    try:
      jax.eval_shape(conv, x, w)
    except ValueError as e:
      # No variant of the forced family takes this forward (a 3-D problem on the mma.sync kernels, say): the
      # request fails when traced, naming it, and the problem is checked under auto instead.
      assert f"algorithm='{algo}' cannot run this convolution" in str(e), e
      conv = functools.partial(conv, algorithm="auto")
    y = jax.jit(conv)(x, w)
    ct = cu.to_gpu(cu.randn(rng, y.shape, dtype))
    dx, dw = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))(x, w, ct)
    x, w, ct, y, dx, dw = (np.asarray(a) for a in (x, w, ct, y, dx, dw))
  kw = cu.channels_last_lax_kw(ns, stride, padding, dil)
  rdx, rdw = cu.ref_conv_vjp(x, w, ct, **kw)
  errs = {"fwd": cu.rel_l2(y, cu.ref_conv(x, w, **kw)), "dgrad": cu.rel_l2(dx, rdx), "wgrad": cu.rel_l2(dw, rdw)}
  for op, err in errs.items():
    assert err <= tol, f"{op} {name} {math} {algo}: rel_l2={err:.3g} > {tol:g}"
  return errs


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("math", sorted(MATHS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_igemm_matches_reference(name, math, algo, rng):
  _run(name, math, algo, rng)


@pytest.mark.parametrize("name", ["res_3x3", "swapped_wgrad_res"])
@pytest.mark.parametrize("algo", ALGOS)
def test_igemm_tf32_is_tensor_core_math(algo, name, rng):
  """float32 at DEFAULT runs as TF32 (as lax on the GPU): its error is far above FP32's, so the op did not fall
  back to the direct FP32 kernels; HIGHEST (3xTF32) on the same data is ~FP32-accurate. swapped_wgrad_res's
  filter gradient runs as the large-window forward with implicit_gemm."""
  tf32 = _run(name, "tf32", algo, rng)
  exact = _run(name, "3xtf32", algo, rng)
  for op in ("fwd", "dgrad", "wgrad"):
    assert tf32[op] > 3e-5, (op, tf32)  # TF32 rounding (~5e-4); FP32 FMA would give ~1e-7
    assert exact[op] < tf32[op] / 10, (op, exact, tf32)


@pytest.mark.parametrize("name", ["prime_asym_pad", "split_c132_k24"])
@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_igemm_bias_activation(act, name, rng):
  """Float32 HIGHEST (3xTF32 on mma.sync) with bias and activation. Both grids are small enough for the forward to
  split over the input channels (2 and 9 slices), so the reduction of the f32 partial sums applies the epilogue."""
  shape, win, padding, dil, stride, k = CASES[name]
  x = cu.to_gpu(cu.randn(rng, shape, np.float32))
  w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), np.float32))
  b = cu.to_gpu(cu.randn(rng, (k,), np.float32))
  y = jax.jit(functools.partial(jaxconv.conv2d, stride=stride, padding=padding, dilation=dil, activation=act,
                                algorithm="implicit_gemm", precision="highest"))(x, w, b)
  ref = cu.activation_ref(
      cu.ref_conv(np.asarray(x), np.asarray(w),
                  **cu.channels_last_lax_kw(2, stride, padding, dil)) + cu.f64(np.asarray(b)), act)
  cu.assert_close(y, ref, MATHS["3xtf32"][2], f"act={act}")


@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("math", ["bf16", "f16", "tf32"])
@pytest.mark.parametrize("name", ["1x1_gemm", "first_layer", "split_fwd"])
def test_igemm_gemm_bias_activation(name, act, math, rng):
  """The fused epilogue, y = act(x @ w + b) per output channel, with 16-bit and TF32 operands: 1x1 layers, first
  layers (the unrolled window, im2col_gemm.cu) and a 3x3 layer whose TF32 forward splits over the reduction on the
  Hopper (the epilogue then applied by the reduction of the splits' f32 partial sums)."""
  dtype, precision, tol = MATHS[math]
  shape, win, stride, padding, k = {
      "1x1_gemm": ((2, 13, 11, 256), (1, 1), (1, 1), "VALID", 136),
      "first_layer": ((2, 29, 31, 3), (7, 7), (2, 2), ((3, 3), (3, 3)), 64),
      "split_fwd": ((2, 9, 11, 136), (3, 3), (1, 1), "SAME", 136),
  }[name]
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, shape, dtype))
    w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), dtype))
    b = cu.to_gpu(cu.randn(rng, (k,), dtype))
    y = jax.jit(functools.partial(jaxconv.conv2d, stride=stride, padding=padding, activation=act,
                                  algorithm="implicit_gemm", precision=precision))(x, w, b)
    y = np.asarray(y)
  ref = cu.activation_ref(
      cu.ref_conv(np.asarray(x), np.asarray(w),
                  **cu.channels_last_lax_kw(2, stride, padding, (1, 1))) + cu.f64(np.asarray(b)), act)
  cu.assert_close(y, ref, tol, f"act={act} {math}")


@pytest.mark.parametrize("act", [None, "relu", "silu"])
@pytest.mark.parametrize("variant,math", [("padded_k_sm90", "bf16"), ("padded_k_sm90", "tf32"),
                                          ("padded_k_sm80", "f16"), ("padded_k_sm80", "3xtf32")])
def test_igemm_padded_k_bias_activation(variant, math, act, rng):
  """The fused epilogue with output channels off the alignment (k = 45: padded to 48): the bias padded with the
  filter's rows, y cropped from the padded result, the padding channels' values (act(0)) never in it."""
  dtype, precision, tol = MATHS[math]
  shape, win, stride, padding, k = (2, 13, 11, 24), (3, 3), (2, 1), ((1, 2), (0, 1)), 45
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, shape, dtype))
    w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), dtype))
    b = cu.to_gpu(cu.randn(rng, (k,), dtype))
    y = jax.jit(functools.partial(jaxconv.conv2d, stride=stride, padding=padding, activation=act,
                                  algorithm=f"implicit_gemm.{variant}", precision=precision))(x, w, b)
    y = np.asarray(y)
  ref = cu.activation_ref(
      cu.ref_conv(np.asarray(x), np.asarray(w),
                  **cu.channels_last_lax_kw(2, stride, padding, (1, 1))) + cu.f64(np.asarray(b)), act)
  cu.assert_close(y, ref, tol, f"act={act} {math}")


@pytest.mark.parametrize("batch", [1, 2])
def test_igemm_first_layer_3xtf32_nonfinite(batch, rng):
  """The fused first-layer forward at HIGHEST (3xTF32) splits each operand into TF32 parts: a NaN or inf input
  reaches exactly the outputs whose windows hold it (non-finite there, as in the float64 reference) and no other.
  Batch 1 is one wave of tiles (split in registers), batch 2 more (split when staged, several tiles per block)."""
  hw = 23 if batch == 1 else 160
  x = cu.randn(rng, (batch, hw, hw + 2, 3), np.float32)
  x[0, 5, 7, 1] = np.nan
  x[-1, -1, -4, 0] = np.inf
  w = cu.randn(rng, (7, 7, 3, 64), np.float32)
  conv = functools.partial(jaxconv.conv2d, stride=(2, 2), padding=((3, 3), (3, 3)), algorithm="implicit_gemm",
                           precision="highest")
  with cu.gpu_context("float32"):
    y = np.asarray(jax.jit(conv)(cu.to_gpu(x), cu.to_gpu(w)))
  kw = cu.channels_last_lax_kw(2, (2, 2), ((3, 3), (3, 3)), (1, 1))
  hit = ~np.isfinite(x)
  # The outputs whose windows hold a non-finite input, and the reference of the others (their inputs finite).
  bad = cu.ref_conv(hit.astype(np.float32), np.ones_like(w), **kw) > 0
  ref = cu.ref_conv(np.where(hit, 0, x), w, **kw)
  assert bad.any() and not bad.all()
  np.testing.assert_array_equal(~np.isfinite(y), bad)
  cu.assert_close(np.where(bad, 0, y), np.where(bad, 0, ref), cu.tolerance("float32"), "finite outputs")


def test_igemm_first_layer_deterministic(rng):
  """The first-layer route's filter gradient (chunks' f32 partial filters summed in chunk order) and its
  gathered data gradient are bitwise stable across reruns, over several chunks."""
  shape, win, padding, dil, stride, k = CASES["c3_chunks"]
  conv = functools.partial(jaxconv.conv2d, stride=stride, padding=padding, algorithm="implicit_gemm")
  with cu.gpu_context("bfloat16"):
    x = cu.to_gpu(cu.randn(rng, shape, jnp.bfloat16))
    w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), jnp.bfloat16))
    y = jax.jit(conv)(x, w)
    ct = cu.to_gpu(cu.randn(rng, y.shape, jnp.bfloat16))
    g = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))
    (dx1, dw1), (dx2, dw2) = g(x, w, ct), g(x, w, ct)
    assert np.array_equal(np.asarray(dw1), np.asarray(dw2))
    assert np.array_equal(np.asarray(dx1), np.asarray(dx2))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_igemm_1x1_gemm_deterministic(dtype, rng):
  """The 1x1 GEMM path's split filter gradient (f32 partial sums reduced in a fixed order; TF32 on the mma.sync
  GEMM, 16-bit on the Hopper one) is bitwise stable."""
  shape, k = CASES["1x1_gemm_split"][0], CASES["1x1_gemm_split"][-1]
  conv = functools.partial(jaxconv.conv2d, padding="VALID", algorithm="implicit_gemm")
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, shape, dtype))
    w = cu.to_gpu(cu.randn(rng, (1, 1, shape[-1], k), dtype))
    ct = cu.to_gpu(cu.randn(rng, (*shape[:-1], k), dtype))
    g = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))
    (dx1, dw1), (dx2, dw2) = g(x, w, ct), g(x, w, ct)
    assert np.array_equal(np.asarray(dw1), np.asarray(dw2))
    assert np.array_equal(np.asarray(dx1), np.asarray(dx2))


@pytest.mark.parametrize("name,precision,algo", [("split_res5_7x7", "default", "implicit_gemm"),
                                                  ("split_bottleneck_b1", "highest", "implicit_gemm"),
                                                  ("split_c132_k24", "highest", "implicit_gemm_sm80")])
def test_igemm_f32_split_deterministic(name, precision, algo, rng):
  """The float32 forward and data gradient split over the reduction (f32 slices added in a fixed order: the Hopper
  TF32 forward, the mma.sync 3xTF32 kernels) are bitwise stable across reruns."""
  shape, win, padding, dil, stride, k = CASES[name]
  conv = functools.partial(jaxconv.conv2d, stride=stride, padding=padding, dilation=dil, algorithm=algo,
                           precision=precision)
  x = cu.to_gpu(cu.randn(rng, shape, np.float32))
  w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), np.float32))
  ct = cu.to_gpu(cu.randn(rng, jax.eval_shape(conv, x, w).shape, np.float32))
  def y_dx(x, w, ct):
    y, vjp = jax.vjp(lambda x: conv(x, w), x)
    return y, vjp(ct)[0]

  g = jax.jit(y_dx)
  (y1, dx1), (y2, dx2) = g(x, w, ct), g(x, w, ct)
  assert np.array_equal(np.asarray(y1), np.asarray(y2))
  assert np.array_equal(np.asarray(dx1), np.asarray(dx2))


def test_igemm_tf32_swapped_wgrad_deterministic(rng):
  """The TF32 filter gradient as the swapped large-window forward (split over res2's 56x56 window, f32 slices
  added in a fixed order) is bitwise stable across reruns."""
  shape, win, padding, dil, stride, k = CASES["swapped_wgrad_56"]
  conv = functools.partial(jaxconv.conv2d, padding=padding, algorithm="implicit_gemm", precision="default")
  x = cu.to_gpu(cu.randn(rng, shape, np.float32))
  w = cu.to_gpu(cu.randn(rng, (*win, shape[-1], k), np.float32))
  ct = cu.to_gpu(cu.randn(rng, (*shape[:-1], k), np.float32))
  g = jax.jit(lambda x, ct: jax.vjp(lambda w: conv(x, w), w)[1](ct)[0])
  assert np.array_equal(np.asarray(g(x, ct)), np.asarray(g(x, ct)))


def test_igemm_is_auto_choice_and_deterministic(rng):
  """A dense bf16 layer takes the tensor cores by default, equal to the forced choice, bit for bit on reruns."""
  x = cu.to_gpu(cu.randn(rng, (4, 28, 28, 128), jnp.bfloat16))
  w = cu.to_gpu(cu.randn(rng, (3, 3, 128, 128), jnp.bfloat16))
  f = functools.partial(jaxconv.conv2d, padding="SAME")
  forced = jax.jit(functools.partial(f, algorithm="implicit_gemm"))
  y1, y2 = np.asarray(forced(x, w)), np.asarray(forced(x, w))
  assert np.array_equal(y1, y2)
  assert np.array_equal(np.asarray(jax.jit(f)(x, w)), y1)
  loss = lambda x, w: jnp.sum(jnp.sin(f(x, w, algorithm="implicit_gemm").astype(jnp.float32)))
  g = jax.jit(jax.grad(loss, argnums=(0, 1)))
  (a1, b1), (a2, b2) = g(x, w), g(x, w)
  assert np.array_equal(np.asarray(a1), np.asarray(a2)) and np.array_equal(np.asarray(b1), np.asarray(b2))
