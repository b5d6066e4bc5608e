"""Derivatives of any order: numerical checks in float64 and the structure of the differentiated programs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import jax.test_util as jtu
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

pytestmark = pytest.mark.usefixtures("x64")


def _arrays(rng, *shapes, dtype=np.float64):
  return [jnp.asarray(rng.standard_normal(s).astype(dtype)) for s in shapes]


# (lhs shape, rhs shape, kwargs) in float64; small so that order-2 numerical checks stay fast.
GRAD_CASES = {
    "2d_nhwc_stride_same": ((2, 5, 6, 3), (3, 2, 3, 4),
                            dict(window_strides=(2, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "2d_nchw_groups": ((2, 4, 5, 5), (6, 2, 3, 2),
                       dict(window_strides=(1, 2), padding=[(1, 0), (2, 1)], feature_group_count=2)),
    "2d_depthwise": ((1, 5, 6, 3), (3, 3, 1, 3),
                     dict(window_strides=(1, 1), padding="SAME_LOWER", feature_group_count=3,
                          dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "2d_batch_groups": ((4, 2, 5, 4), (4, 2, 2, 3),
                        dict(window_strides=(1, 1), padding="VALID", batch_group_count=2)),
    "1d_lhs_dilation_stride": ((2, 3, 5), (2, 3, 3),
                               dict(window_strides=(2,), padding=[(2, 1)], lhs_dilation=(2,), rhs_dilation=(1,))),
    "1d_rhs_dilation_negative_pad": ((2, 2, 11), (3, 2, 3),
                                     dict(window_strides=(1,), padding=[(-1, 2)], rhs_dilation=(2,))),
    "3d_perm": ((3, 4, 2, 2, 3), (2, 3, 3, 2, 2),
                dict(window_strides=(1, 2, 1), padding="SAME", dimension_numbers=("DHNWC", "DIHWO", "NCDHW"))),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_check_grads_conv_general_dilated(name, rng):
  lhs_shape, rhs_shape, kw = GRAD_CASES[name]
  x, w = _arrays(rng, lhs_shape, rhs_shape)
  f = jax.jit(functools.partial(jaxconv.conv_general_dilated, precision=lax.Precision.HIGHEST, **kw))
  jtu.check_grads(f, (x, w), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("name", ["2d_nchw_groups", "2d_batch_groups", "1d_lhs_dilation_stride"])
def test_second_derivative_matches_lax(name, rng):
  """Hessian-vector products of a scalar loss agree with the same loss built on lax (float32: XLA:CPU
  compiles float64 convolutions slowly)."""
  lhs_shape, rhs_shape, kw = GRAD_CASES[name]
  x, w = _arrays(rng, lhs_shape, rhs_shape, dtype=np.float32)
  tx, tw = _arrays(rng, lhs_shape, rhs_shape, dtype=np.float32)

  def loss(conv, x, w):
    return jnp.sum(jnp.tanh(conv(x, w, precision=lax.Precision.HIGHEST, **kw)) ** 2)

  def hvp(conv):
    g = jax.grad(functools.partial(loss, conv), argnums=(0, 1))
    return jax.jit(lambda x, w: jax.jvp(g, (x, w), (tx, tw))[1])(x, w)

  got = hvp(jaxconv.conv_general_dilated)
  want = hvp(lax.conv_general_dilated)
  for a, b in zip(got, want):
    cu.assert_close(a, b, 2e-5, name)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_check_grads_conv2d_bias_activation(activation, data_format, rng):
  if data_format == "channels_last":
    xs, ws = (2, 5, 6, 4), (3, 2, 2, 6)
  else:
    xs, ws = (2, 4, 5, 6), (6, 2, 3, 2)
  dn = ("NHWC", "HWIO", "NHWC") if data_format == "channels_last" else ("NCHW", "OIHW", "NCHW")
  for _ in range(100):
    x, w, b = _arrays(rng, xs, ws, (6,))
    pre = cu.ref_conv(x, w, window_strides=(1, 2), padding="SAME", dimension_numbers=dn, feature_group_count=2)
    pre = pre + (np.asarray(b) if data_format == "channels_last" else np.asarray(b)[:, None, None])
    # relu has a kink at 0: use data whose pre-activations stay far from 0 compared with the finite-difference
    # step (check_grads perturbs by 1e-4 along random directions), so the numerical check is well posed.
    if activation != "relu" or np.min(np.abs(pre)) > 2e-2:
      break
  else:
    pytest.fail("no well-posed data found for relu")
  f = jax.jit(lambda x, w, b: jaxconv.conv2d(x, w, b, stride=(1, 2), padding="SAME", groups=2,
                                             activation=activation, data_format=data_format, precision="highest"))
  jtu.check_grads(f, (x, w, b), order=2, modes=("fwd", "rev"))
  want = jax.nn.relu(pre) if activation == "relu" else None
  if want is not None:
    cu.assert_close(f(x, w, b), want, 1e-12)


def _grad_grad_fn(conv_fn):
  def loss(x, w):
    return jnp.sum(jnp.sin(conv_fn(x, w)))

  g = jax.grad(loss, argnums=(0, 1))

  def g2(x, w):
    dx, dw = g(x, w)
    return jnp.sum(dx ** 2) + jnp.sum(jnp.cos(dw))

  return g, jax.grad(g2, argnums=(0, 1))


JAXPR_CONVS = {
    "conv_general_dilated_groups": lambda x, w: jaxconv.conv_general_dilated(
        x, w, (2, 1), [(1, 1), (0, 2)], rhs_dilation=(1, 2), feature_group_count=2,
        dimension_numbers=("NHWC", "HWIO", "NHWC")),
    "conv_general_dilated_batch_groups": lambda x, w: jaxconv.conv_general_dilated(
        x, w, (1, 1), "SAME", batch_group_count=2, dimension_numbers=("NHWC", "HWIO", "NHWC")),
    "conv_general_dilated_lhs_dil": lambda x, w: jaxconv.conv_general_dilated(
        x, w, (1, 1), [(1, 1), (2, 0)], lhs_dilation=(2, 2), dimension_numbers=("NHWC", "HWIO", "NHWC")),
    "conv2d_bias_gelu": lambda x, w: jaxconv.conv2d(x, w, jnp.ones((w.shape[-1],), x.dtype), stride=2,
                                                    padding="SAME", activation="gelu"),
}


@pytest.mark.parametrize("name", sorted(JAXPR_CONVS))
def test_higher_order_jaxprs_use_only_jaxconv_primitives(name):
  conv = JAXPR_CONVS[name]
  x = jnp.ones((4, 6, 7, 4))
  w = jnp.ones((3, 3, 2 if "groups" in name and "batch" not in name else 4, 4))
  g, gg = _grad_grad_fn(conv)
  programs = {
      "grad": jax.make_jaxpr(g)(x, w),
      "grad_of_grad": jax.make_jaxpr(gg)(x, w),
      "jvp_of_grad": jax.make_jaxpr(lambda x, w: jax.jvp(g, (x, w), (x, w)))(x, w),
      "jit_grad_of_grad": jax.make_jaxpr(jax.jit(gg))(x, w),
  }
  for what, jaxpr in programs.items():
    names = cu.primitive_names(jaxpr)
    assert "conv_general_dilated" not in names, f"{what}: lax convolution in {sorted(set(names))}"
    others = sorted(set(cu.conv_like(names)) - set(cu.JAXCONV_PRIMS))
    assert not others, f"{what}: unexpected convolution primitives {others}"
    assert "jaxconv_dgrad" in names and "jaxconv_wgrad" in names, f"{what}: {sorted(set(names))}"
    if what != "grad":
      assert "jaxconv_fwd" in names, f"{what}: {sorted(set(names))}"


def test_hessian_jaxpr_and_value(rng):
  """jax.hessian (jacfwd of jacrev: vmap + jvp + transpose) stays on jaxconv primitives and matches lax."""
  x, w = _arrays(rng, (1, 3, 4, 2), (2, 2, 2, 2), dtype=np.float32)
  kw = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=lax.Precision.HIGHEST)

  def loss(conv, w):
    return jnp.sum(jnp.tanh(conv(x, w, **kw)))

  h = jax.hessian(functools.partial(loss, jaxconv.conv_general_dilated))
  names = cu.primitive_names(jax.make_jaxpr(h)(w))
  assert "conv_general_dilated" not in names
  assert not set(cu.conv_like(names)) - set(cu.JAXCONV_PRIMS), sorted(set(names))
  want = jax.jit(jax.hessian(functools.partial(loss, lax.conv_general_dilated)))(w)
  cu.assert_close(jax.jit(h)(w), want, 2e-5)


def test_grad_wrt_bias_only_and_activation_only(rng):
  """Partial derivatives: only bias, only x, only w, each against the lax + jax.nn reference."""
  x, w, b = _arrays(rng, (2, 7, 3), (3, 3, 5), (5,), dtype=np.float32)

  def ours(x, w, b):
    return jnp.sum(jaxconv.conv1d(x, w, b, padding="SAME", activation="silu", precision="highest") ** 2)

  def ref(x, w, b):
    y = lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"),
                                 precision=lax.Precision.HIGHEST)
    return jnp.sum(jax.nn.silu(y + b) ** 2)

  for argnums in (0, 1, 2, (0, 2)):
    got = jax.jit(jax.grad(ours, argnums=argnums))(x, w, b)
    want = jax.jit(jax.grad(ref, argnums=argnums))(x, w, b)
    for a, c in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      cu.assert_close(a, c, 2e-5, f"argnums={argnums}")


@pytest.mark.parametrize("op", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("name", ["2d_first_groups", "1d_last_lhs_dil", "3d_first_batch_groups"])
def test_check_grads_each_primitive(op, name):
  """Every primitive is differentiable to second order in both modes (its JVP/transpose rules)."""
  from test_conv_vs_lax import _spec_and_dn
  from jaxconv import primitives as P
  spec, _, (n, c, k) = _spec_and_dn(name)
  rng = np.random.default_rng(cu.seed_of("cg", op, name))
  x = jnp.asarray(rng.standard_normal(spec.act_shape(n, c, spec.in_spatial)))
  w = jnp.asarray(rng.standard_normal(spec.filter_shape(k, c // spec.feature_groups)))
  dy = jnp.asarray(rng.standard_normal(spec.act_shape(n // spec.batch_groups, k, spec.out_spatial)))
  f64 = np.dtype(np.float64)
  fns = {"fwd": (lambda a, b: P.conv_fwd(a, b, None, spec, f64), (x, w)),
         "dgrad": (lambda a, b: P.conv_dgrad(a, b, spec, f64), (dy, w)),
         "wgrad": (lambda a, b: P.conv_wgrad(a, b, spec, f64), (x, dy))}
  f, args = fns[op]
  jtu.check_grads(jax.jit(f), args, order=2, modes=("fwd", "rev"))
  names = cu.primitive_names(jax.make_jaxpr(jax.grad(lambda a, b: jnp.sum(jnp.sin(f(a, b))), argnums=(0, 1)))(*args))
  assert not set(cu.conv_like(names)) - set(cu.JAXCONV_PRIMS), sorted(set(names))
