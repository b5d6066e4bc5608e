"""Public convolution functions: lax's conv_general_dilated and conv1d/2d/3d, each one Plan (_normalize.py: every
argument check, at trace time) and one forward primitive.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
from jax import lax

from jaxconv import _normalize
from jaxconv.primitives import rules
from jaxconv.spec import CHANNELS_FIRST, CHANNELS_LAST
from jaxconv.tuning import tuner

_debug_poison = os.environ.get("JAXCONV_DEBUG_POISON", "0") not in ("", "0")


def set_debug_poison(enabled: bool) -> None:
  """Debug mode: the handlers fill outputs (and scratch) with NaN before each kernel, so that any element a
  kernel fails to write shows up. Applies to convolutions traced after the call."""
  global _debug_poison
  _debug_poison = bool(enabled)


def debug_poison() -> bool:
  return _debug_poison


# ---------------------------------------------------------------------------------------------------------
# The one path every public function takes.
# ---------------------------------------------------------------------------------------------------------
def _conv(lhs, rhs, bias, *, fn, **kwargs):
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  bias = None if bias is None else jnp.asarray(bias)
  p = _normalize.plan(lhs, rhs, bias, poison=_debug_poison, fn=fn, **kwargs)
  x = _transpose(lhs.astype(p.compute_dtype), p.x_perm)
  w = _transpose(rhs.astype(p.compute_dtype), p.w_perm)
  if bias is not None:
    bias = bias.astype(p.kernel_out_dtype)
  if p.spec.algorithm == "auto":
    # Autotuning mode 'on': on a cache miss, time this convolution's three ops on the GPU now, while tracing,
    # so that the lowering (which picks per op from the cache) finds the choices. A no-op in the other modes.
    tuner.tune_on_trace(p.spec, x, w, p.kernel_out_dtype)
  y = rules.conv_fwd(x, w, bias, p.spec, p.kernel_out_dtype)
  return _transpose(y, p.out_perm).astype(p.out_dtype)


def _transpose(a, perm):
  return a if tuple(perm) == tuple(range(a.ndim)) else jnp.transpose(a, perm)


def conv_general_dilated(
    lhs, rhs, window_strides: Sequence[int], padding: Union[str, Sequence[tuple[int, int]]],
    lhs_dilation: Optional[Sequence[int]] = None, rhs_dilation: Optional[Sequence[int]] = None,
    dimension_numbers=None, feature_group_count: int = 1, batch_group_count: int = 1,
    precision=None, preferred_element_type=None, out_sharding=None):
  """Drop-in replacement for :func:`jax.lax.conv_general_dilated` running on jaxconv's kernels.

  Same signature, keyword names and semantics as lax (1 to 3 spatial dimensions). Usable as
  ``flax.linen.Conv(..., conv_general_dilated=jaxconv.conv_general_dilated)`` and likewise for nnx.
  ``precision`` HIGHEST computes in true float32; bfloat16/float16 inputs accumulate in float32.
  """
  y = _conv(lhs, rhs, None, window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
            rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
            feature_group_count=feature_group_count, batch_group_count=batch_group_count,
            precision=precision, preferred_element_type=preferred_element_type, activation=None,
            algorithm="auto", fn="conv_general_dilated")
  if out_sharding is not None:
    y = jax.sharding.reshard(y, out_sharding)
  return y


def _conv_nd(nsp, x, w, bias=None, *, stride=1, padding="VALID", dilation=1, groups=1, activation=None,
             data_format="channels_last", precision=None, preferred_element_type=None, algorithm="auto"):
  fn = f"conv{nsp}d"
  if data_format not in (CHANNELS_LAST, CHANNELS_FIRST):
    raise ValueError(f"{fn}: data_format must be 'channels_last' or 'channels_first', got {data_format!r}")
  x, w = jnp.asarray(x), jnp.asarray(w)
  for name, a in (("x", x), ("w", w)):
    if a.ndim != nsp + 2:
      raise ValueError(f"{fn}: {name} must have rank {nsp + 2} ({nsp} spatial dims), got shape {a.shape}")
  nd = nsp + 2
  if data_format == CHANNELS_LAST:
    dn = lax.ConvDimensionNumbers((0, nd - 1, *range(1, nd - 1)), (nd - 1, nd - 2, *range(nd - 2)),
                                  (0, nd - 1, *range(1, nd - 1)))
  else:
    dn = lax.ConvDimensionNumbers(tuple(range(nd)), tuple(range(nd)), tuple(range(nd)))
  return _conv(x, w, bias, window_strides=_normalize.int_tuple(stride, nsp, "stride", fn),
               padding=_normalize.padding_for_conv_nd(padding, nsp, fn), lhs_dilation=None,
               rhs_dilation=_normalize.int_tuple(dilation, nsp, "dilation", fn, error=TypeError),
               dimension_numbers=dn,
               feature_group_count=groups, batch_group_count=1, precision=precision,
               preferred_element_type=preferred_element_type, activation=activation, algorithm=algorithm,
               fn=fn, groups_name="groups")


_CONV_ND_DOC = """{n}-D convolution on jaxconv's kernels, with an optional fused bias and activation.

  Args:
    x: input, (N, {sp}, C) for channels_last or (N, C, {sp}) for channels_first.
    w: filter, ({win}, C // groups, K) for channels_last or (K, C // groups, {win}) for channels_first.
    bias: optional (K,) vector added before the activation.
    stride: int or {n} ints. dilation: filter dilation, int or {n} ints.
    padding: 'SAME', 'SAME_LOWER', 'VALID', an int, {n} ints (symmetric) or {n} (low, high) pairs.
    groups: feature groups (groups == C == K is depthwise).
    activation: None, 'relu', 'gelu' (tanh approximation, as jax.nn.gelu) or 'silu'; fused into the
      kernel's epilogue (under differentiation the activation is applied by XLA on the fused conv + bias).
    data_format: 'channels_last' (default) or 'channels_first'.
    precision, preferred_element_type: as for lax.conv_general_dilated.
    algorithm: 'auto' (default) or the name of one kernel family to force (experts and tests).

  Returns:
    act(conv(x, w) + bias), laid out like x.
"""


def conv1d(x, w, bias=None, **kwargs):
  return _conv_nd(1, x, w, bias, **kwargs)


def conv2d(x, w, bias=None, **kwargs):
  return _conv_nd(2, x, w, bias, **kwargs)


def conv3d(x, w, bias=None, **kwargs):
  return _conv_nd(3, x, w, bias, **kwargs)


conv1d.__doc__ = _CONV_ND_DOC.format(n=1, sp="W", win="KW")
conv2d.__doc__ = _CONV_ND_DOC.format(n=2, sp="H, W", win="KH, KW")
conv3d.__doc__ = _CONV_ND_DOC.format(n=3, sp="D, H, W", win="KD, KH, KW")
