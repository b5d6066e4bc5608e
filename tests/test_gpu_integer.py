"""The integer family (csrc/kernels/integer/): integer.direct (every integer and bool configuration) and integer.mma_s8
(int8 operands, int32 accumulation on tensor cores).

`kernels` tests ask the registry's host predicates (a CUDA build, no GPU needed): which variant each problem gets,
that no float variant takes integer operands and no integer variant float ones. `gpu` tests run the kernels, each
forced by name, against the exact numpy reference (products and sums modulo 2^64, truncated: conv_utils.ref_conv_int).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conv_utils as cu
import jaxconv
from jaxconv import registry
from jaxconv.spec import ConvSpec


def _params(layout="channels_last", in_spatial=(9, 11), window=(3, 3), strides=(1, 1), padding=((1, 1), (1, 1)),
            groups=1, n=2, c=32, k=64, **kw):
  spec = ConvSpec(layout=layout, in_spatial=in_spatial, window=window, strides=strides, padding=padding,
                  lhs_dilation=(1,) * len(in_spatial), rhs_dilation=(1,) * len(in_spatial), feature_groups=groups, **kw)
  return spec.ffi_params(n, c, k)


INTEGER_VARIANTS = ("integer.mma_s8", "integer.direct")


@pytest.mark.kernels
@pytest.mark.parametrize("dtype,out,params,want", [
    ("int8", "int32", _params(), "integer.mma_s8"),
    ("int8", "int8", _params(), "integer.mma_s8"),
    ("int8", "int32", _params(c=24), "integer.direct"),             # c not a multiple of 16
    ("int8", "int32", _params(k=40), "integer.direct"),             # k not a multiple of 16
    ("int8", "int32", _params(layout="channels_first"), "integer.direct"),
    ("int8", "int32", _params(groups=2), "integer.direct"),
    ("uint8", "int32", _params(), "integer.direct"),
    ("int16", "int16", _params(), "integer.direct"),
    ("int64", "int64", _params(), "integer.direct"),
    ("bool", "bool", _params(), "integer.direct"),
])
def test_auto_choice(dtype, out, params, want):
  choice = registry.resolve("fwd", params, dtype, out)
  assert choice.name == want, choice


@pytest.mark.kernels
def test_no_float_variant_takes_integers_and_no_integer_variant_floats():
  p = _params()
  fwd_variants = {v.name for v in registry.variants() if "fwd" in v.ops}
  for name, why, _ in registry.explain("fwd", p, "int8", "int32"):
    if name in fwd_variants and name not in INTEGER_VARIANTS:  # the others say they have no forward kernel
      assert "takes no int8 operands" in why, (name, why)
  for name, why, _ in registry.explain("fwd", p, "float32", "float32"):
    if name in INTEGER_VARIANTS:
      assert "takes no float32 operands" in why, (name, why)
  assert registry.resolve("fwd", p, "float32", "float32").name not in INTEGER_VARIANTS
  for v in registry.variants():
    assert (set(v.dtypes) <= {"float32", "float64", "bfloat16", "float16"}) != (v.family == "integer"), v


@pytest.mark.kernels
def test_integer_gradients_have_no_variant():
  assert not registry.resolve("dgrad", _params(), "int8", "int32").ok
  assert not registry.resolve("wgrad", _params(), "int8", "int32").ok


# ---- on the GPU -----------------------------------------------------------------------------------------------

def _rand_int(rng, shape, dtype):
  dtype = np.dtype(dtype)
  if dtype == np.dtype(bool):
    return rng.integers(0, 2, shape).astype(bool)
  info = np.iinfo(dtype)
  return rng.integers(int(info.min), int(info.max), shape, endpoint=True,
                      dtype=np.int64 if info.min < 0 else np.uint64).astype(dtype)


def _check(rng, conv, nsp, x_shape, w_shape, dtype, pref, algorithm, data_format="channels_last", **kw):
  x, w = _rand_int(rng, x_shape, dtype), _rand_int(rng, w_shape, dtype)
  with jax.default_device(jax.devices("gpu")[0]):
    got = conv(jnp.asarray(x), jnp.asarray(w), algorithm=algorithm, preferred_element_type=pref,
               data_format=data_format, **kw)
  dn = cu.channels_last_dn(nsp) if data_format == "channels_last" else None
  ref = cu.ref_conv_int(x, w, np.dtype(pref or dtype), window_strides=_tup(kw.get("stride", 1), nsp),
                        padding=_pads(kw.get("padding", "VALID"), nsp), rhs_dilation=_tup(kw.get("dilation", 1), nsp),
                        dimension_numbers=dn, feature_group_count=kw.get("groups", 1))
  np.testing.assert_array_equal(np.asarray(got), ref)


def _tup(v, nsp):
  return (v,) * nsp if isinstance(v, int) else tuple(v)


def _pads(padding, nsp):
  if isinstance(padding, str):
    return padding
  if isinstance(padding, int):
    return [(padding, padding)] * nsp
  return [tuple(p) for p in padding]


@pytest.mark.gpu
@pytest.mark.parametrize("pref", [jnp.int32, None])
@pytest.mark.parametrize("case", [
    dict(nsp=2, x=(3, 13, 11, 32), w=(3, 3, 32, 48), kw=dict(padding="SAME")),
    dict(nsp=2, x=(2, 17, 9, 64), w=(5, 3, 64, 16), kw=dict(stride=(2, 1), padding=[(2, -1), (0, 3)],
                                                          dilation=(1, 2))),
    dict(nsp=1, x=(5, 67, 16), w=(7, 16, 80), kw=dict(padding=3)),
    dict(nsp=3, x=(2, 5, 7, 6, 16), w=(3, 2, 3, 16, 32), kw=dict(stride=2, padding="SAME")),
    dict(nsp=2, x=(1, 1, 1, 48), w=(1, 1, 48, 16), kw=dict()),
])
def test_mma_s8_exact(case, pref, rng):
  conv = {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}[case["nsp"]]
  _check(rng, conv, case["nsp"], case["x"], case["w"], np.int8, pref, "integer.mma_s8", **case["kw"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,pref", [("int8", None), ("int8", "int32"), ("int16", None), ("int32", None),
                                        ("uint8", "int8"), ("uint16", "uint32"), ("uint32", None), ("bool", None),
                                        ("bool", "int32")])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_direct_exact(dtype, pref, data_format, rng):
  x_shape, w_shape = ((3, 11, 7, 6), (3, 2, 3, 10)) if data_format == "channels_last" else ((3, 6, 11, 7),
                                                                                          (10, 3, 3, 2))
  _check(rng, jaxconv.conv2d, 2, x_shape, w_shape, dtype, pref, "integer.direct", data_format=data_format,
         stride=(2, 1), padding=[(2, -1), (1, 3)], dilation=(1, 2), groups=2)


@pytest.mark.gpu
def test_direct_64_bit_and_lhs_dilation(rng):
  with cu.enable_x64():
    x, w = _rand_int(rng, (2, 9, 5), np.int64), _rand_int(rng, (3, 5, 4), np.int64)
    kw = dict(window_strides=(2,), padding=[(3, -1)], lhs_dilation=(3,), rhs_dilation=(2,),
              dimension_numbers=("NWC", "WIO", "NWC"))
    with jax.default_device(jax.devices("gpu")[0]):
      got = jaxconv.conv_general_dilated(jnp.asarray(x), jnp.asarray(w), **kw)
    np.testing.assert_array_equal(np.asarray(got), cu.ref_conv_int(x, w, np.int64, **kw))
