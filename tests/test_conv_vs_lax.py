"""jaxconv.conv_general_dilated (and its two gradients) against lax.conv_general_dilated.

Every comparison is against a float64 lax reference computed on CPU from the same rounded inputs (relative L2
error, per-dtype tolerance); shapes and dtypes must equal what lax returns. Each failure message carries the
config dict: `check_fwd(<dict>)` / `check_vjp(<dict>)` reproduces it.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

NATIVE = {ns: (cu._native_dn(ns, True), cu._native_dn(ns, False)) for ns in (1, 2, 3)}


def _ctx(dtype):
  return cu.enable_x64() if str(dtype) == "float64" else contextlib.nullcontext()


def check_fwd(cfg):
  repro = f"repro: check_fwd({cfg!r})"
  lhs, rhs, kw = cu.materialize(cfg)
  with _ctx(cfg["dtype"]):
    want = jax.eval_shape(functools.partial(lax.conv_general_dilated, **kw), lhs, rhs)
    f = jax.jit(functools.partial(jaxconv.conv_general_dilated, **kw))  # one compilation per case
    got = np.asarray(f(jnp.asarray(lhs), jnp.asarray(rhs)))
  assert got.shape == want.shape, f"shape {got.shape} != lax {want.shape}; {repro}"
  assert got.dtype == want.dtype, f"dtype {got.dtype} != lax {want.dtype}; {repro}"
  ref = cu.ref_conv(lhs, rhs, **kw)
  cu.assert_close(got, ref, cu.tolerance(cfg["dtype"], got.dtype), repro)


def check_vjp(cfg):
  """d/dlhs (the dgrad op) and d/drhs (the wgrad op) equal lax's VJP for a random cotangent."""
  repro = f"repro: check_vjp({cfg!r})"
  lhs, rhs, kw = cu.materialize(cfg)
  with _ctx(cfg["dtype"]):
    want = jax.eval_shape(functools.partial(lax.conv_general_dilated, **kw), lhs, rhs)
    rng = np.random.default_rng(cfg["seed"] + 1)
    ct = cu.randn(rng, want.shape, want.dtype)
    f = functools.partial(jaxconv.conv_general_dilated, **kw)

    @jax.jit
    def out_and_vjp(a, b, ct):
      out, vjp = jax.vjp(f, a, b)
      return out, vjp(ct)

    out, (dlhs, drhs) = out_and_vjp(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(ct))
    assert out.shape == want.shape and out.dtype == want.dtype, repro
    dlhs, drhs = np.asarray(dlhs), np.asarray(drhs)
  ref_dlhs, ref_drhs = cu.ref_conv_vjp(lhs, rhs, ct, **kw)
  for name, got, ref, x in (("dlhs (dgrad)", dlhs, ref_dlhs, lhs), ("drhs (wgrad)", drhs, ref_drhs, rhs)):
    assert got.shape == x.shape and got.dtype == x.dtype, f"{name}: {got.shape} {got.dtype}; {repro}"
    cu.assert_close(got, ref, cu.tolerance(cfg["dtype"]), f"{name}; {repro}")


def C(ns, n, c, k, in_, win, **kw):
  return functools.partial(cu.make_cfg, ns, n, c, k, in_, win, **kw)


