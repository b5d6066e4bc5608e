"""What the linen and nnx modules share: Flax Conv's argument handling, then one jaxconv call.

The semantics follow flax's Conv exactly (padding strings including 'CIRCULAR', 'REFLECT' and 'CAUSAL',
any number of leading batch dimensions, a missing batch dimension, mask, input and kernel dilation); only
the convolution itself and the bias (and the optional activation) run on jaxconv's kernels.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

import jaxconv

from jaxconv.primitives import activation_fn
from jaxconv.spec import ACTIVATIONS  # the names the kernels' epilogue fuses
_CONV_ND = {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}

Activation = Union[None, str, Callable[[jax.Array], jax.Array]]


def check_activation(activation: Activation, where: str) -> None:
  if activation in ACTIVATIONS or callable(activation):
    return
  raise ValueError(f"{where}: activation must be None, 'relu', 'gelu', 'silu' or a callable, "
                   f"got {activation!r}")


def _broadcast(value, n: int) -> tuple[int, ...]:
  if value is None:  # flax's backward-compatible sentinel for 1
    value = 1
  if isinstance(value, (int, np.integer)):
    return (int(value),) * n
  return tuple(int(v) for v in value)


def canonicalize_padding(padding, rank: int):
  """Flax's padding forms -> a string or a tuple of rank (low, high) pairs (as flax.linen does)."""
  if isinstance(padding, str):
    return padding
  if isinstance(padding, (int, np.integer)):
    return ((int(padding), int(padding)),) * rank
  items = list(padding)
  if len(items) == rank:
    out = []
    for p in items:
      if isinstance(p, (int, np.integer)):
        out.append((int(p), int(p)))
      elif len(p) == 1:
        out.append((int(p[0]), int(p[0])))
      elif len(p) == 2:
        out.append((int(p[0]), int(p[1])))
      else:
        break
    else:
      return tuple(out)
  raise ValueError(f"Invalid padding format: {padding!r}, should be str, int, or a sequence of len "
                   f"{rank} where each element is an int or a pair of ints.")


def conv_bias_act(inputs, kernel, bias, *, kernel_size: Sequence[int], strides, padding, input_dilation,
                  kernel_dilation, feature_group_count: int, precision, activation: Activation = None,
                  preferred_element_type=None, out_sharding=None):
  """Flax Conv's forward computation (inputs channels-last, kernel HWIO) followed by an activation.

  Runs as one fused jaxconv call (convolution, bias and a named activation in the kernel's epilogue)
  whenever the convolution has no input dilation and no output sharding; otherwise the convolution runs
  on jaxconv.conv_general_dilated and XLA adds the bias and applies the activation. jax.nn.relu, jax.nn.silu
  and jax.nn.gelu (approximate=True) fuse as their names do; another callable activation is applied by XLA
  after the (fused) conv + bias.
  """
  kernel_size = tuple(kernel_size)
  nsp = len(kernel_size)
  if not 1 <= nsp <= 3:
    raise ValueError(f"jaxconv.flax: 1 to 3 spatial dimensions are supported, got kernel_size "
                     f"{kernel_size}")
  # All leading batch dimensions fold into one (none: add one), as flax does.
  num_batch = inputs.ndim - (nsp + 1)
  batch_shape = inputs.shape[:num_batch]
  if num_batch != 1:
    inputs = jnp.reshape(inputs, (-1,) + inputs.shape[num_batch:])

  strides = _broadcast(strides, nsp)
  input_dilation = _broadcast(input_dilation, nsp)
  kernel_dilation = _broadcast(kernel_dilation, nsp)
  pad = canonicalize_padding(padding, nsp)
  if isinstance(pad, str) and pad.upper() in ("CIRCULAR", "REFLECT"):
    dilated = [(k - 1) * d + 1 for k, d in zip(kernel_size, kernel_dilation)]
    pads = [(0, 0)] + [((k - 1) // 2, k // 2) for k in dilated] + [(0, 0)]
    inputs = jnp.pad(inputs, pads, mode={"CIRCULAR": "wrap", "REFLECT": "reflect"}[pad.upper()])
    pad = "VALID"
  elif isinstance(pad, str) and pad.upper() == "CAUSAL":
    if nsp != 1:
      raise ValueError("Causal padding is only implemented for 1D convolutions.")
    inputs = jnp.pad(inputs, [(0, 0), (kernel_dilation[0] * (kernel_size[0] - 1), 0), (0, 0)])
    pad = "VALID"

  # Fusable into the kernel's epilogue: a name, or jax.nn.relu / silu / gelu (tanh form) as those names.
  named = jaxconv.api.fused_activation(activation, "jaxconv.flax")
  if all(d == 1 for d in input_dilation) and out_sharding is None:
    y = _CONV_ND[nsp](inputs, kernel, bias, stride=strides, padding=pad, dilation=kernel_dilation,
                      groups=feature_group_count, activation=named, precision=precision,
                      preferred_element_type=preferred_element_type)
  else:
    nd = nsp + 2
    dn = jax.lax.ConvDimensionNumbers((0, nd - 1, *range(1, nd - 1)), (nd - 1, nd - 2, *range(nd - 2)),
                                      (0, nd - 1, *range(1, nd - 1)))
    y = jaxconv.conv_general_dilated(inputs, kernel, strides, pad, lhs_dilation=input_dilation,
                                     rhs_dilation=kernel_dilation, dimension_numbers=dn,
                                     feature_group_count=feature_group_count, precision=precision,
                                     preferred_element_type=preferred_element_type,
                                     out_sharding=out_sharding)
    if bias is not None:
      y = y + bias.astype(y.dtype)
    if named is not None:
      y = activation_fn(named)(y)
  if activation is not None and named is None:
    y = activation(y)  # a user callable, applied by XLA after the conv + bias

  if num_batch != 1:
    y = jnp.reshape(y, batch_shape + y.shape[1:])
  return y
