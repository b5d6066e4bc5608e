"""jaxconv.conv1d / conv2d / conv3d against a lax + jax.nn float64 reference."""

from __future__ import annotations

import contextlib
import functools
import itertools

import jax
import jax.numpy as jnp
import jax.test_util as jtu
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

CONV = {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}
ACT = {None: lambda y: y, "relu": jax.nn.relu, "gelu": functools.partial(jax.nn.gelu, approximate=True),
       "silu": jax.nn.silu}

_C = np.sqrt(2.0 / np.pi)
# float64 numpy activations and derivatives, written independently of jax.nn (gelu: tanh approximation).
NP_ACT = {
    None: (lambda y: y, lambda y: np.ones_like(y)),
    "relu": (lambda y: np.maximum(y, 0.0), lambda y: (y > 0).astype(np.float64)),
    "gelu": (lambda y: 0.5 * y * (1 + np.tanh(_C * (y + 0.044715 * y ** 3))),
             lambda y: (0.5 * (1 + np.tanh(_C * (y + 0.044715 * y ** 3)))
                        + 0.5 * y * (1 - np.tanh(_C * (y + 0.044715 * y ** 3)) ** 2) * _C * (1 + 3 * 0.044715 * y ** 2))),
    "silu": (lambda y: y / (1 + np.exp(-y)),
             lambda y: (1 / (1 + np.exp(-y))) * (1 + y * (1 - 1 / (1 + np.exp(-y))))),
}


def _tuple(v, ns):
  return (v,) * ns if isinstance(v, int) else tuple(v)


def _pads(padding, ns):
  if isinstance(padding, str):
    return padding
  if isinstance(padding, int):
    return [(padding, padding)] * ns
  padding = list(padding)
  if all(isinstance(p, int) for p in padding):
    return [(p, p) for p in padding]
  return [tuple(p) for p in padding]


def _dn(ns, data_format):
  sp = "DHW"[3 - ns:]
  if data_format == "channels_last":
    return ("N" + sp + "C", sp + "IO", "N" + sp + "C")
  return ("NC" + sp, "OI" + sp, "NC" + sp)


def _ref_kw(ns, stride, padding, dilation, groups, data_format):
  return dict(window_strides=_tuple(stride, ns), padding=_pads(padding, ns), rhs_dilation=_tuple(dilation, ns),
              dimension_numbers=_dn(ns, data_format), feature_group_count=groups)


def _bias_b(bias, ns, data_format):
  b = cu.f64(bias)
  return b if data_format == "channels_last" else b.reshape((-1,) + (1,) * ns)


def reference(x, w, bias, *, ns, stride=1, padding="VALID", dilation=1, groups=1, activation=None,
              data_format="channels_last"):
  """act(conv + bias) in float64 (numpy reference convolution, numpy activations)."""
  y = cu.ref_conv(x, w, **_ref_kw(ns, stride, padding, dilation, groups, data_format))
  if bias is not None:
    y = y + _bias_b(bias, ns, data_format)
  return NP_ACT[activation][0](y)


def reference_vjp(x, w, bias, ct, *, ns, activation=None, data_format="channels_last", **kw):
  """float64 (dx, dw, dbias) of act(conv + bias) for cotangent ct."""
  rkw = _ref_kw(ns, kw.get("stride", 1), kw.get("padding", "VALID"), kw.get("dilation", 1), kw.get("groups", 1),
                data_format)
  pre = cu.ref_conv(x, w, **rkw) + _bias_b(bias, ns, data_format)
  dpre = cu.f64(ct) * NP_ACT[activation][1](pre)
  dx, dw = cu.ref_conv_vjp(x, w, dpre, **rkw)
  axes = tuple(i for i in range(ns + 2) if i != (ns + 1 if data_format == "channels_last" else 1))
  return dx, dw, dpre.sum(axis=axes)


