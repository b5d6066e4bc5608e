"""flax.nnx modules on jaxconv's kernels: drop-in for ``flax.nnx.Conv``.

``Conv`` subclasses ``flax.nnx.Conv`` and takes the same constructor arguments (in_features, out_features,
kernel_size, strides, padding, input_dilation, kernel_dilation, feature_group_count, use_bias, mask, dtype,
param_dtype, precision, kernel_init, bias_init, promote_dtype, preferred_element_type, rngs, ...) except
``conv_general_dilated``; its state is the same ('kernel' and 'bias' Params of the same shapes), so
``nnx.update(jaxconv_conv, nnx.state(flax_conv))`` and the reverse load either way.
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from jaxconv.flax import _core


class Conv(nnx.Conv):
  """``flax.nnx.Conv`` computed by jaxconv (the bias is added in the kernel's epilogue)."""

  def __init__(self, in_features: int, out_features: int, kernel_size, strides=1, **kwargs):
    if "conv_general_dilated" in kwargs:
      raise TypeError(f"{type(self).__name__} always runs jaxconv's convolution; use flax.nnx.Conv to pass "
                      "conv_general_dilated")
    super().__init__(in_features, out_features, kernel_size, strides, **kwargs)

  def _activation(self) -> Any:
    return None

  def __call__(self, inputs, out_sharding=None):
    act = self._activation()
    _core.check_activation(act, type(self).__name__)
    if self.mask is not None and self.mask.shape != self.kernel_shape:
      raise ValueError("Mask needs to have the same shape as weights. "
                       f"Shapes are: {self.mask.shape}, {self.kernel_shape}")
    kernel = self.kernel[...]
    if self.mask is not None:
      kernel = kernel * self.mask
    bias = self.bias[...] if self.bias is not None else None
    inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
    return _core.conv_bias_act(
        inputs, kernel, bias, kernel_size=self.kernel_size, strides=self.strides, padding=self.padding,
        input_dilation=self.input_dilation, kernel_dilation=self.kernel_dilation,
        feature_group_count=self.feature_group_count, precision=self.precision, activation=act,
        preferred_element_type=self.preferred_element_type, out_sharding=out_sharding)


class ConvBiasAct(Conv):
  """``Conv`` followed by ``activation``, fused: y = act(conv(x, kernel) + bias) in one jaxconv kernel.

  ``activation`` (keyword): None, 'relu' (default), 'gelu' (tanh approximation), 'silu' (fused), or any
  callable (applied by XLA after the fused conv + bias). State is exactly that of ``flax.nnx.Conv``.
  """

  def __init__(self, in_features: int, out_features: int, kernel_size, strides=1, *, activation="relu",
               **kwargs):
    _core.check_activation(activation, type(self).__name__)
    super().__init__(in_features, out_features, kernel_size, strides, **kwargs)
    self.activation = activation

  def _activation(self) -> Any:
    return self.activation


def fold_batch_norm(conv: nnx.Conv, bn: nnx.BatchNorm, *, activation: Any = None) -> ConvBiasAct:
  """A ``ConvBiasAct`` (bias on) computing ``activation(bn(conv(x)))`` for ``bn`` in inference mode.

  ``conv`` is a ``flax.nnx.Conv`` or one of this module's; the BatchNorm's running statistics, scale,
  offset and epsilon are folded into the new kernel and bias. ``conv``'s configuration is copied.
  """
  from jaxconv.flax import fold_batch_norm as fold_arrays
  if conv.mask is not None:
    raise ValueError("fold_batch_norm: a masked conv cannot be folded (apply the mask to the kernel first)")
  kernel, bias = fold_arrays(
      conv.kernel[...], None if conv.bias is None else conv.bias[...], bn.mean[...], bn.var[...],
      scale=None if bn.scale is None else bn.scale[...], offset=None if bn.bias is None else bn.bias[...],
      epsilon=bn.epsilon)
  out = ConvBiasAct(conv.in_features, conv.out_features, conv.kernel_size, conv.strides,
                    activation=activation, padding=conv.padding, input_dilation=conv.input_dilation,
                    kernel_dilation=conv.kernel_dilation, feature_group_count=conv.feature_group_count,
                    use_bias=True, dtype=conv.dtype, param_dtype=kernel.dtype, precision=conv.precision,
                    preferred_element_type=conv.preferred_element_type, rngs=nnx.Rngs(0))
  out.kernel[...] = kernel
  out.bias[...] = bias
  return out