# Named configurations, one per feature (run in every dtype).
CASES = {
    "nhwc_stride2_same": C(2, 2, 3, 4, [9, 11], [3, 3], strides=[2, 2], padding="SAME",
                           dn=("str", NATIVE[2][0])),
    "nchw_same_lower_even_window": C(2, 2, 3, 5, [8, 7], [4, 2], padding="SAME_LOWER",
                                     dn=("str", NATIVE[2][1])),
    "same_even_window_stride": C(2, 1, 2, 3, [10, 9], [4, 2], strides=[3, 2], padding="SAME",
                                 dn=("str", NATIVE[2][0])),
    "default_dn_valid": C(2, 2, 3, 4, [7, 6], [3, 2]),
    "perm_HWNC": C(2, 2, 3, 4, [7, 9], [3, 2], padding=[[1, 0], [2, 1]], dn=("str", ("HWNC", "OHWI", "CWNH"))),
    "perm_1d_WCN": C(1, 3, 4, 5, [17], [4], strides=[2], padding="SAME", dn=("str", ("WCN", "IWO", "CNW"))),
    "cdn_perm": C(2, 2, 3, 4, [6, 9], [2, 3], padding="SAME", dn=("cdn", ((3, 0, 2, 1), (1, 3, 0, 2), (2, 1, 3, 0)))),
    "cdn_perm_3d": C(3, 2, 3, 2, [4, 5, 6], [2, 1, 3], padding="VALID",
                     dn=("cdn", ((4, 1, 0, 3, 2), (2, 0, 4, 1, 3), (1, 4, 3, 0, 2)))),
    "pad_larger_than_filter": C(2, 2, 3, 4, [5, 6], [2, 3], padding=[[5, 6], [4, 0]]),
    "negative_pad": C(2, 2, 3, 4, [9, 10], [3, 3], padding=[[-1, -2], [0, -3]], dn=("str", NATIVE[2][0])),
    "negative_pad_zero_output": C(1, 2, 3, 4, [5], [1], padding=[[-3, -2]]),
    "lhs_dilation": C(2, 2, 3, 4, [5, 6], [3, 2], strides=[1, 2], lhs_dil=[2, 3], padding=[[1, 2], [2, 0]],
                      dn=("str", NATIVE[2][0])),
    "lhs_dilation_transposed_conv": C(2, 1, 4, 3, [4, 5], [4, 4], lhs_dil=[2, 2], padding=[[2, 2], [2, 2]],
                                      dn=("str", NATIVE[2][1])),
    "rhs_dilation_same": C(2, 2, 3, 4, [11, 12], [3, 2], rhs_dil=[2, 3], padding="SAME", dn=("str", NATIVE[2][0])),
    "all_dilations_1d": C(1, 2, 3, 2, [9], [3], strides=[2], lhs_dil=[3], rhs_dil=[2], padding=[[2, 3]],
                          dn=("str", NATIVE[1][0])),
    "depthwise_nhwc": C(2, 2, 6, 6, [9, 8], [3, 3], padding="SAME", groups=6, dn=("str", NATIVE[2][0])),
    "depthwise_mult2_nchw": C(2, 2, 4, 8, [7, 8], [3, 3], padding="SAME", groups=4, dn=("str", NATIVE[2][1])),
    "depthwise_1d_stride": C(1, 3, 5, 5, [19], [5], strides=[2], padding="SAME_LOWER", groups=5,
                             dn=("str", NATIVE[1][0])),
    "groups3": C(2, 2, 6, 9, [6, 7], [3, 2], groups=3, padding=[[1, 1], [0, 2]], dn=("str", NATIVE[2][0])),
    "groups2_perm": C(2, 2, 4, 6, [6, 7], [2, 2], groups=2, dn=("str", ("HWNC", "OHWI", "CWNH"))),
    "batch_groups2": C(2, 4, 3, 6, [6, 7], [3, 2], batch_groups=2, dn=("str", NATIVE[2][0])),
    "batch_groups3_3d": C(3, 3, 2, 3, [4, 5, 3], [2, 3, 2], batch_groups=3, padding="SAME",
                          dn=("str", NATIVE[3][1])),
    "batch_groups_as_wgrad": C(2, 6, 2, 6, [7, 7], [5, 5], batch_groups=6, strides=[1, 1]),
    "zero_batch": C(2, 0, 3, 4, [5, 5], [3, 3], padding="SAME", dn=("str", NATIVE[2][0])),
    "zero_spatial": C(2, 2, 3, 4, [0, 5], [3, 3], padding="SAME", dn=("str", NATIVE[2][0])),
    "zero_in_channels": C(2, 2, 0, 4, [5, 5], [3, 3], padding="SAME", dn=("str", NATIVE[2][0])),
    "zero_out_channels": C(2, 2, 3, 0, [5, 5], [3, 3], padding="SAME", dn=("str", NATIVE[2][1])),
    "window_larger_than_input_valid": C(2, 2, 3, 4, [2, 5], [3, 3], padding="VALID"),
    "prime_1d_long_window": C(1, 2, 2, 3, [251], [31], padding="SAME", dn=("str", NATIVE[1][0])),
    "prime_1d_long_window_ncw": C(1, 1, 1, 1, [509], [61], padding=[[7, 0]], dn=("str", NATIVE[1][1])),
    "prime_3d": C(3, 1, 3, 5, [7, 5, 11], [3, 2, 3], strides=[2, 1, 3], padding=[[1, 2], [0, 1], [2, 2]],
                  dn=("str", NATIVE[3][0])),
    "window_1x1_many_channels": C(2, 2, 17, 19, [13, 11], [1, 1], dn=("str", NATIVE[2][0])),
    "window_equals_input": C(2, 3, 5, 7, [5, 7], [5, 7], dn=("str", NATIVE[2][1])),
    "stride_larger_than_window": C(2, 2, 3, 4, [13, 17], [2, 2], strides=[4, 5], dn=("str", NATIVE[2][0])),
    "3d_same_strided": C(3, 2, 3, 4, [5, 6, 7], [3, 3, 3], strides=[2, 2, 1], padding="SAME",
                         dn=("str", NATIVE[3][0])),
}


