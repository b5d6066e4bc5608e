"""conv1d/2d/3d: real keyword signatures (help() and editors show them), Flax's and lax's names as aliases, errors in
the caller's vocabulary (x, w, their shapes, a data_format hint), and callable activations (fused when the epilogue
knows them, applied after the fused conv + bias otherwise)."""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conv_utils as cu
import jaxconv

CONVS = {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}
KEYWORDS = ["stride", "padding", "dilation", "groups", "activation", "data_format", "precision",
            "preferred_element_type", "algorithm", "strides", "rhs_dilation", "kernel_dilation"]


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_signatures_are_real(nsp):
  sig = inspect.signature(CONVS[nsp])
  params = sig.parameters
  assert list(params)[:3] == ["x", "w", "bias"]
  assert not any(p.kind == p.VAR_KEYWORD for p in params.values())
  for name in KEYWORDS:
    assert params[name].kind == params[name].KEYWORD_ONLY, name
  assert params["padding"].default == "VALID" and params["groups"].default == 1
  assert params["data_format"].default == "channels_last"
  doc = CONVS[nsp].__doc__
  assert "strides" in doc and "rhs_dilation" in doc and "callable" in doc


def _ref(x, w, stride, padding, dilation, groups=1):
  nsp = x.ndim - 2
  return cu.ref_conv(x, w, window_strides=stride, padding=padding, rhs_dilation=dilation,
                     dimension_numbers=cu.channels_last_dn(nsp), feature_group_count=groups)


def test_flax_and_lax_names_are_aliases(rng):
  x, w = cu.randn(rng, (2, 13, 11, 6), np.float32), cu.randn(rng, (3, 2, 3, 10), np.float32)
  want = _ref(x, w, (2, 1), [(1, 1), (2, 2)], (1, 3), groups=2)
  for kw in (dict(stride=(2, 1), dilation=(1, 3)), dict(strides=(2, 1), rhs_dilation=(1, 3)),
             dict(strides=(2, 1), kernel_dilation=(1, 3)), dict(stride=(2, 1), strides=(2, 1), dilation=(1, 3))):
    got = jaxconv.conv2d(x, w, padding=[(1, 1), (2, 2)], groups=2, precision="highest", **kw)
    assert cu.rel_l2(got, want) < 1e-6, kw


@pytest.mark.parametrize("kw,names", [(dict(stride=2, strides=1), "stride and strides"),
                                      (dict(dilation=2, rhs_dilation=3), "dilation and rhs_dilation"),
                                      (dict(rhs_dilation=2, kernel_dilation=1), "rhs_dilation and kernel_dilation")])
def test_an_argument_and_its_alias_with_different_values(kw, names):
  with pytest.raises(ValueError, match=names):
    jaxconv.conv2d(jnp.ones((1, 8, 8, 2)), jnp.ones((3, 3, 2, 2)), **kw)


def test_channel_mismatch_names_x_w_and_hints_the_data_format():
  x, w = jnp.ones((2, 6, 9, 9)), jnp.ones((4, 6, 3, 3))  # NCHW and OIHW data, default channels_last
  with pytest.raises(ValueError) as info:
    jaxconv.conv2d(x, w)
  msg = str(info.value)
  assert "x has 9 channels" in msg and "(2, 6, 9, 9)" in msg and "(4, 6, 3, 3)" in msg
  assert "data_format='channels_first'" in msg
  # Without a layout that fits, no hint.
  with pytest.raises(ValueError) as info:
    jaxconv.conv2d(jnp.ones((2, 9, 9, 5)), jnp.ones((3, 3, 4, 8)))
  assert "x has 5 channels" in str(info.value) and "data_format=" not in str(info.value)


def test_groups_and_rank_errors_in_the_callers_words():
  with pytest.raises(ValueError, match=r"w's 6 output channels .* not a multiple of groups=4"):
    jaxconv.conv2d(jnp.ones((1, 5, 5, 8)), jnp.ones((3, 3, 2, 6)), groups=4)
  with pytest.raises(ValueError, match=r"x must have rank 4 .*\(N, H, W, C\).*got shape \(5, 5, 8\)"):
    jaxconv.conv2d(jnp.ones((5, 5, 8)), jnp.ones((3, 3, 8, 6)))
  with pytest.raises(ValueError, match=r"w must have rank 3 .*\(K, C // groups, KW\)"):
    jaxconv.conv1d(jnp.ones((1, 4, 9)), jnp.ones((3, 4)), data_format="channels_first")
  with pytest.raises(ValueError, match=r"bias must have shape \(6,\)"):
    jaxconv.conv2d(jnp.ones((1, 5, 5, 8)), jnp.ones((3, 3, 8, 6)), jnp.ones(5))


