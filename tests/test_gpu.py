"""GPU-only checks (skipped cleanly without CUDA): the compiled programs use jaxconv's kernels, not cuDNN;
odd sizes; a tensor of more than 2**31 elements; every specialised algorithm forced through `algorithm`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

pytestmark = pytest.mark.gpu

NHWC = ("NHWC", "HWIO", "NHWC")


def _gpu_arrays(rng, *shapes, dtype=np.float32):
  return [cu.to_gpu(cu.randn(rng, s, dtype)) for s in shapes]


def test_compiled_hlo_uses_jaxconv_not_cudnn(rng):
  x, w = _gpu_arrays(rng, (4, 17, 19, 8), (3, 3, 8, 16))
  conv = functools.partial(jaxconv.conv_general_dilated, window_strides=(2, 1), padding="SAME",
                           dimension_numbers=NHWC, precision="highest")
  fwd_text = jax.jit(conv).lower(x, w).compile().as_text()
  loss = lambda x, w: jnp.sum(conv(x, w) ** 2)
  grad_text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).compile().as_text()
  assert "jaxconv_fwd" in fwd_text
  for t in ("jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad"):
    assert t in grad_text, t
  for text in (fwd_text, grad_text):
    # cuDNN convolutions appear as custom calls to __cudnn$conv* (the text also holds source names, so
    # look for the call target, not the bare word).
    assert "__cudnn$conv" not in text
    assert " convolution(" not in text
  # Sanity check of the check itself: lax's convolution does go to cuDNN in the same compiled form.
  lax_text = jax.jit(functools.partial(lax.conv_general_dilated, window_strides=(2, 1), padding="SAME",
                                       dimension_numbers=NHWC)).lower(x, w).compile().as_text()
  assert "__cudnn$conv" in lax_text or "convolution(" in lax_text


ODD = [  # lhs shape (NHWC), window, strides, padding, groups
    ((3, 31, 37, 7), (3, 5), (1, 1), "SAME", 1),
    ((2, 29, 23, 13), (7, 3), (2, 3), [(3, 1), (0, 2)], 1),
    ((1, 97, 89, 11), (5, 5), (3, 2), "VALID", 11),
    ((5, 17, 19, 6), (1, 1), (1, 1), "VALID", 2),
    ((2, 53, 59, 5), (3, 3), (1, 1), "SAME_LOWER", 1),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("case", range(len(ODD)))
def test_odd_prime_sizes_match_reference(case, dtype, rng):
  shape, win, strides, padding, g = ODD[case]
  k = 3 * g
  with cu.gpu_context(dtype):
    x, w = _gpu_arrays(rng, shape, (*win, shape[-1] // g, k), dtype=dtype)
    kw = dict(window_strides=strides, padding=padding, dimension_numbers=NHWC, feature_group_count=g)
    y = jax.jit(functools.partial(jaxconv.conv_general_dilated, precision="highest", **kw))(x, w)
    ct = jnp.asarray(cu.randn(rng, y.shape, dtype))
    dx, dw = jax.jit(lambda x, w, ct: jax.vjp(functools.partial(
        jaxconv.conv_general_dilated, precision="highest", **kw), x, w)[1](ct))(x, w, ct)
    x, w, ct, y, dx, dw = (np.asarray(a) for a in (x, w, ct, y, dx, dw))
  tol = cu.tolerance(dtype)
  cu.assert_close(y, cu.ref_conv(x, w, **kw), tol, f"fwd case {case}")
  rdx, rdw = cu.ref_conv_vjp(x, w, ct, **kw)
  cu.assert_close(dx, rdx, tol, f"dgrad case {case}")
  cu.assert_close(dw, rdw, tol, f"wgrad case {case}")


def _slice_ref(x_slice, w, **kw):
  return cu.ref_conv(x_slice, w, **kw)


@pytest.mark.parametrize("kind", ["depthwise", "pointwise"])
def test_more_than_2_31_elements(kind, tmp_path_factory):
  cu.run_gpu_memory_test(tmp_path_factory, _more_than_2_31_elements, kind)


def _more_than_2_31_elements(kind):
  """bf16 tensors with > 2**31 elements: 64-bit indexing in fwd (and dgrad for the 1x1 case); a few
  slices, including the far end of the tensor, against a float64 reference on those slices. The depthwise case
  runs a 3x3 (the Hopper TMA kernel) and a 7x7 (the tensor-core kernel, and its filter gradient) on the same input,
  one output alive at a time: the tests share the GPU's memory."""
  key = jax.random.key(0)
  if kind == "depthwise":
    shape, w_shapes, g = (2, 1031, 1031, 1024), [(3, 3, 1, 1024), (7, 7, 1, 1024)], 1024
  else:
    shape, w_shapes, g = (1, 16411, 16411, 8), [(1, 1, 8, 8)], 1
  assert np.prod(shape, dtype=np.int64) > 2 ** 31
  kx, kw_ = jax.random.split(key)
  x = jax.random.normal(kx, shape, jnp.bfloat16)
  conv = functools.partial(jaxconv.conv_general_dilated, window_strides=(1, 1), padding="VALID",
                           dimension_numbers=NHWC, feature_group_count=g)
  n_last = shape[0] - 1
  for w_shape in w_shapes:
    w = jax.random.normal(kw_, w_shape, jnp.bfloat16)
    y = jax.jit(conv)(x, w)
    w_np = np.asarray(w)
    kh, kw2 = w_shape[:2]
    H, W = y.shape[1], y.shape[2]
    for (n, i0, j0) in [(0, 0, 0), (n_last, H - 4, W - 4), (n_last, H // 2, W - 3)]:
      xs = np.asarray(x[n:n + 1, i0:i0 + 4 + kh - 1, j0:j0 + 4 + kw2 - 1, :])
      want = _slice_ref(xs, w_np, window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC,
                        feature_group_count=g)
      got = np.asarray(y[n:n + 1, i0:i0 + want.shape[1], j0:j0 + want.shape[2], :])
      cu.assert_close(got, want, 1e-2, f"{kind} {kh}x{kw2} slice n={n} i={i0} j={j0}")
    del y
  if kind == "depthwise":
    # The 7x7's filter gradient (the tensor-core kernel) with a cotangent that is random in two patches, at the
    # tensor's start and far end, and zero elsewhere: the reference sums over the patches only.
    p = 8
    yshape = (shape[0], shape[1] - kh + 1, shape[2] - kw2 + 1, shape[3])
    patches = [(0, 0, 0), (n_last, yshape[1] - p, yshape[2] - p)]
    vals = jax.random.normal(jax.random.key(1), (len(patches), p, p, shape[3]), jnp.bfloat16)
    dy = jnp.zeros(yshape, jnp.bfloat16)
    for v, (n, i0, j0) in zip(vals, patches):
      dy = dy.at[n, i0:i0 + p, j0:j0 + p].set(v)
    dw = np.asarray(jax.jit(lambda x, w, dy: jax.vjp(lambda w: conv(x, w), w)[1](dy)[0])(x, w, dy))
    del dy
    want = np.zeros((kh, kw2, shape[3]))
    for v, (n, i0, j0) in zip(np.asarray(vals).astype(np.float64), patches):
      xs = np.asarray(x[n, i0:i0 + p + kh - 1, j0:j0 + p + kw2 - 1]).astype(np.float64)
      for a in range(kh):
        for b in range(kw2):
          want[a, b] += np.einsum("ijc,ijc->c", xs[a:a + p, b:b + p], v)
    cu.assert_close(dw[:, :, 0], want, 1e-2, "depthwise 7x7 wgrad")
  if kind == "pointwise":
    dy = x  # reuse the big buffer as a cotangent: dx = dy @ w^T per pixel
    dx = jax.jit(lambda x, dy: jax.vjp(lambda a: conv(a, w), x)[1](dy)[0])(x, dy)
    for (i0, j0) in [(0, 0), (shape[1] - 3, shape[2] - 3)]:
      dys = np.asarray(dy[:, i0:i0 + 3, j0:j0 + 3, :]).astype(np.float64)
      want = np.einsum("nhwk,ck->nhwc", dys, w_np[0, 0].astype(np.float64))
      cu.assert_close(np.asarray(dx[:, i0:i0 + 3, j0:j0 + 3, :]), want, 1e-2, f"dgrad slice {i0},{j0}")


ALGO_CASES = {
    "direct": ((2, 13, 11, 6), (3, 3, 3, 4), dict(padding="SAME", groups=2)),
    "depthwise": ((2, 29, 31, 16), (5, 5, 1, 16), dict(padding="SAME", groups=16, stride=2)),
    "long1d": ((3, 4099, 2), (129, 2, 3), dict(padding="SAME")),
    "small": ((2, 37, 41, 3), (5, 5, 3, 7), dict(padding=((2, 1), (3, 0)), stride=2, dilation=(1, 2))),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("algorithm", sorted(ALGO_CASES))
def test_forced_algorithm(algorithm, dtype, rng):
  x_shape, w_shape, opts = ALGO_CASES[algorithm]
  ns = len(x_shape) - 2
  fn = {1: jaxconv.conv1d, 2: jaxconv.conv2d}[ns]
  x, w, b = _gpu_arrays(rng, x_shape, w_shape, (w_shape[-1],), dtype=dtype)
  for act in (None, "gelu"):
    y = jax.jit(functools.partial(fn, algorithm=algorithm, activation=act, precision="highest", **opts))(x, w, b)
    yauto = jax.jit(functools.partial(fn, activation=act, precision="highest", **opts))(x, w, b)
    kw = dict(window_strides=(opts.get("stride", 1),) * ns, padding=opts["padding"],
              rhs_dilation=opts.get("dilation", (1,) * ns),
              dimension_numbers=cu.channels_last_dn(ns), feature_group_count=opts.get("groups", 1))
    ref = cu.activation_ref(cu.ref_conv(np.asarray(x), np.asarray(w), **kw) + cu.f64(np.asarray(b)), act)
    cu.assert_close(y, ref, cu.tolerance(dtype), f"algorithm={algorithm} act={act}")
    cu.assert_close(yauto, ref, cu.tolerance(dtype), f"auto act={act}")
  # The forced algorithm also runs the data and filter gradients (the spec carries it into the transposes).
  conv = functools.partial(fn, algorithm=algorithm, precision="highest", **opts)
  ct = jnp.asarray(cu.randn(rng, conv(x, w).shape, dtype))
  dx, dw = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))(x, w, ct)
  ref_dx, ref_dw = cu.ref_conv_vjp(np.asarray(x), np.asarray(w), np.asarray(ct), **kw)
  cu.assert_close(dx, ref_dx, cu.tolerance(dtype), f"algorithm={algorithm} dgrad")
  cu.assert_close(dw, ref_dw, cu.tolerance(dtype), f"algorithm={algorithm} wgrad")


# c -> 1 3x3 filter gradients (direct.cone_wgrad): (x shape, options, algorithm).
# Dilation, strides and uneven or negative pads move taps off the image on every side; the reduction splits over
# 74, 300, 23 and 23 destination rows; c = 260 takes two channel tiles; c = 12 needs `direct` forced (auto takes the
# small family there).
C_TO_1_WGRAD = [
    ((2, 37, 41, 64), dict(padding=((2, 1), (0, 3)), stride=(1, 2), dilation=(2, 3)), None),
    ((1, 300, 64, 32), dict(padding="SAME", dilation=2), None),
    ((1, 47, 29, 12), dict(padding=((-1, 2), (1, 0)), stride=2), "direct"),
    ((1, 23, 19, 260), dict(padding="SAME"), None),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", range(len(C_TO_1_WGRAD)))
def test_c_to_1_filter_gradient(case, dtype, rng):
  x_shape, opts, algorithm = C_TO_1_WGRAD[case]
  x, w = _gpu_arrays(rng, x_shape, (3, 3, x_shape[-1], 1), dtype=dtype)
  conv = functools.partial(jaxconv.conv2d, algorithm=algorithm or "auto", precision="highest", **opts)
  ct = jnp.asarray(cu.randn(rng, jax.eval_shape(conv, x, w).shape, dtype))
  dw = jax.jit(lambda x, w, ct: jax.vjp(lambda w_: conv(x, w_), w)[1](ct)[0])(x, w, ct)
  pair = lambda v: v if isinstance(v, tuple) else (v, v)
  kw = dict(window_strides=pair(opts.get("stride", 1)), padding=opts["padding"],
            rhs_dilation=pair(opts.get("dilation", 1)), dimension_numbers=NHWC)
  _, ref_dw = cu.ref_conv_vjp(np.asarray(x), np.asarray(w), np.asarray(ct), **kw)
  cu.assert_close(dw, ref_dw, cu.tolerance(dtype), f"c -> 1 wgrad case {case}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_long1d_window_longer_than_a_stage(dtype, rng):
  """long1d stages the reduction in chunks of 1152 taps worked in periods of 24 plus single taps: a 2047-tap
  window crosses a chunk boundary and ends in a partial period; batch 2 x 9001 positions makes the filter
  gradient split over positions (workspace result)."""
  with cu.gpu_context(dtype):
    x, w = _gpu_arrays(rng, (2, 9001, 2), (2047, 2, 3), dtype=dtype)
    conv = functools.partial(jaxconv.conv1d, padding="SAME", algorithm="long1d", precision="highest")
    y = jax.jit(conv)(x, w)
    ct = jnp.asarray(cu.randn(rng, y.shape, dtype))
    dx, dw = jax.jit(lambda x, w, ct: jax.vjp(conv, x, w)[1](ct))(x, w, ct)
    x, w, ct, y, dx, dw = (np.asarray(a) for a in (x, w, ct, y, dx, dw))
  kw = dict(window_strides=(1,), padding="SAME", dimension_numbers=("NWC", "WIO", "NWC"))
  tol = cu.tolerance(dtype)
  cu.assert_close(y, cu.ref_conv(x, w, **kw), tol, "long1d fwd")
  rdx, rdw = cu.ref_conv_vjp(x, w, ct, **kw)
  cu.assert_close(dx, rdx, tol, "long1d dgrad")
  cu.assert_close(dw, rdw, tol, "long1d wgrad")


def test_long1d_does_not_touch_values_outside_each_window(rng):
  """An inf in the last input position may only reach the one output whose window holds it: no kernel may
  multiply a padded (zero) tap with a value outside the window (inf * 0 = nan)."""
  width, taps = 5000, 25 + 1152  # one full chunk, then 25 taps: one period of 24 and a single tap
  x = cu.randn(rng, (1, width, 1), np.float32)
  x[0, -1, 0] = np.inf
  w = cu.randn(rng, (taps, 1, 1), np.float32)
  y = np.asarray(jax.jit(functools.partial(jaxconv.conv1d, algorithm="long1d", precision="highest"))(
      cu.to_gpu(x), cu.to_gpu(w)))
  assert y.shape == (1, width - taps + 1, 1)
  assert np.all(np.isfinite(y[0, :-1, 0])), np.flatnonzero(~np.isfinite(y[0, :, 0]))
  assert not np.isfinite(y[0, -1, 0])
  want = cu.ref_conv(x[:, :-1], w, window_strides=(1,), padding="VALID", dimension_numbers=("NWC", "WIO", "NWC"))
  cu.assert_close(y[:, :-1], want, cu.tolerance("float32"), "finite outputs")