def _shapes(ns, n, c, k, spatial, window, groups, data_format):
  if data_format == "channels_last":
    return (n, *spatial, c), (*window, c // groups, k)
  return (n, c, *spatial), (k, c // groups, *window)


OPTIONS = [  # (stride, padding, dilation, groups, bias, activation)
    (1, "VALID", 1, 1, False, None),
    (2, "SAME", 1, 1, True, "relu"),
    (1, "SAME_LOWER", 2, 2, True, "gelu"),
    ((2, 1, 3), 1, 1, 1, True, "silu"),
    (1, (1, 0, 2), (1, 2, 1), 3, False, "relu"),
    (3, ((2, 1), (0, 3), (1, 1)), 1, 6, True, None),  # depthwise
    (1, ((-1, 2), (1, -1), (0, 0)), 1, 1, True, "gelu"),  # negative padding
]


def _opt_for_ns(opt, ns):
  def cut(v):
    if isinstance(v, tuple) and not isinstance(v, str):
      return v[:ns]
    return v
  stride, padding, dilation, groups, bias, act = opt
  return cut(stride), cut(padding), cut(dilation), groups, bias, act


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("opt_index", range(len(OPTIONS)))
@pytest.mark.parametrize("ns", [1, 2, 3])
def test_convnd_matches_reference(ns, opt_index, data_format, rng):
  stride, padding, dilation, groups, use_bias, act = _opt_for_ns(OPTIONS[opt_index], ns)
  spatial = {1: (23,), 2: (9, 11), 3: (5, 7, 6)}[ns]
  window = {1: (5,), 2: (3, 2), 3: (3, 2, 2)}[ns]
  c, k = 6, 12
  xs, ws = _shapes(ns, 2, c, k, spatial, window, groups, data_format)
  x = cu.randn(rng, xs, np.float32)
  w = cu.randn(rng, ws, np.float32)
  b = cu.randn(rng, (k,), np.float32) if use_bias else None
  kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, activation=act,
            data_format=data_format)
  got = CONV[ns](jnp.asarray(x), jnp.asarray(w), None if b is None else jnp.asarray(b), precision="highest", **kw)
  want = reference(x, w, b, ns=ns, **kw)
  assert got.shape == want.shape and got.dtype == jnp.float32
  cu.assert_close(got, want, 1e-5, repr(kw))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_conv2d_bias_activation_dtypes(dtype, act, rng):
  ctx = cu.enable_x64() if dtype == "float64" else contextlib.nullcontext()
  with ctx:
    x = cu.randn(rng, (2, 7, 8, 5), dtype)
    w = cu.randn(rng, (3, 3, 5, 6), dtype)
    b = cu.randn(rng, (6,), dtype)
    got = jaxconv.conv2d(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), padding="SAME", activation=act)
    assert got.dtype == np.dtype(cu.np_dtype(dtype)), got.dtype
    got = np.asarray(got)
  want = reference(x, w, b, ns=2, padding="SAME", activation=act)
  cu.assert_close(got, want, cu.tolerance(dtype), f"{dtype} {act}")


@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
def test_conv2d_bf16_with_f32_result(act, rng):
  x = cu.randn(rng, (2, 7, 8, 5), "bfloat16")
  w = cu.randn(rng, (3, 3, 5, 6), "bfloat16")
  b = cu.randn(rng, (6,), np.float32)  # bias has the result dtype
  got = jaxconv.conv2d(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), padding="SAME", activation=act,
                       preferred_element_type=jnp.float32)
  assert got.dtype == jnp.float32
  cu.assert_close(got, reference(x, w, b, ns=2, padding="SAME", activation=act), 5e-5, str(act))


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("ns,act", [(1, "gelu"), (2, "silu"), (3, "relu"), (1, None)])
def test_fused_path_gradients_match_reference(ns, act, data_format, rng):
  """First derivatives w.r.t. x, w and bias of act(conv + bias) agree with lax + jax.nn (float64)."""
  spatial = {1: (11,), 2: (6, 7), 3: (4, 5, 3)}[ns]
  window = {1: (3,), 2: (3, 2), 3: (2, 2, 2)}[ns]
  xs, ws = _shapes(ns, 2, 4, 6, spatial, window, 2, data_format)
  with cu.enable_x64():
    x, w, b = (jnp.asarray(rng.standard_normal(s)) for s in (xs, ws, (6,)))

    @jax.jit
    def ours(x, w, b, ct):
      f = lambda x, w, b: CONV[ns](x, w, b, stride=2, padding="SAME", groups=2, activation=act,
                                   data_format=data_format, precision="highest")
      y, vjp = jax.vjp(f, x, w, b)
      return y, vjp(ct)

    shape = jax.eval_shape(lambda x, w, b: CONV[ns](x, w, b, stride=2, padding="SAME", groups=2,
                                                    data_format=data_format), x, w, b).shape
    ct = jnp.asarray(rng.standard_normal(shape))
    y, got = ours(x, w, b, ct)
  cu.assert_close(y, reference(x, w, b, ns=ns, stride=2, padding="SAME", groups=2, activation=act,
                               data_format=data_format), 1e-12, "y")
  want = reference_vjp(x, w, b, ct, ns=ns, stride=2, padding="SAME", groups=2, activation=act,
                       data_format=data_format)
  for g, r, what in zip(got, want, ("x", "w", "bias")):
    cu.assert_close(g, r, 1e-11, what)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_fused_path_check_grads_order2_conv1d(act, rng):
  with cu.enable_x64():
    for _ in range(100):
      x, w, b = (jnp.asarray(rng.standard_normal(s)) for s in ((2, 9, 3), (3, 3, 4), (4,)))
      pre = cu.ref_conv(x, w, window_strides=(1,), padding=[(1, 2)], dimension_numbers=("NWC", "WIO", "NWC")) + b
      if act != "relu" or np.min(np.abs(pre)) > 2e-2:  # keep relu's kink away from finite differences
        break
    f = jax.jit(lambda x, w, b: jaxconv.conv1d(x, w, b, padding=[(1, 2)], activation=act, precision="highest"))
    jtu.check_grads(f, (x, w, b), order=2, modes=("fwd", "rev"))


