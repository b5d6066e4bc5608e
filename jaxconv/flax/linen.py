"""flax.linen modules on jaxconv's kernels: drop-in for ``flax.linen.Conv``.

``Conv`` subclasses ``flax.linen.Conv``: the same attributes, the same parameters ('kernel' with shape
``kernel_size + (in_features // feature_group_count, features)``, 'bias' with shape ``(features,)``), the
same initialisers, so a variables dict from one loads into the other. ``ConvBiasAct`` adds an
``activation`` applied in the kernel's epilogue together with the bias.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from jaxconv.flax import _core


class Conv(nn.Conv):
  """``flax.linen.Conv`` computed by jaxconv (the bias is added in the kernel's epilogue).

  Accepts every attribute of ``flax.linen.Conv`` (features, kernel_size, strides, padding, input_dilation,
  kernel_dilation, feature_group_count, use_bias, mask, dtype, param_dtype, precision, kernel_init,
  bias_init, promote_dtype) except the deprecated ``conv_general_dilated``/``conv_general_dilated_cls``
  (the convolution is always jaxconv's). Only shared weights (regular convolution) are supported.
  """

  def _activation(self) -> Any:
    return None

  @nn.compact
  def __call__(self, inputs):
    if self.conv_general_dilated is not None or self.conv_general_dilated_cls is not None:
      raise TypeError(f"{type(self).__name__} always runs jaxconv's convolution; use flax.linen.Conv to pass "
                      "conv_general_dilated / conv_general_dilated_cls")
    act = self._activation()
    _core.check_activation(act, type(self).__name__)
    kernel_size = ((self.kernel_size,) if isinstance(self.kernel_size, int) else tuple(self.kernel_size))
    in_features = jnp.shape(inputs)[-1]
    if in_features % self.feature_group_count:
      raise ValueError(f"{type(self).__name__}: feature_group_count {self.feature_group_count} does not "
                       f"divide the input features {in_features}")
    kernel_shape = kernel_size + (in_features // self.feature_group_count, self.features)
    if self.mask is not None and self.mask.shape != kernel_shape:
      raise ValueError("Mask needs to have the same shape as weights. "
                       f"Shapes are: {self.mask.shape}, {kernel_shape}")
    kernel = self.param("kernel", self.kernel_init, kernel_shape, self.param_dtype)
    if self.mask is not None:
      kernel *= self.mask
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
    inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    return _core.conv_bias_act(
        inputs, kernel, bias, kernel_size=kernel_size, strides=self.strides, padding=self.padding,
        input_dilation=self.input_dilation, kernel_dilation=self.kernel_dilation,
        feature_group_count=self.feature_group_count, precision=self.precision, activation=act)


class ConvBiasAct(Conv):
  """``Conv`` followed by ``activation``, fused: y = act(conv(x, kernel) + bias) in one jaxconv kernel.

  ``activation``: None, 'relu', 'gelu' (tanh approximation, as ``flax.linen.gelu``'s default) or 'silu'
  (fused), or any callable (applied by XLA after the fused conv + bias). Parameters are exactly those of
  ``flax.linen.Conv`` with the same arguments.
  """
  activation: Any = "relu"

  def _activation(self) -> Any:
    return self.activation
