"""Flax modules on jaxconv's kernels, drop-in for Flax's ``Conv``, and BatchNorm folding for inference.

    jaxconv.flax.Conv, jaxconv.flax.ConvBiasAct             flax.linen (also jaxconv.flax.linen.*)
    jaxconv.flax.nnx.Conv, jaxconv.flax.nnx.ConvBiasAct     flax.nnx
    jaxconv.flax.fold_batch_norm(kernel, bias, mean, var, scale=, offset=, epsilon=)  arrays
    jaxconv.flax.fold_batch_norm_variables(conv_params, bn_variables, epsilon=)       linen dicts
    jaxconv.flax.nnx.fold_batch_norm(conv, bn, activation=)                           nnx modules

The modules take Flax Conv's arguments and have the same parameters ('kernel' in HWIO order, 'bias'), so
checkpoints load either way. ``ConvBiasAct`` fuses the bias and a 'relu' / 'gelu' / 'silu' activation into
the convolution kernel's epilogue.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from jax import lax

from jaxconv.flax import linen, nnx
from jaxconv.flax.linen import Conv, ConvBiasAct


def fold_batch_norm(kernel, bias, mean, var, *, scale=None, offset=None, epsilon: float = 1e-5):
  """Folds an inference-mode BatchNorm that follows a convolution into the convolution's kernel and bias.

  ``bn(conv(x, kernel) + bias) == conv(x, kernel') + bias'`` where the BatchNorm is
  ``(z - mean) / sqrt(var + epsilon) * scale + offset`` over the last (feature) axis. ``kernel`` is in
  Flax's layout (``(*window, in_features // groups, features)``), ``bias`` may be None (no bias), ``scale``
  / ``offset`` None mean 1 / 0 (BatchNorm with use_scale / use_bias off). The fold is computed in float32
  (or float64 for float64 kernels) and returned in the kernel's dtype.

  Returns:
    (kernel', bias'), bias' of shape (features,).
  """
  kernel = jnp.asarray(kernel)
  features = kernel.shape[-1]
  dt = jnp.promote_types(kernel.dtype, jnp.float32)
  mean = jnp.asarray(mean, dt)
  var = jnp.asarray(var, dt)
  for name, v in (("mean", mean), ("var", var), ("scale", scale), ("offset", offset), ("bias", bias)):
    if v is not None and jnp.shape(v) != (features,):
      raise ValueError(f"fold_batch_norm: {name} must have shape ({features},) (one value per output "
                       f"feature), got {jnp.shape(v)}")
  s = lax.rsqrt(var + jnp.asarray(epsilon, dt))
  if scale is not None:
    s = s * jnp.asarray(scale, dt)
  b = jnp.zeros((features,), dt) if bias is None else jnp.asarray(bias, dt)
  b = (b - mean) * s
  if offset is not None:
    b = b + jnp.asarray(offset, dt)
  out_kernel = (kernel.astype(dt) * s).astype(kernel.dtype)
  out_bias = b.astype(kernel.dtype if bias is None else jnp.asarray(bias).dtype)
  return out_kernel, out_bias


def fold_batch_norm_variables(conv_params: Mapping[str, Any], bn_variables: Mapping[str, Any], *,
                              epsilon: float = 1e-5) -> dict:
  """The linen form of :func:`fold_batch_norm`.

  Args:
    conv_params: a Conv's params, ``{'kernel': ..., 'bias': ...}`` ('bias' optional).
    bn_variables: the BatchNorm's variables, ``{'params': {'scale', 'bias'}, 'batch_stats': {'mean',
      'var'}}`` (either param may be absent), or the flat ``{'scale', 'bias', 'mean', 'var'}``.
    epsilon: the BatchNorm's epsilon (``flax.linen.BatchNorm`` default 1e-5).

  Returns:
    ``{'kernel': kernel', 'bias': bias'}``: the params of a ``Conv`` / ``ConvBiasAct`` with use_bias=True
    (same kernel_size, strides, padding...) that computes conv followed by the BatchNorm.
  """
  flat = dict(bn_variables.get("params", {}))
  flat.update(bn_variables.get("batch_stats", {}))
  if "params" not in bn_variables and "batch_stats" not in bn_variables:
    flat = dict(bn_variables)
  if "mean" not in flat or "var" not in flat:
    raise ValueError("fold_batch_norm_variables: bn_variables must hold the running 'mean' and 'var' "
                     f"(in 'batch_stats'), got keys {sorted(flat)}")
  kernel, bias = fold_batch_norm(conv_params["kernel"], conv_params.get("bias"), flat["mean"], flat["var"],
                                 scale=flat.get("scale"), offset=flat.get("bias"), epsilon=epsilon)
  return {"kernel": kernel, "bias": bias}


__all__ = ["Conv", "ConvBiasAct", "fold_batch_norm", "fold_batch_norm_variables", "linen", "nnx"]
