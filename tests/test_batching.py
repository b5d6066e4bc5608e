"""vmap of the forward convolution and of its gradients; jit vs eager."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

HI = lax.Precision.HIGHEST

# Inner (per-example) convolutions: (lhs shape, rhs shape, kwargs).
INNER = {
    "nhwc_same_stride": ((2, 6, 7, 3), (3, 2, 3, 4),
                         dict(window_strides=(2, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "nchw_groups": ((2, 4, 6, 5), (6, 2, 2, 3),
                    dict(window_strides=(1, 1), padding=[(1, 0), (1, 1)], feature_group_count=2)),
    "nhwc_depthwise": ((1, 6, 5, 4), (3, 3, 1, 4),
                       dict(window_strides=(1, 1), padding="SAME", feature_group_count=4,
                            dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "batch_groups": ((4, 5, 6, 3), (2, 2, 3, 6),
                     dict(window_strides=(1, 1), padding="VALID", batch_group_count=2,
                          dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "1d_lhs_dil_perm": ((9, 3, 2), (4, 3, 5),
                        dict(window_strides=(1,), padding=[(2, 2)], lhs_dilation=(2,), rhs_dilation=(1,),
                             dimension_numbers=("WCN", "OIW", "NWC"))),
}


def _conv(impl, kw):
  return functools.partial(impl, precision=HI, **kw)


def _ref_loop(kw, xs, ws, x_axis, w_axis, out_axis):
  """Per-example float64 references, stacked on out_axis."""
  B = xs.shape[x_axis] if x_axis is not None else ws.shape[w_axis]
  outs = []
  for b in range(B):
    x = np.take(xs, b, axis=x_axis) if x_axis is not None else xs
    w = np.take(ws, b, axis=w_axis) if w_axis is not None else ws
    outs.append(cu.ref_conv(x, w, **kw))
  return np.stack(outs, axis=out_axis)


AXES = [  # (x in_axis, w in_axis, out_axis)
    (0, None, 0),
    (2, None, 1),
    (None, 0, 0),
    (None, 3, -1),
    (0, 0, 0),
    (1, 2, 2),
]


@pytest.mark.parametrize("axes", AXES, ids=lambda a: f"x{a[0]}_w{a[1]}_out{a[2]}")
@pytest.mark.parametrize("name", sorted(INNER))
def test_vmap_fwd(name, axes, rng):
  lhs_shape, rhs_shape, kw = INNER[name]
  xa, wa, oa = axes
  B = 3
  xs = cu.randn(rng, lhs_shape, np.float32)
  ws = cu.randn(rng, rhs_shape, np.float32)
  if xa is not None:
    xs = np.stack([cu.randn(rng, lhs_shape, np.float32) for _ in range(B)], axis=xa)
  if wa is not None:
    ws = np.stack([cu.randn(rng, rhs_shape, np.float32) for _ in range(B)], axis=wa)
  f = jax.vmap(_conv(jaxconv.conv_general_dilated, kw), in_axes=(xa, wa), out_axes=oa)
  got = f(jnp.asarray(xs), jnp.asarray(ws))
  want = _ref_loop(kw, xs, ws, xa, wa, oa)
  cu.assert_close(got, want, 1e-5, f"{name} axes={axes}")
  # and the same under jit
  got_jit = jax.jit(f)(jnp.asarray(xs), jnp.asarray(ws))
  cu.assert_close(got_jit, want, 1e-5, f"jit {name} axes={axes}")


@pytest.mark.parametrize("name", ["nchw_groups", "batch_groups"])
def test_nested_vmap(name, rng):
  lhs_shape, rhs_shape, kw = INNER[name]
  xs = cu.randn(rng, (2, 3) + lhs_shape, np.float32)
  ws = cu.randn(rng, (3,) + rhs_shape, np.float32)
  f = _conv(jaxconv.conv_general_dilated, kw)
  got = jax.vmap(jax.vmap(f, in_axes=(0, 0)), in_axes=(0, None))(jnp.asarray(xs), jnp.asarray(ws))
  want = np.stack([np.stack([cu.ref_conv(xs[i, j], ws[j], **kw) for j in range(3)]) for i in range(2)])
  cu.assert_close(got, want, 1e-5, name)


@pytest.mark.parametrize("name", sorted(INNER))
def test_vmap_size_zero_axis(name, rng):
  lhs_shape, rhs_shape, kw = INNER[name]
  f = _conv(jaxconv.conv_general_dilated, kw)
  x = jnp.asarray(cu.randn(rng, lhs_shape, np.float32))
  w = jnp.asarray(cu.randn(rng, rhs_shape, np.float32))
  out_shape = jax.eval_shape(_conv(lax.conv_general_dilated, kw), x, w).shape
  y = jax.vmap(f, in_axes=(0, None))(jnp.zeros((0,) + lhs_shape, jnp.float32), w)
  assert y.shape == (0,) + out_shape
  y = jax.vmap(f, in_axes=(None, 0))(x, jnp.zeros((0,) + rhs_shape, jnp.float32))
  assert y.shape == (0,) + out_shape
  y = jax.vmap(f)(jnp.zeros((0,) + lhs_shape, jnp.float32), jnp.zeros((0,) + rhs_shape, jnp.float32))
  assert y.shape == (0,) + out_shape


def _per_example_setup(name, rng, B=4):
  lhs_shape, rhs_shape, kw = INNER[name]
  xs = cu.randn(rng, (B,) + lhs_shape, np.float32)
  w = cu.randn(rng, rhs_shape, np.float32)
  out_shape = jax.eval_shape(_conv(lax.conv_general_dilated, kw), xs[0], w).shape
  ts = cu.randn(rng, (B,) + out_shape, np.float32)
  return kw, jnp.asarray(xs), jnp.asarray(w), jnp.asarray(ts)


def _loss(impl, kw):
  def loss(w, x, t):
    return 0.5 * jnp.sum((impl(x, w, precision=HI, **kw) - t) ** 2)
  return loss


def _ref_grads(kw, w, x, t):
  """float64 (dL/dw, dL/dx) of 0.5 * ||conv(x, w) - t||^2 from the numpy reference."""
  y = cu.ref_conv(x, w, **kw)
  dx, dw = cu.ref_conv_vjp(x, w, y - cu.f64(t), **kw)
  return dw, dx


@pytest.mark.parametrize("name", sorted(INNER))
def test_per_example_weight_gradients(name, rng):
  kw, xs, w, ts = _per_example_setup(name, rng)
  loss = _loss(jaxconv.conv_general_dilated, kw)
  got = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(w, xs, ts)
  loop = np.stack([np.asarray(jax.grad(loss)(w, xs[b], ts[b])) for b in range(xs.shape[0])])
  cu.assert_close(got, loop, 1e-5, f"{name}: vmap(grad) vs python loop")
  want = np.stack([_ref_grads(kw, w, xs[b], ts[b])[0] for b in range(xs.shape[0])])
  cu.assert_close(got, want, 1e-5, f"{name}: vs float64 reference")


@pytest.mark.parametrize("name", sorted(INNER))
def test_per_example_input_and_weight_gradients_batched_w(name, rng):
  """Per-example gradients w.r.t. both operands when both are batched (ensembles)."""
  kw, xs, w, ts = _per_example_setup(name, rng, B=3)
  ws = jnp.stack([w, 2 * w, -w])
  loss = _loss(jaxconv.conv_general_dilated, kw)
  got = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(ws, xs, ts)
  refs = [_ref_grads(kw, ws[b], xs[b], ts[b]) for b in range(3)]
  for i, what in enumerate(("dw", "dx")):
    cu.assert_close(got[i], np.stack([r[i] for r in refs]), 1e-5, f"{name}: {what}")


@pytest.mark.parametrize("name", sorted(INNER))
def test_vmap_grad_jaxpr_has_one_wgrad_and_no_loop(name, rng):
  kw, xs, w, ts = _per_example_setup(name, rng)
  loss = _loss(jaxconv.conv_general_dilated, kw)
  jaxpr = jax.make_jaxpr(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(w, xs, ts)
  names = cu.primitive_names(jaxpr)
  assert names.count("jaxconv_wgrad") == 1, sorted(names)
  assert names.count("jaxconv_fwd") == 1, sorted(names)
  assert "jaxconv_dgrad" not in names, "no input gradient was requested"
  assert not {"while", "scan", "conv_general_dilated"} & set(names), sorted(set(names))


def test_vmap_hlo_has_single_convolution_ops(rng):
  """After lowering, vmap(grad) is one forward and one (grouped) filter-gradient op: each a jaxconv custom call, or
  XLA's own convolution where the registry picks it (no unrolled per-example calls)."""
  kw, xs, w, ts = _per_example_setup("nhwc_same_stride", rng, B=5)
  loss = _loss(jaxconv.conv_general_dilated, kw)
  text = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))).lower(w, xs, ts).as_text()
  calls = {t: text.count(f"@{t}(") for t in ("jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad")}
  assert calls["jaxconv_fwd"] <= 1 and calls["jaxconv_wgrad"] <= 1 and calls["jaxconv_dgrad"] == 0, calls
  assert sum(calls.values()) + text.count("stablehlo.convolution") == 2, text


@pytest.mark.parametrize("name", sorted(INNER))
def test_jit_equals_eager(name, rng):
  kw, xs, w, ts = _per_example_setup(name, rng, B=1)
  f = _conv(jaxconv.conv_general_dilated, kw)
  x = xs[0]
  np.testing.assert_allclose(np.asarray(jax.jit(f)(x, w)), np.asarray(f(x, w)), rtol=1e-6, atol=1e-6)
  loss = _loss(jaxconv.conv_general_dilated, kw)
  g_eager = jax.grad(loss, argnums=(0, 1))(w, x, ts[0])
  g_jit = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, x, ts[0])
  for a, b in zip(g_jit, g_eager):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