PRECISIONS = [None, "highest", "float32", "default", "high", "bfloat16", "tensorfloat32",
              lax.Precision.HIGHEST, lax.Precision.DEFAULT, lax.Precision.HIGH,
              (lax.Precision.HIGHEST, lax.Precision.HIGHEST), ("highest", "highest")]


@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
def test_precision_forms_accepted(precision, rng):
  x = cu.randn(rng, (2, 6, 7, 3), np.float32)
  w = cu.randn(rng, (3, 3, 3, 4), np.float32)
  highest = precision in ("highest", "float32", lax.Precision.HIGHEST) or (
      isinstance(precision, tuple) and all(str(p).lower().endswith("highest") for p in precision))
  tol = 1e-5 if highest or jax.default_backend() == "cpu" else 1e-2
  want = reference(x, w, None, ns=2, padding="SAME")
  got = jaxconv.conv2d(jnp.asarray(x), jnp.asarray(w), padding="SAME", precision=precision)
  cu.assert_close(got, want, tol, f"conv2d precision={precision!r}")
  got = jaxconv.conv_general_dilated(jnp.asarray(x), jnp.asarray(w), (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=precision)
  cu.assert_close(got, want, tol, f"conv_general_dilated precision={precision!r}")


@pytest.mark.parametrize("padding", [0, 1, (1, 2), [(0, 1), (2, 0)], ((1, 1), (1, 1)), "SAME", "VALID",
                                     "SAME_LOWER"])
def test_padding_forms(padding, rng):
  x = cu.randn(rng, (1, 7, 8, 2), np.float32)
  w = cu.randn(rng, (3, 2, 2, 3), np.float32)
  got = jaxconv.conv2d(jnp.asarray(x), jnp.asarray(w), padding=padding, precision="highest")
  cu.assert_close(got, reference(x, w, None, ns=2, padding=padding), 1e-5, repr(padding))


@pytest.mark.parametrize("padding", ["same", "valid", "same_lower"])
def test_lower_case_padding_strings_like_lax(padding, rng):
  """lax upper-cases padding strings; conv_general_dilated must accept the same spellings."""
  x = cu.randn(rng, (1, 2, 7, 8), np.float32)
  w = cu.randn(rng, (3, 2, 4, 2), np.float32)
  got = jaxconv.conv_general_dilated(jnp.asarray(x), jnp.asarray(w), (1, 2), padding, precision="highest")
  cu.assert_close(got, cu.ref_conv(x, w, window_strides=(1, 2), padding=padding), 1e-5, padding)


def test_stride_and_dilation_forms(rng):
  x = cu.randn(rng, (1, 3, 11, 10), np.float32)
  w = cu.randn(rng, (4, 3, 3, 2), np.float32)
  for stride, dilation in itertools.product([1, 2, (2, 3), [1, 2]], [1, 2, (1, 3), [2, 1]]):
    got = jaxconv.conv2d(jnp.asarray(x), jnp.asarray(w), stride=stride, dilation=dilation,
                         data_format="channels_first", precision="highest")
    want = reference(x, w, None, ns=2, stride=stride, dilation=dilation, data_format="channels_first")
    cu.assert_close(got, want, 1e-5, f"stride={stride} dilation={dilation}")


def test_conv2d_jit_and_bias_none_vs_zero(rng):
  x = jnp.asarray(cu.randn(rng, (2, 6, 6, 3), np.float32))
  w = jnp.asarray(cu.randn(rng, (3, 3, 3, 4), np.float32))
  f = jax.jit(functools.partial(jaxconv.conv2d, padding="SAME", activation="silu", precision="highest"))
  a = f(x, w, None)
  b = f(x, w, jnp.zeros((4,), jnp.float32))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  cu.assert_close(a, reference(x, w, None, ns=2, padding="SAME", activation="silu"), 1e-5)
