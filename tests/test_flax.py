"""flax.linen.Conv and flax.nnx.Conv with conv_general_dilated=jaxconv.conv_general_dilated behave like lax."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

flax = pytest.importorskip("flax")
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

HI = lax.Precision.HIGHEST


class LinenCNN(nn.Module):
  conv: object = None

  @nn.compact
  def __call__(self, x):
    Conv = functools.partial(nn.Conv, precision=HI, conv_general_dilated=self.conv)
    x = Conv(8, (3, 3), strides=2, padding="SAME")(x)
    x = nn.relu(x)
    x = Conv(8, (3, 3), feature_group_count=4, padding="SAME")(x)  # grouped
    x = nn.gelu(x)
    x = Conv(8, (3, 3), feature_group_count=8, padding="CIRCULAR")(x)  # depthwise, circular padding
    x = jnp.tanh(x)
    x = Conv(6, (2, 3), kernel_dilation=(2, 1), padding=((1, 0), (2, 1)), use_bias=False)(x)
    x = Conv(4, (3, 3), input_dilation=2, padding=((1, 1), (2, 0)))(x)  # lhs dilation (transposed-conv style)
    return jnp.mean(x, axis=(1, 2))


def _linen_params(model, x, seed):
  """Random parameters of the model's shapes, drawn with numpy (flax's initialisers are slow to compile on
  CPU and irrelevant here)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(0.3 * rng.standard_normal(s.shape).astype(np.float32)), shapes)


def _linen_models():
  return LinenCNN(conv=lax.conv_general_dilated), LinenCNN(conv=jaxconv.conv_general_dilated)


def test_linen_cnn_outputs_and_gradients(rng):
  ref_model, model = _linen_models()
  x = jnp.asarray(cu.randn(rng, (3, 13, 11, 5), np.float32))
  params = _linen_params(ref_model, x, 0)
  assert jax.tree.structure(params) == jax.tree.structure(jax.eval_shape(model.init, jax.random.key(0), x))

  def loss(m, p, x):
    return jnp.sum(m.apply(p, x) ** 2)

  y_ref = jax.jit(ref_model.apply)(params, x)
  cu.assert_close(model.apply(params, x), y_ref, 1e-5, "linen forward eager")
  cu.assert_close(jax.jit(model.apply)(params, x), y_ref, 1e-5, "linen forward jit")
  g_ref = jax.jit(jax.grad(functools.partial(loss, ref_model), argnums=(0, 1)))(params, x)
  g = jax.jit(jax.grad(functools.partial(loss, model), argnums=(0, 1)))(params, x)
  assert jax.tree.structure(g) == jax.tree.structure(g_ref)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree.leaves(g_ref)):
    cu.assert_close(a, b, 2e-5, f"linen grad {jax.tree_util.keystr(path)}")


def test_linen_conv_1d_and_3d(rng):
  for shape, ks in (((2, 17, 3), (5,)), ((2, 5, 6, 7, 3), (3, 2, 3))):
    x = jnp.asarray(cu.randn(rng, shape, np.float32))
    m_ref = nn.Conv(4, ks, strides=2, padding="SAME", precision=HI)
    m = nn.Conv(4, ks, strides=2, padding="SAME", precision=HI, conv_general_dilated=jaxconv.conv_general_dilated)
    p = _linen_params(m_ref, x, 1)
    cu.assert_close(jax.jit(m.apply)(p, x), jax.jit(m_ref.apply)(p, x), 1e-5, str(shape))


class NnxCNN(nnx.Module):
  def __init__(self, conv, rngs):
    kw = dict(precision=HI, conv_general_dilated=conv, rngs=rngs)
    self.c1 = nnx.Conv(5, 8, (3, 3), strides=2, padding="SAME", **kw)
    self.c2 = nnx.Conv(8, 8, (3, 3), feature_group_count=2, padding="SAME", **kw)
    self.c3 = nnx.Conv(8, 8, (5, 5), feature_group_count=8, strides=(1, 2), padding="VALID", **kw)
    self.c4 = nnx.Conv(8, 4, (1, 1), **kw)

  def __call__(self, x):
    x = nnx.relu(self.c1(x))
    x = nnx.silu(self.c2(x))
    x = jnp.tanh(self.c3(x))
    return jnp.mean(self.c4(x), axis=(1, 2))


def test_nnx_cnn_outputs_and_gradients(rng):
  ref_model = NnxCNN(lax.conv_general_dilated, nnx.Rngs(0))
  model = NnxCNN(jaxconv.conv_general_dilated, nnx.Rngs(0))
  # Same initialisation (same seeds): the parameters are identical.
  for a, b in zip(jax.tree.leaves(nnx.state(ref_model, nnx.Param)), jax.tree.leaves(nnx.state(model, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  x = jnp.asarray(cu.randn(rng, (2, 17, 19, 5), np.float32))

  def loss(m, x):
    return jnp.sum(m(x) ** 2)

  y_ref = nnx.jit(lambda m, x: m(x))(ref_model, x)
  cu.assert_close(model(x), y_ref, 1e-5, "nnx forward eager")
  cu.assert_close(nnx.jit(lambda m, x: m(x))(model, x), y_ref, 1e-5, "nnx forward jit")
  g_ref = nnx.jit(nnx.grad(loss))(ref_model, x)
  g = nnx.jit(nnx.grad(loss))(model, x)
  leaves_ref = jax.tree.leaves(nnx.state(g_ref))
  leaves = jax.tree.leaves(nnx.state(g))
  assert len(leaves) == len(leaves_ref) > 0
  for a, b in zip(leaves, leaves_ref):
    cu.assert_close(a, b, 2e-5, "nnx grad")
  # Input gradients as well.
  gx_ref = jax.jit(jax.grad(lambda x: loss(ref_model, x)))(x)
  gx = jax.jit(jax.grad(lambda x: loss(model, x)))(x)
  cu.assert_close(gx, gx_ref, 2e-5, "nnx input grad")


def test_linen_train_step_decreases_loss_like_lax(rng):
  """A few SGD steps with jaxconv track the lax trajectory."""
  ref_model, model = _linen_models()
  x = jnp.asarray(cu.randn(rng, (4, 9, 9, 5), np.float32))
  t = jnp.asarray(cu.randn(rng, (4, 4), np.float32))
  params = _linen_params(ref_model, x, 2)

  def make_step(m):
    def loss(p):
      return jnp.mean((m.apply(p, x) - t) ** 2)

    @jax.jit
    def step(p):
      l, g = jax.value_and_grad(loss)(p)
      return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), l
    return step

  p_ref, p = params, params
  step_ref, step = make_step(ref_model), make_step(model)
  losses = []
  for _ in range(5):
    p_ref, l_ref = step_ref(p_ref)
    p, l = step(p)
    losses.append(float(l))
    np.testing.assert_allclose(float(l), float(l_ref), rtol=1e-4)
  assert losses[-1] < losses[0]
