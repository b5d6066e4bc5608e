"""GPU checks of the channels-last depthwise kernels (csrc/kernels/depthwise/reg.cu, vec.cu), forced with
algorithm="depthwise": the register-stencil fwd / dgrad / wgrad (1-D and 2-D, C % 4 == 0, stride-2 data gradients by
output parity, channel tiles, D folded into the batch), the vectorised fwd/dgrad tile kernel and the vectorised
wgrad at their edges (channel tiles, C equal to one 16-byte vector, odd/prime sizes, stride 2, asymmetric and
causal pads, H dilation, 1-D, 2-D and 3-D, 31x31 on 28x28, fused bias + activation, all dtypes) and the older
kernels they fall back to (C not a multiple of the vector width, W dilation). Every result is compared with a
float64 reference. Skipped cleanly without CUDA."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import conv_utils as cu
import jaxconv

pytestmark = pytest.mark.gpu

# name: (x shape (N, spatial..., C), window, stride, padding pairs, dilation)
CASES = {
    # C = 16: two bf16 vectors, four f32 vectors; 3x3 stride 1 on odd sizes
    "3x3_s1_13x17": ((2, 13, 17, 16), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    # stride 2 (W stride 2 path) with odd sizes and an asymmetric pad
    "3x3_s2_odd": ((2, 15, 19, 24), (3, 3), (2, 2), ((1, 0), (1, 1)), (1, 1)),
    # C = 8: exactly one bf16/f16 vector (two f32 vectors); W = 4099 spans many tiles
    "1d_causal_k4_c8": ((2, 4099, 8), (4,), (1,), ((3, 0),), (1,)),
    # Mamba-like channel count (64-channel tiles) and causal pad
    "1d_causal_k4_c256": ((2, 517, 256), (4,), (1,), ((3, 0),), (1,)),
    # 7x7 (two 4-/8-tap steps), C = 144 (channel tiles wider than 32) and outputs past the last full segment
    "7x7_c144": ((1, 23, 57, 144), (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1)),
    # 31x31 on 28x28 (large filter: narrow channel tiles, one shared-memory stage)
    "31x31_28": ((1, 28, 28, 16), (31, 31), (1, 1), ((15, 15), (15, 15)), (1, 1)),
    # H dilation, asymmetric and negative pads
    "5x3_hdil2_pads": ((2, 17, 13, 32), (5, 3), (1, 1), ((4, -1), (0, 2)), (2, 1)),
    # W dilation: fwd/dgrad fall back to the older kernels, wgrad takes the per-tap path
    "3x3_wdil2": ((1, 19, 21, 8), (3, 3), (1, 1), ((1, 1), (2, 2)), (1, 2)),
    # C = 6: not a multiple of the f32/bf16 vector (fallback), a multiple of the f64 one
    "3x3_c6": ((2, 11, 13, 6), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    # mixed strides, 5x5 (stride 1 along H, 2 along W), prime sizes
    "5x5_s12": ((1, 29, 31, 40), (5, 5), (1, 2), ((2, 2), (2, 2)), (1, 1)),
    # MobileNet-like C = 144, pad_lo = K - 1, one-row images; 5x5 / 7x7 with stride 2, asymmetric pads and
    # C = 4 / 12 (7x7's stride-2 data gradient: the staged kernels)
    "3x3_c144_mobilenet": ((2, 28, 28, 144), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    "5x5_s2_c12": ((2, 21, 18, 12), (5, 5), (2, 2), ((2, 1), (0, 2)), (1, 1)),
    "7x7_s2_c4_b3": ((3, 16, 15, 4), (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1)),
    "3x3_pad_lo2": ((1, 10, 9, 20), (3, 3), (1, 1), ((2, 0), (0, 2)), (1, 1)),
    "3x3_one_row": ((1, 1, 40, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    # register stencil (depthwise_reg.cu) edges: the stride-2 data gradient by output parity with odd and even
    # pads, 1-D and 2-D; H stride 2 with W stride 1; negative pads; one-row 1-D k = 3; two channel tiles (C = 264,
    # 66 vectors); a 3-D problem whose D window is 1 (D folded into the batch)
    "3x3_s2_up_pads": ((2, 16, 13, 8), (3, 3), (2, 2), ((0, 1), (2, 1)), (1, 1)),
    "1d_s2_k3": ((2, 37, 12), (3,), (2,), ((1, 1),), (1,)),
    "1d_s2_k5": ((1, 41, 20), (5,), (2,), ((2, 2),), (1,)),
    "3x3_s21": ((1, 15, 14, 8), (3, 3), (2, 1), ((1, 1), (1, 1)), (1, 1)),
    "3x3_negpad": ((1, 12, 13, 8), (3, 3), (1, 1), ((-1, 2), (2, -1)), (1, 1)),
    "1d_k3_c12": ((3, 50, 12), (3,), (1,), ((1, 1),), (1,)),
    "3x3_c264": ((1, 7, 9, 264), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    "3d_1x3x3_s2": ((2, 3, 9, 11, 8), (1, 3, 3), (1, 2, 2), ((0, 0), (1, 1), (1, 1)), (1, 1, 1)),
    # the Hopper TMA 3x3 kernel (depthwise_tma_sm90.cu): C = 40 = 32 + 8 over 3 images (the 8 packed, below),
    # whole-pixel tiles where 32-channel tiles would leave a partial one (C = 24 and 56, 6 and 14 channel vectors),
    # 48-channel tiles (C = 48 at unit stride and C = 48 / 144 at stride 2), several column tiles with a partial last
    # one, stride 2 on odd sizes with asymmetric pads, pads of 2 and 0 (negative box origins on one side, none on the
    # other; the unit-stride data gradient's pads 0 and 2)
    "3x3_tma_tiles": ((3, 37, 131, 40), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    "3x3_tma_c24": ((2, 17, 45, 24), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    "3x3_tma_c56": ((2, 15, 21, 56), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    "3x3_tma_c48": ((2, 23, 37, 48), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    "3x3_tma_s2_c144": ((2, 29, 30, 144), (3, 3), (2, 2), ((0, 1), (1, 1)), (1, 1)),
    "3x3_tma_s2": ((2, 61, 97, 48), (3, 3), (2, 2), ((1, 1), (0, 1)), (1, 1)),
    "3x3_tma_pad2": ((2, 19, 23, 16), (3, 3), (1, 1), ((2, 0), (0, 2)), (1, 1)),
    # ... packed remainder tiles (several images' last rem channels in one box): 80 = 2 x 32 + 16 over 3 images
    # (the last pair short by one), 8 channels only over 9 images (groups of 4, the last short by 3), and 36 float32
    # channels over 5 images (32 + 4: groups of 8; 16-bit 36 channels are not 16-byte rows and take another kernel)
    "3x3_tma_pack_c80_b3": ((3, 29, 31, 80), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    "3x3_tma_pack_c8_b9": ((9, 11, 21, 8), (3, 3), (1, 1), ((1, 1), (0, 2)), (1, 1)),
    "3x3_tma_pack_c36_b5": ((5, 13, 19, 36), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),
    # 3-D: the D window loop and D-strided tiles
    "3d_3x3x3": ((1, 5, 9, 11, 16), (3, 3, 3), (2, 1, 1), ((1, 1), (1, 1), (1, 1)), (1, 1, 1)),
    # the tensor-core 7x7 kernel (depthwise_mma.cu; 16-bit data at unit stride): C = 24 (a 16-channel tile and a
    # half one) over 3 images with partial row, column and image tiles; asymmetric pads (the data gradient's are
    # 1 / 5 and 6 / 0); C = 8 alone with a negative pad; a wide image five rows high; D folded into the batch
    "7x7_mma_c24_b3": ((3, 19, 37, 24), (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1)),
    "7x7_mma_pads": ((2, 23, 29, 32), (7, 7), (1, 1), ((5, 1), (0, 6)), (1, 1)),
    "7x7_mma_c8_negpad": ((2, 30, 61, 8), (7, 7), (1, 1), ((-1, 2), (5, 0)), (1, 1)),
    "7x7_mma_wide": ((1, 5, 251, 16), (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1)),
    "3d_1x7x7_mma": ((2, 3, 11, 13, 16), (1, 7, 7), (1, 1, 1), ((0, 0), (3, 3), (3, 3)), (1, 1, 1)),
    # ... and a 16-bit 7x7 that it does not take (C = 12, not a multiple of 8): the register stencil's
    "7x7_c12_stencil": ((2, 17, 23, 12), (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1)),
}

ALL_DTYPES = ("float32", "bfloat16", "float16", "float64")
FULL = ("3x3_s1_13x17", "3x3_s2_odd", "1d_causal_k4_c8", "7x7_c144", "3x3_c6", "3x3_c144_mobilenet",
        "5x5_s2_c12", "3x3_s2_up_pads", "3x3_tma_tiles", "7x7_mma_c24_b3", "7x7_mma_pads", "7x7_mma_c8_negpad")


def _params():
  out = []
  for name in CASES:
    for dt in ALL_DTYPES if name in FULL else ("float32", "bfloat16"):
      out.append((name, dt))
  return out


def _kw(x_shape, window, stride, padding, dilation):
  return dict(window_strides=stride, padding=padding, rhs_dilation=dilation,
              dimension_numbers=cu.channels_last_dn(len(window)), feature_group_count=x_shape[-1])


def _fn(ns):
  return {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}[ns]


@pytest.mark.parametrize("name,dtype", _params())
def test_depthwise_fwd_dgrad_wgrad(name, dtype, rng):
  x_shape, window, stride, padding, dilation = CASES[name]
  c = x_shape[-1]
  ns = len(window)
  kw = _kw(*CASES[name])
  conv = functools.partial(_fn(ns), stride=stride, padding=list(padding), dilation=dilation, groups=c,
                           algorithm="depthwise", precision="highest")
  with cu.gpu_context(dtype):
    x = cu.to_gpu(cu.randn(rng, x_shape, dtype))
    w = cu.to_gpu(cu.randn(rng, (*window, 1, c), dtype))
    y = jax.jit(conv)(x, w)
    ct = cu.to_gpu(cu.randn(rng, y.shape, dtype))
    vjp = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))
    dx, dw = vjp(x, w, ct)
    dx2, dw2 = vjp(x, w, ct)
    x, w, ct, y, dx, dw, dx2, dw2 = (np.asarray(a) for a in (x, w, ct, y, dx, dw, dx2, dw2))
  tol = cu.tolerance(dtype)
  cu.assert_close(y, cu.ref_conv(x, w, **kw), tol, f"fwd {name}")
  rdx, rdw = cu.ref_conv_vjp(x, w, ct, **kw)
  cu.assert_close(dx, rdx, tol, f"dgrad {name}")
  cu.assert_close(dw, rdw, tol, f"wgrad {name}")
  # deterministic: no atomics, fixed-order split reduction
  np.testing.assert_array_equal(dx, dx2)
  np.testing.assert_array_equal(dw, dw2)


EPILOGUE = ["3x3_s1_13x17", "3x3_s2_odd", "1d_causal_k4_c256", "7x7_c144", "31x31_28", "3x3_c264", "3x3_tma_tiles",
            "3x3_tma_s2", "3x3_tma_c56", "7x7_mma_c24_b3", "7x7_mma_pads"]
ACTS = [None, "relu", "gelu", "silu"]
OUT_DTYPES = [("float32", None), ("bfloat16", None), ("bfloat16", "float32"), ("float16", "float32")]


def _epilogue_params():  # every (case, dtype pair) once, the activations rotating through them
  return [(name, dt, odt, ACTS[(i + j) % len(ACTS)]) for i, name in enumerate(EPILOGUE)
          for j, (dt, odt) in enumerate(OUT_DTYPES)]


@pytest.mark.parametrize("name,dtype,out_dtype,act", _epilogue_params())
def test_depthwise_bias_activation(name, dtype, out_dtype, act, rng):
  x_shape, window, stride, padding, dilation = CASES[name]
  c = x_shape[-1]
  ns = len(window)
  kw = _kw(*CASES[name])
  x = cu.to_gpu(cu.randn(rng, x_shape, dtype))
  w = cu.to_gpu(cu.randn(rng, (*window, 1, c), dtype))
  b = cu.to_gpu(cu.randn(rng, (c,), out_dtype or dtype))
  conv = functools.partial(_fn(ns), stride=stride, padding=list(padding), dilation=dilation, groups=c,
                           algorithm="depthwise", precision="highest", activation=act,
                           preferred_element_type=out_dtype)
  y = np.asarray(jax.jit(conv)(x, w, b))
  assert y.dtype == np.dtype(cu.np_dtype(out_dtype or dtype))
  ref = cu.activation_ref(cu.ref_conv(np.asarray(x), np.asarray(w), **kw) + cu.f64(np.asarray(b)), act)
  cu.assert_close(y, ref, cu.tolerance(dtype, out_dtype), f"{name} act={act} out={out_dtype}")


def test_depthwise_wgrad_large_batch_splits(rng):
  """Enough positions for many wgrad splits (scratch + ReduceSplits), 1-D with W segments."""
  x_shape, window = (8, 1030, 64), (4,)
  c = x_shape[-1]
  conv = functools.partial(jaxconv.conv1d, stride=1, padding=[(3, 0)], groups=c, algorithm="depthwise",
                           precision="highest")
  x = cu.to_gpu(cu.randn(rng, x_shape, "float32"))
  w = cu.to_gpu(cu.randn(rng, (*window, 1, c), "float32"))
  ct = cu.to_gpu(cu.randn(rng, x_shape, "float32"))
  dx, dw = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))(x, w, ct)
  kw = _kw(x_shape, window, (1,), ((3, 0),), (1,))
  rdx, rdw = cu.ref_conv_vjp(np.asarray(x), np.asarray(w), np.asarray(ct), **kw)
  cu.assert_close(dx, rdx, 1e-5, "dgrad")
  cu.assert_close(dw, rdw, 1e-5, "wgrad")


def _shifted_ref(x, w, dy, pads):
  """float64 depthwise fwd/dgrad/wgrad for stride 1, no dilation, non-negative pads, as sums of shifted
  arrays (memory-light, for inputs too large for the im2col reference). x (N, H, W, C), w (KH, KW, 1, C)."""
  x, w, dy = cu.f64(x), cu.f64(w), cu.f64(dy)
  (pt, pb), (pl, pr) = pads
  kh, kw = w.shape[:2]
  xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
  oh, ow = xp.shape[1] - kh + 1, xp.shape[2] - kw + 1
  y = np.zeros((x.shape[0], oh, ow, x.shape[3]))
  dxp = np.zeros_like(xp)
  dw = np.zeros(w.shape)
  for a in range(kh):
    for b in range(kw):
      win = xp[:, a:a + oh, b:b + ow, :]
      y += win * w[a, b, 0]
      dxp[:, a:a + oh, b:b + ow, :] += dy * w[a, b, 0]
      dw[a, b, 0] = np.einsum("nijc,nijc->c", win, dy)
  return y, dxp[:, pt:pt + x.shape[1], pl:pl + x.shape[2], :], dw


@pytest.mark.parametrize("kind", ["2d_3x3_c96", "1d_causal_k4_c256"])
def test_depthwise_many_tiles_bf16(kind, rng):
  """More tiles than the persistent grid of the double-buffered kernel (blocks prefetch their next tile),
  bf16 as in MobileNetV2 / Mamba."""
  if kind == "2d_3x3_c96":
    x_shape, window, pads, fn = (16, 56, 56, 96), (3, 3), ((1, 1), (1, 1)), jaxconv.conv2d
  else:
    x_shape, window, pads, fn = (12, 2048, 256), (4,), ((3, 0),), jaxconv.conv1d
  c = x_shape[-1]
  conv = functools.partial(fn, stride=1, padding=list(pads), groups=c, algorithm="depthwise", precision="highest")
  x = cu.to_gpu(cu.randn(rng, x_shape, "bfloat16"))
  w = cu.to_gpu(cu.randn(rng, (*window, 1, c), "bfloat16"))
  y = jax.jit(conv)(x, w)
  ct = cu.to_gpu(cu.randn(rng, y.shape, "bfloat16"))
  dx, dw = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))(x, w, ct)
  x, w, ct, y, dx, dw = (np.asarray(a) for a in (x, w, ct, y, dx, dw))
  if len(window) == 1:  # as 2-D with H = 1
    ry, rdx, rdw = _shifted_ref(x[:, None], w[None], ct[:, None], ((0, 0), pads[0]))
    ry, rdx, rdw = ry[:, 0], rdx[:, 0], rdw[0]
  else:
    ry, rdx, rdw = _shifted_ref(x, w, ct, pads)
  cu.assert_close(y, ry, 1e-2, f"fwd {kind}")
  cu.assert_close(dx, rdx, 1e-2, f"dgrad {kind}")
  cu.assert_close(dw, rdw, 1e-2, f"wgrad {kind}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("width", [67, 70])  # 70: 67 outputs, the last 8-column strip has 3 (register stencil)
def test_depthwise_inf_reaches_only_its_windows(dtype, width, rng):
  """An inf in the last input column reaches only the outputs (fwd) and filter taps (wgrad) that use it: no
  kernel may multiply it by a padded zero or an out-of-range cotangent (inf * 0 = nan)."""
  c, taps = 16, 4
  x = cu.randn(rng, (2, width, c), dtype)
  x[1, -1, :] = np.inf
  w = cu.randn(rng, (taps, 1, c), dtype)
  conv = functools.partial(jaxconv.conv1d, padding="VALID", groups=c, algorithm="depthwise", precision="highest")
  xg, wg = cu.to_gpu(x), cu.to_gpu(w)
  y = np.asarray(jax.jit(conv)(xg, wg)).astype(np.float64)
  assert np.all(np.isfinite(y[0])) and np.all(np.isfinite(y[1, :-1])), "fwd: inf leaked"
  assert not np.any(np.isfinite(y[1, -1]))
  ct = cu.to_gpu(cu.randn(rng, y.shape, dtype))
  dw = np.asarray(jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct)[1])(xg, wg, ct)).astype(np.float64)
  # the last column pairs only with tap taps-1 (through the last output)
  assert np.all(np.isfinite(dw[:-1])), "wgrad: inf leaked into taps that never see it"
  assert not np.any(np.isfinite(dw[-1]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_3x3_inf_reaches_only_its_windows(dtype, stride, rng):
  """2-D 3x3 (the TMA kernel on Hopper, else the register stencil): infs in the last row and column reach only the
  outputs whose windows hold them, also where a tile's columns or rows run past the image (computed, not stored)."""
  c = 24
  x = cu.randn(rng, (2, 23, 45, c), dtype)
  x[1, -1, -1, :] = np.inf
  x[0, -1, 3, :c // 2] = -np.inf
  w = cu.randn(rng, (3, 3, 1, c), dtype)
  pads = ((1, 1), (1, 1))
  conv = functools.partial(jaxconv.conv2d, stride=stride, padding=list(pads), groups=c, algorithm="depthwise",
                           precision="highest")
  y = np.asarray(jax.jit(conv)(cu.to_gpu(x), cu.to_gpu(w))).astype(np.float64)
  with np.errstate(invalid="ignore"):  # the reference's filter gradient multiplies the infs by zeros
    ry = _shifted_ref(x, w, np.zeros((2, 23, 45, c)), pads)[0][:, ::stride, ::stride]
  assert y.shape == ry.shape
  np.testing.assert_array_equal(np.isfinite(y), np.isfinite(ry))
  assert not np.all(np.isfinite(ry))
  fin = np.isfinite(ry)
  cu.assert_close(np.where(fin, y, 0.0), np.where(fin, ry, 0.0), cu.tolerance(dtype), "finite outputs")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("c", [64, 80])  # 80: two whole channel tiles and a packed one over image pairs
def test_depthwise_3x3_many_tiles_per_block(dtype, stride, c, rng):
  """Enough tiles that each persistent block of the TMA kernel takes more tiles than it has buffers (its barriers'
  phases wrap), on odd sizes; the unit-stride data gradient as well (the same kernel with the filter flipped)."""
  x_shape, pads = ((64, 56, 56, c) if stride == 1 else (64, 57, 61, c)), ((1, 1), (1, 1))
  conv = functools.partial(jaxconv.conv2d, stride=stride, padding=list(pads), groups=c, algorithm="depthwise",
                           precision="highest")
  x = cu.randn(rng, x_shape, dtype)
  w = cu.randn(rng, (3, 3, 1, c), dtype)
  y = np.asarray(jax.jit(conv)(cu.to_gpu(x), cu.to_gpu(w)))
  ct = cu.randn(rng, x_shape, dtype)  # the unit-stride cotangent (its y has x's shape)
  ry, rdx, _ = _shifted_ref(x, w, ct, pads)
  cu.assert_close(y, ry[:, ::stride, ::stride], cu.tolerance(dtype), f"fwd stride {stride}")
  if stride == 1:
    dx = jax.jit(lambda x, w, ct: jax.vjp(lambda x: conv(x, w), x)[1](ct)[0])(cu.to_gpu(x), cu.to_gpu(w),
                                                                           cu.to_gpu(ct))
    cu.assert_close(np.asarray(dx), rdx, cu.tolerance(dtype), "dgrad")


def _assert_same_nonfinite(got, ref, tol, what):
  """got matches ref: NaN where ref is NaN, the same infinities, and close finite values; ref has some of each."""
  got = got.astype(np.float64)
  assert got.shape == ref.shape, what
  np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{what}: NaN positions")
  np.testing.assert_array_equal(np.where(np.isinf(got), got, 0), np.where(np.isinf(ref), ref, 0),
                                err_msg=f"{what}: infinities")
  assert np.isnan(ref).any() and np.isinf(ref).any(), what
  fin = np.isfinite(ref)
  cu.assert_close(np.where(fin, got, 0.0), np.where(fin, ref, 0.0), tol, f"{what}: finite outputs")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pads", [((3, 3), (4, 2)), ((6, 0), (0, 6))])
def test_depthwise_mma_nonfinite_reach_only_their_windows(dtype, pads, rng):
  """The tensor-core 7x7 kernel multiplies all 16 source columns of a block by a Toeplitz filter that is zero
  outside the window, so an inf or NaN would poison its neighbours' outputs (0 * inf): they must still reach only
  the outputs whose windows hold them, in the forward and in the data gradient (the flipped forward)."""
  k = 7
  c = 24
  shape = (2, 29, 43, c)
  x = cu.randn(rng, shape, dtype)
  x[0, 7, 10, 3] = np.inf
  x[1, 20, 30, 17] = -np.inf
  x[1, 3, 41, 9] = np.nan
  x[0, 28, 0, 20] = np.inf  # a corner: the windows of the last rows and first columns
  w = cu.randn(rng, (k, k, 1, c), dtype)
  conv = functools.partial(jaxconv.conv2d, stride=1, padding=list(pads), groups=c, algorithm="depthwise",
                           precision="highest")
  y = np.asarray(jax.jit(conv)(cu.to_gpu(x), cu.to_gpu(w)))
  dx = jax.jit(lambda x, w, ct: jax.vjp(lambda x: conv(x, w), x)[1](ct)[0])(cu.to_gpu(x), cu.to_gpu(w),
                                                                         cu.to_gpu(x))
  with np.errstate(invalid="ignore"):  # the reference's filter gradient multiplies the infs by infs and zeros
    ry, rdx, _ = _shifted_ref(x, w, x, pads)
  _assert_same_nonfinite(y, ry, cu.tolerance(dtype), f"fwd pads {pads}")
  _assert_same_nonfinite(np.asarray(dx), rdx, cu.tolerance(dtype), f"dgrad pads {pads}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_depthwise_mma_wgrad_nonfinite_reach_only_their_taps(dtype, rng):
  """The tensor-core 7x7 filter gradient multiplies source columns by cotangent columns past the image and padding
  by cotangents (zeros both): an inf in the source must still reach only the taps that pair it with a cotangent
  (a corner's: a quarter of them; the last column's: the taps reaching past no edge), a NaN cotangent every tap of
  its channel, and the other channels stay finite."""
  c = 24
  x = cu.randn(rng, (2, 29, 43, c), dtype)
  ct = cu.randn(rng, (2, 29, 43, c), dtype)  # pads 3: the output has x's shape
  x[0, 0, 0, 3] = np.inf
  x[1, 17, 42, 10] = -np.inf
  x[1, 28, 20, 20] = np.inf
  ct[0, 14, 20, 17] = np.nan
  w = cu.randn(rng, (7, 7, 1, c), dtype)
  pads = ((3, 3), (3, 3))
  conv = functools.partial(jaxconv.conv2d, stride=1, padding=list(pads), groups=c, algorithm="depthwise",
                           precision="highest")
  dw = jax.jit(lambda x, w, ct: jax.vjp(lambda w: conv(x, w), w)[1](ct)[0])(cu.to_gpu(x), cu.to_gpu(w),
                                                                         cu.to_gpu(ct))
  with np.errstate(invalid="ignore"):
    _, _, rdw = _shifted_ref(x, w, ct, pads)
  assert np.isfinite(rdw[:, :, 0, [0, 1, 2, 4, 23]]).all() and np.isfinite(rdw[4:, :, 0, 3]).all()
  _assert_same_nonfinite(np.asarray(dw), rdw, cu.tolerance(dtype), "wgrad")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_depthwise_mma_wgrad_many_tiles_per_block(dtype, rng):
  """More tiles than the tensor-core filter gradient's blocks (each sums several in its registers), on small odd
  images with C = 40 (a last channel tile of 8) and asymmetric pads."""
  x_shape, pads, c = (300, 11, 13, 40), ((4, 2), (1, 5)), 40
  conv = functools.partial(jaxconv.conv2d, stride=1, padding=list(pads), groups=c, algorithm="depthwise",
                           precision="highest")
  x = cu.randn(rng, x_shape, dtype)
  w = cu.randn(rng, (7, 7, 1, c), dtype)
  ct = cu.randn(rng, x_shape, dtype)
  dw = jax.jit(lambda x, w, ct: jax.vjp(lambda w: conv(x, w), w)[1](ct)[0])(cu.to_gpu(x), cu.to_gpu(w),
                                                                         cu.to_gpu(ct))
  _, _, rdw = _shifted_ref(x, w, ct, pads)
  cu.assert_close(np.asarray(dw), rdw, cu.tolerance(dtype), "wgrad")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_depthwise_mma_convnext_layer(dtype, rng):
  """ConvNeXt's 7x7 layer shape (56^2 x 96: 6 channel tiles, 56 columns in blocks of 8) on 8 images, with bias and
  GELU, and its data and filter gradients."""
  x_shape, pads, c = (8, 56, 56, 96), ((3, 3), (3, 3)), 96
  conv = functools.partial(jaxconv.conv2d, stride=1, padding=list(pads), groups=c, algorithm="depthwise",
                           precision="highest")
  x = cu.randn(rng, x_shape, dtype)
  w = cu.randn(rng, (7, 7, 1, c), dtype)
  b = cu.randn(rng, (c,), dtype)
  ct = cu.randn(rng, x_shape, dtype)
  y = np.asarray(jax.jit(functools.partial(conv, activation="gelu"))(cu.to_gpu(x), cu.to_gpu(w), cu.to_gpu(b)))
  dx, dw = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))(cu.to_gpu(x), cu.to_gpu(w), cu.to_gpu(ct))
  ry, rdx, rdw = _shifted_ref(x, w, ct, pads)
  cu.assert_close(y, cu.activation_ref(ry + cu.f64(b), "gelu"), cu.tolerance(dtype), "fwd + bias + gelu")
  cu.assert_close(np.asarray(dx), rdx, cu.tolerance(dtype), "dgrad")
  cu.assert_close(np.asarray(dw), rdw, cu.tolerance(dtype), "wgrad")
