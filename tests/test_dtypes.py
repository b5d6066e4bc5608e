"""Every dtype lax.conv_general_dilated takes, with lax's result types and XLA:CPU's semantics.

Integers and bool: exact, against lax and against an independent numpy reference that sums modulo 2^64 and truncates
(wraparound). Complex: three real convolutions, values and gradients against lax. 8- and 4-bit floats: bit for bit
against lax (XLA:CPU widens them to float16). preferred_element_type: lax's rules, its canonicalisation with x64 off,
and the strict dtype-promotion mode under differentiation.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

NHWC = ("NHWC", "HWIO", "NHWC")
# Odd and prime sizes, strides, dilation, asymmetric and negative padding, two feature groups.
GEOMETRY = dict(window_strides=(2, 1), padding=[(2, -1), (1, 3)], rhs_dilation=(1, 2), dimension_numbers=NHWC,
                feature_group_count=2)
X_SHAPE, W_SHAPE = (3, 11, 7, 6), (3, 2, 3, 10)


def _rand_int(rng, shape, dtype):
  """Values over the whole range of the type (so that sums overflow and wrap), never all zeros."""
  dtype = np.dtype(dtype)
  if dtype == np.dtype(bool):
    return rng.integers(0, 2, shape).astype(bool)
  info = np.iinfo(dtype)
  return rng.integers(int(info.min), int(info.max), shape, endpoint=True, dtype=np.int64 if info.min < 0
                      else np.uint64).astype(dtype)


def _both(x, w, **kw):
  args = dict(GEOMETRY, **kw)
  want = cu.on_cpu(lambda a, b: lax.conv_general_dilated(a, b, **args))(x, w)
  return want, jaxconv.conv_general_dilated(x, w, **args)


INT_CASES = [  # (operand dtype, preferred_element_type): every pair lax accepts among these
    ("int8", None), ("int16", None), ("int32", None), ("uint8", None), ("uint16", None), ("uint32", None),
    ("int8", "int32"), ("int8", "int16"), ("int16", "int32"), ("uint8", "int8"), ("uint8", "int32"),
    ("uint8", "uint16"), ("uint16", "int32"), ("uint32", "int32"),
    ("bool", None), ("bool", "int32"), ("bool", "uint8"), ("bool", "int8"),
]


@pytest.mark.parametrize("dtype,pref", INT_CASES)
def test_integer_and_bool_exact(dtype, pref, rng):
  x, w = _rand_int(rng, X_SHAPE, dtype), _rand_int(rng, W_SHAPE, dtype)
  want, got = _both(x, w, preferred_element_type=pref)
  out = np.dtype(dtype if pref is None else pref)
  assert got.dtype == want.dtype == out
  ref = cu.ref_conv_int(x, w, out, **GEOMETRY)
  np.testing.assert_array_equal(np.asarray(got), ref)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  if dtype != "bool" and out.itemsize <= 2:
    # The exact sums leave the type's range somewhere: the case exercises the wraparound.
    exact = cu.ref_conv_int(x, w, np.int64, **GEOMETRY)
    assert np.any(exact != ref.astype(np.int64))


@pytest.mark.parametrize("dtype,pref", [("int64", None), ("uint64", None), ("int32", "int64"), ("uint8", "uint64")])
def test_64_bit_integers(dtype, pref, rng, x64):
  x, w = _rand_int(rng, X_SHAPE, dtype), _rand_int(rng, W_SHAPE, dtype)
  want, got = _both(jnp.asarray(x), jnp.asarray(w), preferred_element_type=pref)
  assert got.dtype == want.dtype == np.dtype(pref or dtype)
  np.testing.assert_array_equal(np.asarray(got), cu.ref_conv_int(x, w, got.dtype, **GEOMETRY))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_int64_operands_are_int32_without_x64(rng):
  # With x64 off, jnp.asarray makes int64 data int32 and lax returns int32: so does jaxconv.
  x, w = _rand_int(rng, X_SHAPE, np.int64), _rand_int(rng, W_SHAPE, np.int64)
  want, got = _both(x, w)
  assert got.dtype == want.dtype == np.int32
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype", ["int4", "uint4"])
def test_4_bit_integers(dtype, rng):
  dt = np.dtype(getattr(ml_dtypes, dtype))
  lo, hi = (-8, 7) if dtype == "int4" else (0, 15)
  x = jnp.asarray(rng.integers(lo, hi, X_SHAPE, endpoint=True)).astype(dt)
  w = jnp.asarray(rng.integers(lo, hi, W_SHAPE, endpoint=True)).astype(dt)
  want, got = _both(x, w)
  assert got.dtype == want.dtype == dt
  np.testing.assert_array_equal(np.asarray(got.astype(jnp.int8)), np.asarray(want.astype(jnp.int8)))


@pytest.mark.parametrize("dtype,pref", [("int8", "float32"), ("uint16", "float32"), ("int8", "bfloat16"),
                                        ("int8", "float16"), ("bool", "float32"), ("bool", "complex64")])
def test_integer_operands_floating_result(dtype, pref, rng):
  # The operands are converted to the result type, as XLA converts them; small values keep every sum exact.
  x = _rand_int(rng, X_SHAPE, dtype) % 7 if dtype != "bool" else _rand_int(rng, X_SHAPE, dtype)
  w = _rand_int(rng, W_SHAPE, dtype) % 5 if dtype != "bool" else _rand_int(rng, W_SHAPE, dtype)
  want, got = _both(x, w, preferred_element_type=pref)
  assert got.dtype == want.dtype == np.dtype(pref)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(got).real, cu.ref_conv_int(x, w, np.int64, **GEOMETRY))


def test_integer_vmap_matches_lax(rng):
  x, w = _rand_int(rng, (4, *X_SHAPE), np.int8), _rand_int(rng, (4, *W_SHAPE), np.int8)
  f = lambda conv: jax.vmap(lambda a, b: conv(a, b, **GEOMETRY))
  np.testing.assert_array_equal(np.asarray(f(jaxconv.conv_general_dilated)(x, w)),
                                np.asarray(cu.on_cpu(f(lax.conv_general_dilated))(x, w)))


def test_integer_gradients_refused_as_lax_refuses(rng):
  x, w = _rand_int(rng, X_SHAPE, np.int8), _rand_int(rng, W_SHAPE, np.int8)
  for conv in (lax.conv_general_dilated, jaxconv.conv_general_dilated):
    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
      jax.grad(lambda a: jnp.sum(conv(a, w, **GEOMETRY).astype(jnp.float32)))(x)


def _rand_complex(rng, shape, dtype):
  return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_values_and_gradients(dtype, rng, x64):
  x, w = _rand_complex(rng, X_SHAPE, dtype), _rand_complex(rng, W_SHAPE, dtype)
  want, got = _both(x, w, precision="highest")
  assert got.dtype == want.dtype == np.dtype(dtype)
  ref = cu.ref_conv(x.real, w.real, **GEOMETRY) - cu.ref_conv(x.imag, w.imag, **GEOMETRY) + 1j * (
      cu.ref_conv(x.real, w.imag, **GEOMETRY) + cu.ref_conv(x.imag, w.real, **GEOMETRY))
  tol = 1e-5 if dtype == "complex64" else 1e-12
  assert cu.rel_l2(np.asarray(got).real, ref.real) < tol and cu.rel_l2(np.asarray(got).imag, ref.imag) < tol

  def loss(conv):  # a real loss of a complex convolution: its gradient is the conjugate cotangent lax defines
    return lambda a, b: jnp.sum(jnp.abs(jnp.sin(conv(a, b, precision="highest", **GEOMETRY))) ** 2)

  g_want = cu.on_cpu(jax.grad(loss(lax.conv_general_dilated), (0, 1)))(x, w)
  g_got = jax.grad(loss(jaxconv.conv_general_dilated), (0, 1))(x, w)
  for a, b in zip(g_got, g_want):
    assert a.dtype == b.dtype == np.dtype(dtype)
    a, b = np.asarray(a), np.asarray(b)
    assert cu.rel_l2(a.real, b.real) < 10 * tol and cu.rel_l2(a.imag, b.imag) < 10 * tol


def test_complex_preferred_complex128(rng, x64):
  x, w = _rand_complex(rng, X_SHAPE, np.complex64), _rand_complex(rng, W_SHAPE, np.complex64)
  want, got = _both(x, w, preferred_element_type=jnp.complex128)
  assert got.dtype == want.dtype == np.complex128
  got, want = np.asarray(got), np.asarray(want)
  assert cu.rel_l2(got.real, want.real) < 1e-12 and cu.rel_l2(got.imag, want.imag) < 1e-12


NARROW_FLOATS = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
                 "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float4_e2m1fn"]


@pytest.mark.parametrize("dtype", [d for d in NARROW_FLOATS if hasattr(ml_dtypes, d)])
@pytest.mark.parametrize("pref", [None, "float32", "bfloat16"])
def test_narrow_floats_bit_for_bit(dtype, pref, rng):
  dt = np.dtype(getattr(ml_dtypes, dtype))
  if dtype == "float4_e2m1fn" and pref is not None:
    pytest.skip("XLA:CPU cannot compile lax's float4 convolution with a float32 result")
  scale = 4.0 if dtype == "float8_e8m0fnu" else 1.0  # e8m0 holds positive powers of two only
  x = np.abs(rng.standard_normal(X_SHAPE) * scale) if scale != 1.0 else rng.standard_normal(X_SHAPE)
  w = np.abs(rng.standard_normal(W_SHAPE) * scale) if scale != 1.0 else rng.standard_normal(W_SHAPE)
  x, w = jnp.asarray(x, jnp.float32).astype(dt), jnp.asarray(w, jnp.float32).astype(dt)
  want, got = _both(x, w, preferred_element_type=pref)
  assert got.dtype == want.dtype == np.dtype(pref or dt)
  a, b = np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32))
  np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
  a, b = a[~np.isnan(a)], b[~np.isnan(b)]
  if pref == "float32" and jax.default_backend() != "cpu":
    # A float32 result keeps the last bit of the summation order, which the GPU kernels choose unlike XLA:CPU.
    np.testing.assert_allclose(a, b, rtol=5e-7, atol=1e-6 * float(np.abs(b).max()))
  else:
    np.testing.assert_array_equal(a, b)
  assert np.count_nonzero(a) > a.size // 4  # fresh data, not a degenerate all-zero result


@pytest.mark.parametrize("pref", [None, "float32", "bfloat16"])
def test_narrow_float_gradients_match_lax(pref, rng):
  dt = jnp.float8_e4m3fn
  x = jnp.asarray(rng.standard_normal(X_SHAPE), jnp.float32).astype(dt)
  w = jnp.asarray(rng.standard_normal(W_SHAPE), jnp.float32).astype(dt)
  loss = lambda conv: lambda a, b: jnp.sum(jnp.sin(conv(a, b, preferred_element_type=pref, **GEOMETRY).astype(
      jnp.float32)))
  for a, b in zip(jax.grad(loss(jaxconv.conv_general_dilated), (0, 1))(x, w),
                  cu.on_cpu(jax.grad(loss(lax.conv_general_dilated), (0, 1)))(x, w)):
    assert a.dtype == b.dtype == dt
    np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))


def test_preferred_float64_without_x64_is_float32_as_lax(rng):
  x, w = cu.randn(rng, X_SHAPE, np.float32), cu.randn(rng, W_SHAPE, np.float32)
  results = []
  for conv in (lax.conv_general_dilated, jaxconv.conv_general_dilated):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      y = jax.jit(lambda a, b: conv(a, b, preferred_element_type=jnp.float64, precision="highest",
                                    **GEOMETRY))(x, w)
    assert y.dtype == np.float32
    assert any("float64" in str(c.message) and "not available" in str(c.message) for c in caught), conv
    results.append(np.asarray(y))
  assert cu.rel_l2(results[1], results[0]) < 1e-6
  assert cu.rel_l2(results[1], cu.ref_conv(x, w, **GEOMETRY)) < 1e-6


@pytest.mark.parametrize("in_dtype,pref,match", [
    ("float32", "int32", "incompatible"), ("float32", "bfloat16", "narrower"), ("int8", "uint8", "signedness"),
    ("int16", "int8", "narrower"), ("complex64", "float32", "incompatible"), ("int8", "bool", "incompatible")])
def test_preferred_element_type_errors_as_lax(in_dtype, pref, match):
  x, w = jnp.ones(X_SHAPE, in_dtype), jnp.ones(W_SHAPE, in_dtype)
  for conv in (lax.conv_general_dilated, jaxconv.conv_general_dilated):
    with pytest.raises(TypeError, match=match):
      jax.eval_shape(lambda a, b: conv(a, b, preferred_element_type=pref, **GEOMETRY), x, w)


def test_strict_promotion_gradient_of_bf16_with_float32_result(rng):
  # The transposes meet a float32 cotangent with a bfloat16 operand: lax takes it under 'strict' promotion.
  x, w = cu.randn(rng, X_SHAPE, jnp.bfloat16), cu.randn(rng, W_SHAPE, jnp.bfloat16)
  loss = lambda conv: lambda a, b: jnp.sum(jnp.sin(conv(a, b, preferred_element_type=jnp.float32, **GEOMETRY)))
  with jax.numpy_dtype_promotion("strict"):
    want = jax.grad(loss(lax.conv_general_dilated), (0, 1))(x, w)
    got = jax.grad(loss(jaxconv.conv_general_dilated), (0, 1))(x, w)
  for a, b in zip(got, want):
    assert a.dtype == b.dtype == jnp.bfloat16
    assert cu.rel_l2(a, b) < 2e-2