@pytest.mark.parametrize("dtype", cu.DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_named_case_fwd(name, dtype):
  check_fwd(CASES[name](dtype=dtype, seed=cu.seed_of(name, dtype)))


@pytest.mark.parametrize("dtype", cu.DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_named_case_vjp(name, dtype):
  check_vjp(CASES[name](dtype=dtype, seed=cu.seed_of(name, dtype, "vjp")))


@pytest.mark.parametrize("name", ["nhwc_stride2_same", "depthwise_mult2_nchw", "batch_groups2",
                                  "lhs_dilation", "prime_1d_long_window", "3d_same_strided"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_preferred_element_type_f32(name, dtype):
  cfg = CASES[name](dtype=dtype, pref="float32", seed=cu.seed_of(name, dtype, "pref"))
  check_fwd(cfg)
  check_vjp(cfg)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_preferred_element_type_same_dtype(dtype):
  cfg = CASES["groups3"](dtype=dtype, pref=dtype, seed=cu.seed_of("pref_same", dtype))
  check_fwd(cfg)


def test_precision_default_and_none_f32():
  # On CPU every precision is true f32; on GPU DEFAULT may be lower-precision: only check closeness loosely.
  for prec in (None, "DEFAULT", "HIGH"):
    cfg = CASES["nhwc_stride2_same"](dtype="float32", precision=prec, seed=7)
    lhs, rhs, kw = cu.materialize(cfg)
    got = np.asarray(jaxconv.conv_general_dilated(jnp.asarray(lhs), jnp.asarray(rhs), **kw))
    tol = 1e-5 if jax.default_backend() == "cpu" else 1e-2
    cu.assert_close(got, cu.ref_conv(lhs, rhs, **kw), tol, f"precision={prec}")


def test_dimension_numbers_string_equals_cdn():
  """The same convolution expressed with strings and with the equivalent ConvDimensionNumbers agrees."""
  rng = np.random.default_rng(3)
  x = jnp.asarray(cu.randn(rng, (7, 2, 9, 3), np.float32))  # H N W C
  w = jnp.asarray(cu.randn(rng, (4, 2, 3, 3), np.float32))  # O H W I
  strs = ("HNWC", "OHWI", "WCHN")
  cdn = lax.conv_dimension_numbers(x.shape, w.shape, strs)
  kw = dict(window_strides=(1, 2), padding="SAME", precision=lax.Precision.HIGHEST)
  a = jaxconv.conv_general_dilated(x, w, dimension_numbers=strs, **kw)
  b = jaxconv.conv_general_dilated(x, w, dimension_numbers=cdn, **kw)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  cu.assert_close(a, cu.ref_conv(x, w, dimension_numbers=strs, window_strides=(1, 2), padding="SAME"), 1e-5)


def test_padding_given_as_tuples_lists_and_numpy():
  rng = np.random.default_rng(4)
  x = jnp.asarray(cu.randn(rng, (2, 3, 8, 9), np.float32))
  w = jnp.asarray(cu.randn(rng, (4, 3, 3, 2), np.float32))
  ref = cu.ref_conv(x, w, window_strides=(1, 1), padding=[(1, 2), (0, 1)])
  for pad in ([(1, 2), (0, 1)], ((1, 2), (0, 1)), [[1, 2], [0, 1]], np.array([[1, 2], [0, 1]])):
    got = jaxconv.conv_general_dilated(x, w, (1, 1), pad, precision="highest")
    cu.assert_close(got, ref, 1e-5, f"padding={pad!r}")


def _fuzz_params(salt, count):
  return [pytest.param(cfg, id=f"{dtype}-{i:03d}")
          for dtype in cu.DTYPES for i, cfg in enumerate(cu.fuzz_cfgs(dtype, count, salt))]


@pytest.mark.parametrize("cfg", _fuzz_params("fwd", cu.FUZZ_CASES))
def test_fuzz_fwd(cfg):
  check_fwd(cfg)


@pytest.mark.parametrize("cfg", _fuzz_params("vjp", max(1, cu.FUZZ_CASES // 3)))
def test_fuzz_vjp(cfg):
  check_vjp(cfg)


# ---- the three primitives directly (native layouts), against the reference VJP ---------------------------
from jaxconv import primitives as P  # noqa: E402
from jaxconv.spec import ConvSpec  # noqa: E402

PRIM_SPECS = {  # name: (layout, n, c, k, in, window, strides, padding, lhs_dil, rhs_dil, groups, batch_groups)
    "2d_last_plain": ("channels_last", 2, 3, 4, (7, 6), (3, 2), (2, 1), ((1, 1), (0, 2)), (1, 1), (1, 2), 1, 1),
    "2d_first_groups": ("channels_first", 2, 6, 9, (6, 7), (3, 3), (1, 2), ((2, 0), (1, 1)), (1, 1), (1, 1), 3, 1),
    "1d_last_lhs_dil": ("channels_last", 3, 2, 5, (9,), (4,), (2,), ((3, 2),), (2,), (1,), 1, 1),
    "3d_first_batch_groups": ("channels_first", 4, 2, 6, (3, 4, 5), (2, 2, 3), (1, 1, 2), ((0, 1), (1, 0), (-1, 2)),
                              (1, 1, 1), (1, 1, 1), 1, 2),
    "2d_last_depthwise_neg_pad": ("channels_last", 2, 5, 5, (9, 8), (3, 3), (1, 1), ((-1, 1), (1, -2)), (1, 1),
                                  (2, 1), 5, 1),
}


def _spec_and_dn(name):
  layout, n, c, k, in_, win, st, pad, ld, rd, g, b = PRIM_SPECS[name]
  spec = ConvSpec(layout=layout, in_spatial=in_, window=win, strides=st, padding=pad, lhs_dilation=ld,
                  rhs_dilation=rd, feature_groups=g, batch_groups=b, precision="highest")
  ns = len(in_)
  dn = cu._native_dn(ns, layout == "channels_last")
  kw = dict(window_strides=st, padding=[tuple(p) for p in pad], lhs_dilation=ld, rhs_dilation=rd,
            dimension_numbers=dn, feature_group_count=g, batch_group_count=b)
  return spec, kw, (n, c, k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(PRIM_SPECS))
def test_primitives_directly(name, dtype):
  spec, kw, (n, c, k) = _spec_and_dn(name)
  rng = np.random.default_rng(cu.seed_of("prim", name, dtype))
  x = cu.randn(rng, spec.act_shape(n, c, spec.in_spatial), dtype)
  w = cu.randn(rng, spec.filter_shape(k, c // spec.feature_groups), dtype)
  y_shape = spec.act_shape(n // spec.batch_groups, k, spec.out_spatial)
  dy = cu.randn(rng, y_shape, dtype)
  dt = np.dtype(cu.np_dtype(dtype))
  y = jax.jit(lambda x, w: P.conv_fwd(x, w, None, spec, dt))(x, w)
  dx = jax.jit(lambda dy, w: P.conv_dgrad(dy, w, spec, dt))(dy, w)
  dw = jax.jit(lambda x, dy: P.conv_wgrad(x, dy, spec, dt))(x, dy)
  ref_y = cu.ref_conv(x, w, **kw)
  ref_dx, ref_dw = cu.ref_conv_vjp(x, w, dy, **kw)
  tol = cu.tolerance(dtype)
  assert y.shape == y_shape and dx.shape == x.shape and dw.shape == w.shape
  cu.assert_close(y, ref_y, tol, f"fwd {name}")
  cu.assert_close(dx, ref_dx, tol, f"dgrad {name}")
  cu.assert_close(dw, ref_dw, tol, f"wgrad {name}")
  # f32 results from half inputs
  if dtype == "bfloat16":
    dx32 = jax.jit(lambda dy, w: P.conv_dgrad(dy, w, spec, np.float32))(dy, w)
    dw32 = jax.jit(lambda x, dy: P.conv_wgrad(x, dy, spec, np.float32))(x, dy)
    assert dx32.dtype == np.float32 and dw32.dtype == np.float32
    cu.assert_close(dx32, ref_dx, cu.tolerance(dtype, np.float32), f"dgrad f32 {name}")
    cu.assert_close(dw32, ref_dw, cu.tolerance(dtype, np.float32), f"wgrad f32 {name}")
  # The jaxprs bind exactly the primitive asked for.
  names = cu.primitive_names(jax.make_jaxpr(lambda dy, w: P.conv_dgrad(dy, w, spec, dt))(dy, w))
  assert names.count("jaxconv_dgrad") == 1, names