FUSED = [(jax.nn.relu, "relu"), (jax.nn.silu, "silu"), (jax.nn.gelu, "gelu"),
         (functools.partial(jax.nn.gelu, approximate=True), "gelu")]
UNFUSED = [jnp.tanh, functools.partial(jax.nn.gelu, approximate=False), lambda v: v * 0.5 + 1.0]


def _fwd_specs(fn, *args):
  return [e.params["spec"] for e in cu.all_eqns(jax.make_jaxpr(fn)(*args)) if e.primitive.name == "jaxconv_fwd"]


@pytest.mark.parametrize("act,name", FUSED)
def test_recognised_callables_are_fused(act, name, rng):
  x, w, b = (cu.randn(rng, s, np.float32) for s in ((2, 9, 7, 3), (3, 3, 3, 5), (5,)))
  f = lambda x, w, b: jaxconv.conv2d(x, w, b, padding="SAME", activation=act, precision="highest")
  (spec,) = _fwd_specs(f, x, w, b)
  assert spec.activation == name and spec.has_bias
  want = cu.activation_ref(_ref(x, w, (1, 1), "SAME", (1, 1)) + cu.f64(b), name)
  assert cu.rel_l2(f(x, w, b), want) < 1e-5


@pytest.mark.parametrize("act", UNFUSED, ids=["tanh", "gelu_exact", "lambda"])
def test_other_callables_run_after_the_fused_conv_and_bias(act, rng):
  x, w, b = (cu.randn(rng, s, np.float32) for s in ((2, 9, 7, 3), (3, 3, 3, 5), (5,)))
  f = lambda x, w, b: jaxconv.conv2d(x, w, b, padding="SAME", activation=act, precision="highest")
  (spec,) = _fwd_specs(f, x, w, b)
  assert spec.activation is None and spec.has_bias
  want = np.asarray(act(jnp.asarray(_ref(x, w, (1, 1), "SAME", (1, 1)) + cu.f64(b), jnp.float32)))
  assert cu.rel_l2(f(x, w, b), want) < 1e-5
  # and it differentiates like the composition
  g = jax.grad(lambda x, w, b: jnp.sum(f(x, w, b) ** 2), (0, 1, 2))(x, w, b)
  h = jax.grad(lambda x, w, b: jnp.sum(act(jaxconv.conv2d(x, w, b, padding="SAME", precision="highest")) ** 2),
               (0, 1, 2))(x, w, b)
  for a, c in zip(g, h):
    assert cu.rel_l2(a, c) < 1e-5


@pytest.mark.parametrize("bad", [3, "tanh", object()])
def test_bad_activation_named(bad):
  with pytest.raises(ValueError, match="activation"):
    jaxconv.conv2d(jnp.ones((1, 5, 5, 2)), jnp.ones((3, 3, 2, 2)), activation=bad)


def test_integer_conv_nd_applies_bias_and_activation_after(rng):
  # The epilogue takes floating types only: for integers XLA adds the bias and applies the activation.
  x = rng.integers(-100, 100, (2, 7, 5, 3)).astype(np.int8)
  w = rng.integers(-100, 100, (3, 3, 3, 4)).astype(np.int8)
  b = rng.integers(-1000, 1000, (4,)).astype(np.int32)
  got = jaxconv.conv2d(x, w, b, padding="SAME", preferred_element_type=jnp.int32, activation=jax.nn.relu)
  exact = cu.ref_conv_int(x, w, np.int64, window_strides=(1, 1), padding="SAME",
                          dimension_numbers=cu.channels_last_dn(2))
  assert got.dtype == np.int32
  np.testing.assert_array_equal(np.asarray(got), np.maximum(exact + b, 0))


def test_flax_module_fuses_a_recognised_callable(rng):
  flax_nn = pytest.importorskip("flax.linen")
  import jaxconv.flax as jf
  del flax_nn
  x = cu.randn(rng, (2, 8, 8, 3), np.float32)
  mod = jf.ConvBiasAct(4, (3, 3), activation=jax.nn.silu)
  params = mod.init(jax.random.key(0), x)
  (spec,) = _fwd_specs(lambda p, x: mod.apply(p, x), params, x)
  assert spec.activation == "silu" and spec.has_bias
