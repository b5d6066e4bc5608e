"""0-D convolutions (no spatial dimensions, e.g. dimension_numbers=("NC", "IO", "NC")): lax takes them as a matrix
product per group; jaxconv runs them as 1-D convolutions over a size-1 spatial dim. Values and gradients against a
float64 reference and lax, every layout of the three specs, feature and batch groups, jit and vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv


def _operands(rng, lhs_spec, rhs_spec, n, c, k, groups=1, dtype=np.float32):
  lhs_shape = (n, c) if lhs_spec == "NC" else (c, n)
  rhs_shape = (k, c // groups) if rhs_spec == "OI" else (c // groups, k)
  return cu.randn(rng, lhs_shape, dtype), cu.randn(rng, rhs_shape, dtype)


# Each spec of the three flipped at least once, and all three together.
SPECS = [("NC", "OI", "NC"), ("CN", "IO", "CN"), ("NC", "IO", "CN"), ("CN", "OI", "NC")]


@pytest.mark.parametrize("dn", SPECS, ids=lambda d: ",".join(d))
@pytest.mark.parametrize("groups,batch_groups", [(1, 1), (3, 1), (1, 3)])
def test_values_and_gradients(dn, groups, batch_groups, rng):
  n, c, k = 6, 9, 6  # n, c and k multiples of the group counts
  x, w = _operands(rng, dn[0], dn[1], n, c, k, groups)
  kw = dict(window_strides=(), padding=(), dimension_numbers=dn, feature_group_count=groups,
            batch_group_count=batch_groups)
  f = lambda conv: jax.jit(lambda a, b: conv(a, b, precision="highest", **kw))
  got, want = f(jaxconv.conv_general_dilated)(x, w), f(lax.conv_general_dilated)(x, w)
  assert got.shape == want.shape and got.dtype == want.dtype
  # The reference: the same product as a 1-D convolution of size-1 spatial dims, in float64.
  dn1 = tuple(s + "W" for s in dn)
  ref = cu.ref_conv(x[..., None], w[..., None], window_strides=(1,), padding=[(0, 0)], dimension_numbers=dn1,
                    feature_group_count=groups, batch_group_count=batch_groups)[..., 0]
  assert cu.rel_l2(got, ref) < 1e-6
  ct = cu.randn(rng, want.shape, np.float32)
  g_got = jax.vjp(f(jaxconv.conv_general_dilated), x, w)[1](ct)
  g_want = jax.vjp(f(lax.conv_general_dilated), x, w)[1](ct)
  for a, b in zip(g_got, g_want):
    assert a.shape == b.shape and cu.rel_l2(a, b) < 1e-6


@pytest.mark.parametrize("padding", ["SAME", "VALID", []])
def test_padding_forms_and_no_spatial_args(padding, rng):
  x, w = _operands(rng, "NC", "IO", 5, 7, 3)
  kw = dict(window_strides=[], padding=padding, lhs_dilation=(), rhs_dilation=(), dimension_numbers=("NC", "IO", "NC"))
  got = jaxconv.conv_general_dilated(x, w, **kw)
  np.testing.assert_allclose(np.asarray(got), cu.f64(x) @ cu.f64(w), rtol=1e-5, atol=1e-5)


def test_default_dimension_numbers_and_integers(rng):
  # dimension_numbers=None on rank-2 operands is ("NC", "OI", "NC"); integers wrap as lax's do.
  x = rng.integers(-128, 127, (4, 11), endpoint=True).astype(np.int8)
  w = rng.integers(-128, 127, (5, 11), endpoint=True).astype(np.int8)
  got = jaxconv.conv_general_dilated(x, w, (), ())
  want = cu.on_cpu(lambda a, b: lax.conv_general_dilated(a, b, (), ()))(x, w)
  assert got.dtype == want.dtype == np.int8
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(got), (x.astype(np.int64) @ w.T.astype(np.int64)).astype(np.int8))


def test_vmap_and_second_order(rng):
  x, w = _operands(rng, "NC", "IO", 3, 5, 4)
  xs = cu.randn(rng, (7, 3, 5), np.float32)
  kw = dict(window_strides=(), padding="VALID", dimension_numbers=("NC", "IO", "NC"), precision="highest")
  per = lambda conv: jax.vmap(lambda a: conv(a, w, **kw))
  assert cu.rel_l2(per(jaxconv.conv_general_dilated)(xs), per(lax.conv_general_dilated)(xs)) < 1e-6
  hess = lambda conv: jax.hessian(lambda b: jnp.sum(jnp.tanh(conv(x, b, **kw))))(w)
  assert cu.rel_l2(hess(jaxconv.conv_general_dilated), hess(lax.conv_general_dilated)) < 1e-5


def test_errors_name_the_argument():
  x, w = jnp.ones((3, 4)), jnp.ones((4, 5))
  with pytest.raises(ValueError, match="window_strides"):
    jaxconv.conv_general_dilated(x, w, (1,), (), dimension_numbers=("NC", "IO", "NC"))
  with pytest.raises(TypeError, match="explicit pads"):
    jaxconv.conv_general_dilated(x, w, (), [(0, 0)], dimension_numbers=("NC", "IO", "NC"))
