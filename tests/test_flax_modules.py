"""jaxconv.flax: drop-in Conv / ConvBiasAct for flax.linen and flax.nnx, and BatchNorm folding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import conv_utils as cu

pytest.importorskip("flax")
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jaxconv.flax as jf  # noqa: E402

HI = lax.Precision.HIGHEST
ACTS = {None: lambda y: y, "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu}

# (input shape, Conv keyword arguments): every Flax argument form the modules must honour.
CASES = [
    ((2, 9, 10, 3), dict(features=4, kernel_size=(3, 3))),
    ((2, 9, 10, 4), dict(features=6, kernel_size=(3, 2), strides=2, padding="VALID", feature_group_count=2)),
    ((2, 9, 10, 3), dict(features=4, kernel_size=(3, 3), padding="CIRCULAR", kernel_dilation=2)),
    ((2, 9, 10, 3), dict(features=4, kernel_size=(3, 3), padding="REFLECT", use_bias=False)),
    ((2, 9, 10, 3), dict(features=4, kernel_size=(2, 3), padding=1, input_dilation=(2, 1))),
    ((2, 9, 10, 3), dict(features=4, kernel_size=(3, 3), padding=((1, 0), (2, 1)), strides=(1, 2))),
    ((2, 9, 10, 3), dict(features=4, kernel_size=(3, 3), padding=[1, (0, 2)])),
    ((2, 17, 3), dict(features=5, kernel_size=(4,), padding="CAUSAL", kernel_dilation=2)),
    ((3, 17, 3), dict(features=5, kernel_size=5, strides=3, padding="SAME")),
    ((2, 5, 6, 7, 2), dict(features=3, kernel_size=(3, 2, 3), strides=(1, 2, 1), padding="SAME")),
    ((4, 4, 8, 8, 3), dict(features=4, kernel_size=(3, 3))),  # two batch dims
    ((8, 8, 3), dict(features=4, kernel_size=(3, 3))),  # no batch dim
    ((2, 7, 7, 6), dict(features=6, kernel_size=(3, 3), feature_group_count=6)),  # depthwise
]


def _ids(cases):
  return [f"{shape}-{','.join(f'{k}={v}' for k, v in kw.items())}" for shape, kw in cases]


@pytest.mark.parametrize("shape,kw", CASES, ids=_ids(CASES))
def test_linen_conv_matches_flax(rng, shape, kw):
  x = jnp.asarray(cu.randn(rng, shape, np.float32))
  ref = nn.Conv(precision=HI, bias_init=nn.initializers.normal(1.0), **kw)
  mod = jf.Conv(precision=HI, bias_init=nn.initializers.normal(1.0), **kw)
  params = ref.init(jax.random.key(0), x)
  # Same parameter names, shapes and (same key) values: a Flax checkpoint is a jaxconv checkpoint.
  mine = mod.init(jax.random.key(0), x)
  assert jax.tree.structure(mine) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, mine, params)
  y_ref = jax.jit(ref.apply)(params, x)
  cu.assert_close(jax.jit(mod.apply)(params, x), y_ref, 1e-5, "linen jit")
  loss = lambda m, p: jnp.sum(jnp.sin(m.apply(p, x)))
  g_ref = jax.jit(jax.grad(functools.partial(loss, ref)))(params)
  g = jax.jit(jax.grad(functools.partial(loss, mod)))(params)
  jax.tree.map(lambda a, b: cu.assert_close(a, b, 2e-5, "linen grad"), g, g_ref)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu", None, jnp.tanh])
def test_linen_conv_bias_act(rng, act):
  x = jnp.asarray(cu.randn(rng, (2, 11, 9, 3), np.float32))
  ref = nn.Conv(8, (3, 3), strides=(2, 1), precision=HI, bias_init=nn.initializers.normal(1.0))
  params = ref.init(jax.random.key(1), x)
  mod = jf.ConvBiasAct(8, (3, 3), strides=(2, 1), precision=HI, activation=act)
  f_ref = lambda p, x: (act if callable(act) else ACTS[act])(ref.apply(p, x))
  cu.assert_close(jax.jit(mod.apply)(params, x), f_ref(params, x), 1e-5, f"forward {act}")
  g_ref = jax.grad(lambda p, x: jnp.sum(f_ref(p, x) ** 2), argnums=(0, 1))(params, x)
  g = jax.jit(jax.grad(lambda p, x: jnp.sum(mod.apply(p, x) ** 2), argnums=(0, 1)))(params, x)
  jax.tree.map(lambda a, b: cu.assert_close(a, b, 2e-5, f"grad {act}"), g, g_ref)


def test_conv_bias_act_is_one_fused_call(rng):
  """Bias and activation travel inside the one jaxconv_fwd call: no separate add or max in the jaxpr."""
  x = jnp.ones((2, 8, 8, 3))
  mod = jf.ConvBiasAct(4, (3, 3), activation="relu")
  params = mod.init(jax.random.key(0), x)
  jaxpr = jax.make_jaxpr(mod.apply)(params, x).jaxpr
  eqns = list(cu.all_eqns(jaxpr))
  convs = [e for e in eqns if e.primitive.name.startswith("jaxconv_")]
  assert [e.primitive.name for e in convs] == ["jaxconv_fwd"]
  spec = convs[0].params["spec"]
  assert spec.has_bias and spec.activation == "relu"
  assert not any(e.primitive.name in ("add", "max") for e in eqns), jaxpr


def test_linen_rejects_other_conv_and_bad_activation():
  x = jnp.ones((1, 5, 5, 2))
  with pytest.raises(TypeError, match="conv_general_dilated"):
    jf.Conv(3, (3, 3), conv_general_dilated=lax.conv_general_dilated).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="activation"):
    jf.ConvBiasAct(3, (3, 3), activation="tanh").init(jax.random.key(0), x)


def test_linen_dtype_and_mask(rng):
  x = jnp.asarray(cu.randn(rng, (2, 8, 8, 3), np.float32))
  mask = jnp.asarray(rng.random((3, 3, 3, 4)) > 0.5, jnp.float32)
  for kw in (dict(dtype=jnp.bfloat16), dict(mask=mask), dict(param_dtype=jnp.bfloat16)):
    ref = nn.Conv(4, (3, 3), precision=HI, **kw)
    mod = jf.Conv(4, (3, 3), precision=HI, **kw)
    params = ref.init(jax.random.key(2), x)
    y_ref, y = ref.apply(params, x), jax.jit(mod.apply)(params, x)
    assert y.dtype == y_ref.dtype, kw
    tol = 1e-2 if y.dtype == jnp.bfloat16 else 1e-5
    cu.assert_close(y, y_ref, tol, str(kw))


NNX_CASES = [
    (3, 8, (3, 3), dict(strides=2, padding="SAME")),
    (4, 6, (3, 3), dict(feature_group_count=2, padding="CIRCULAR", kernel_dilation=(1, 2))),
    (3, 4, (2, 3), dict(input_dilation=2, padding=((1, 1), (0, 2)), use_bias=False)),
    (3, 5, (4,), dict(padding="CAUSAL")),
]


@pytest.mark.parametrize("cin,cout,ks,kw", NNX_CASES)
def test_nnx_conv_matches_flax(rng, cin, cout, ks, kw):
  nsp = len(ks)
  x = jnp.asarray(cu.randn(rng, (2, *([9] * nsp), cin), np.float32))
  kw = dict(precision=HI, bias_init=nnx.initializers.normal(1.0), **kw)
  ref = nnx.Conv(cin, cout, ks, rngs=nnx.Rngs(0), **kw)
  mod = jf.nnx.Conv(cin, cout, ks, rngs=nnx.Rngs(0), **kw)
  assert isinstance(mod, nnx.Conv)
  # Same state (names, shapes, and values from the same seed).
  s_ref, s = nnx.state(ref, nnx.Param), nnx.state(mod, nnx.Param)
  assert jax.tree.structure(s) == jax.tree.structure(s_ref)
  jax.tree.map(np.testing.assert_array_equal, s, s_ref)
  # Loading either way: perturb the Flax module's params, copy them into the jaxconv one.
  nnx.update(ref, jax.tree.map(lambda a: a + 0.25, s_ref))
  nnx.update(mod, nnx.state(ref, nnx.Param))
  y_ref = ref(x)
  cu.assert_close(mod(x), y_ref, 1e-5, "nnx eager")
  cu.assert_close(nnx.jit(lambda m, x: m(x))(mod, x), y_ref, 1e-5, "nnx jit")
  loss = lambda m, x: jnp.sum(jnp.sin(m(x)))
  g_ref = nnx.grad(loss)(ref, x)
  g = nnx.jit(nnx.grad(loss))(mod, x)
  jax.tree.map(lambda a, b: cu.assert_close(a, b, 2e-5, "nnx grad"), nnx.state(g), nnx.state(g_ref))
  # And back: a jaxconv module's state loads into flax.nnx.Conv.
  back = nnx.Conv(cin, cout, ks, rngs=nnx.Rngs(5), **kw)
  nnx.update(back, nnx.state(mod, nnx.Param))
  cu.assert_close(back(x), y_ref, 1e-6, "nnx load back")


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_nnx_conv_bias_act(rng, act):
  x = jnp.asarray(cu.randn(rng, (2, 9, 9, 3), np.float32))
  ref = nnx.Conv(3, 8, (3, 3), precision=HI, bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(3))
  mod = jf.nnx.ConvBiasAct(3, 8, (3, 3), precision=HI, activation=act, rngs=nnx.Rngs(4))
  nnx.update(mod, nnx.state(ref, nnx.Param))
  cu.assert_close(nnx.jit(lambda m, x: m(x))(mod, x), ACTS[act](ref(x)), 1e-5, act)
  with pytest.raises(TypeError, match="conv_general_dilated"):
    jf.nnx.Conv(3, 8, (3, 3), conv_general_dilated=lax.conv_general_dilated, rngs=nnx.Rngs(0))


def _random_bn_stats(rng, k):
  return dict(mean=jnp.asarray(cu.randn(rng, (k,), np.float32)),
              var=jnp.asarray(rng.random(k).astype(np.float32) + 0.5),
              scale=jnp.asarray(cu.randn(rng, (k,), np.float32)),
              bias=jnp.asarray(cu.randn(rng, (k,), np.float32)))


@pytest.mark.parametrize("use_bias", [True, False])
def test_linen_batch_norm_folding(rng, use_bias):
  x = jnp.asarray(cu.randn(rng, (3, 10, 10, 4), np.float32))

  class ConvBN(nn.Module):
    @nn.compact
    def __call__(self, x):
      y = nn.Conv(6, (3, 3), feature_group_count=2, use_bias=use_bias, precision=HI, name="conv")(x)
      return nn.relu(nn.BatchNorm(use_running_average=True, epsilon=1e-3, name="bn")(y))

  variables = ConvBN().init(jax.random.key(0), x)
  st = _random_bn_stats(rng, 6)
  variables = {"params": {"conv": variables["params"]["conv"],
                          "bn": {"scale": st["scale"], "bias": st["bias"]}},
               "batch_stats": {"bn": {"mean": st["mean"], "var": st["var"]}}}
  y_ref = ConvBN().apply(variables, x)
  folded = jf.fold_batch_norm_variables(
      variables["params"]["conv"],
      {"params": variables["params"]["bn"], "batch_stats": variables["batch_stats"]["bn"]}, epsilon=1e-3)
  fused = jf.ConvBiasAct(6, (3, 3), feature_group_count=2, precision=HI, activation="relu")
  cu.assert_close(jax.jit(fused.apply)({"params": folded}, x), y_ref, 1e-5, "folded linen")


def test_nnx_batch_norm_folding(rng):
  x = jnp.asarray(cu.randn(rng, (3, 10, 10, 4), np.float32))
  conv = nnx.Conv(4, 6, (3, 3), strides=2, precision=HI, bias_init=nnx.initializers.normal(1.0),
                  rngs=nnx.Rngs(0))
  bn = nnx.BatchNorm(6, use_running_average=True, rngs=nnx.Rngs(1))
  st = _random_bn_stats(rng, 6)
  bn.mean[...], bn.var[...], bn.scale[...], bn.bias[...] = st["mean"], st["var"], st["scale"], st["bias"]
  y_ref = nnx.silu(bn(conv(x)))
  fused = jf.nnx.fold_batch_norm(conv, bn, activation="silu")
  assert isinstance(fused, jf.nnx.ConvBiasAct)
  cu.assert_close(fused(x), y_ref, 1e-5, "folded nnx")


def test_fold_batch_norm_arrays_without_scale_or_offset(rng):
  kernel = jnp.asarray(cu.randn(rng, (3, 3, 2, 5), np.float32))
  mean = jnp.asarray(cu.randn(rng, (5,), np.float32))
  var = jnp.asarray(rng.random(5).astype(np.float32) + 0.1)
  k2, b2 = jf.fold_batch_norm(kernel, None, mean, var)
  x = jnp.asarray(cu.randn(rng, (2, 6, 6, 2), np.float32))
  conv = lambda k: lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            precision=HI)
  ref = (conv(kernel) - mean) / jnp.sqrt(var + 1e-5)
  cu.assert_close(conv(k2) + b2, ref, 1e-5, "fold arrays")
  with pytest.raises(ValueError, match="mean"):
    jf.fold_batch_norm(kernel, None, mean[:3], var)
