"""Public convolution functions: lax's conv_general_dilated and conv1d/2d/3d, each one Plan (_normalize.py: every
argument check, at trace time) and one forward primitive (three for complex operands).
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv import _normalize
from jaxconv.primitives import rules
from jaxconv.spec import ACTIVATIONS, CHANNELS_FIRST, CHANNELS_LAST
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
def _conv(lhs, rhs, bias, *, fn, activation=None, **kwargs):
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  bias = None if bias is None else jnp.asarray(bias)
  p = _normalize.plan(lhs, rhs, bias, poison=_debug_poison, fn=fn, activation=activation, **kwargs)
  dts = p.dtypes
  if p.zero_d:  # the primitives take 1-3 spatial dims: a size-1 one, dropped from the result below
    lhs, rhs = lhs[..., None], rhs[..., None]
  integral = lambda dt: jnp.issubdtype(dt, jnp.integer) or dt == jnp.bool_  # int4/uint4 included
  converted = integral(lhs.dtype) and not integral(dts.operand_dtype)
  lhs, rhs = lhs.astype(dts.operand_dtype), rhs.astype(dts.operand_dtype)
  if converted:
    # Integer operands of a floating convolution: XLA:GPU folds convert(int8) -> convolution back into cuDNN's
    # integer convolution, whose sums came out wrong (grouped, odd channel counts); the barrier keeps the
    # floating convolution the plan runs, on the kernels and in the xla.conv variant alike.
    lhs, rhs = lax.optimization_barrier((lhs, rhs))
  fused = p.spec.has_bias or p.spec.activation is not None
  if dts.complex_parts:
    y = _complex_conv(lhs, rhs, p)
  else:
    y = _real_conv(lhs, rhs, bias if fused else None, p)
  y = _transpose(y, p.out_perm).astype(p.out_dtype)
  if p.zero_d:
    y = y[..., 0]
  if not fused and (bias is not None or activation is not None):
    # Types the epilogue does not take (integers, complex, 8-bit floats): XLA adds the bias and applies the
    # activation after the convolution.
    if bias is not None:
      y = y + lax.broadcast_in_dim(bias.astype(y.dtype), y.shape, (p.out_feature_axis,))
    if activation is not None:
      y = rules.activation_fn(activation)(y).astype(y.dtype)
  return y


def _real_conv(lhs, rhs, bias, p):
  """The convolution of real operands on the kernels, in the native layout (y before out_perm)."""
  x = _transpose(lhs.astype(p.compute_dtype), p.x_perm)
  w = _transpose(rhs.astype(p.compute_dtype), p.w_perm)
  if bias is not None:
    bias = bias.astype(p.kernel_out_dtype)
  if p.spec.algorithm == "auto":
    # Autotuning mode 'on': on a cache miss, time this convolution's three ops on the GPU now, while tracing,
    # so that the lowering (which picks per op from the cache) finds the choices. A no-op in the other modes.
    tuner.tune_on_trace(p.spec, x, w, p.kernel_out_dtype)
  return rules.conv_fwd(x, w, bias, p.spec, p.kernel_out_dtype)


def _complex_conv(lhs, rhs, p):
  """A complex convolution as three real ones (Gauss's product, the expansion lax lowers complex convolutions to on
  the CPU and GPU, so rounding matches lax's); differentiation follows from the real convolutions'."""
  xr, xi, wr, wi = lax.real(lhs), lax.imag(lhs), lax.real(rhs), lax.imag(rhs)
  conv = functools.partial(_real_conv, bias=None, p=p)
  k1 = conv(lax.add(xr, xi), wr)
  k2 = conv(xr, lax.sub(wi, wr))
  k3 = conv(xi, lax.add(wr, wi))
  return lax.complex(lax.sub(k1, k3), lax.add(k1, k2))


def _transpose(a, perm):
  return a if tuple(perm) == tuple(range(a.ndim)) else jnp.transpose(a, perm)


def conv_general_dilated(
    lhs, rhs, window_strides: Sequence[int], padding: Union[str, Sequence[tuple[int, int]]],
    lhs_dilation: Optional[Sequence[int]] = None, rhs_dilation: Optional[Sequence[int]] = None,
    dimension_numbers=None, feature_group_count: int = 1, batch_group_count: int = 1,
    precision=None, preferred_element_type=None, out_sharding=None):
  """Drop-in replacement for :func:`jax.lax.conv_general_dilated` running on jaxconv's kernels.

  Same signature, keyword names, dtypes and semantics as lax: 0 to 3 spatial dimensions; floating, complex,
  integer (wrapping like XLA's) and bool operands with lax's result types and ``preferred_element_type`` rules.
  Usable as ``flax.linen.Conv(..., conv_general_dilated=jaxconv.conv_general_dilated)`` and likewise for nnx.
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


# ---------------------------------------------------------------------------------------------------------
# conv1d / conv2d / conv3d.
# ---------------------------------------------------------------------------------------------------------
Activation = Union[None, str, Callable]
_SPATIAL = {1: "W", 2: "H, W", 3: "D, H, W"}
_WINDOW = {1: "KW", 2: "KH, KW", 3: "KD, KH, KW"}


def fused_activation(activation, fn):
  """The epilogue name of an activation the kernels fuse (a name, or jax.nn.relu, jax.nn.silu, jax.nn.gelu with
  approximate=True), None for no activation or another callable (applied by XLA after the fused conv + bias)."""
  if activation is None or isinstance(activation, str):
    if activation not in ACTIVATIONS:
      raise ValueError(f"{fn}: activation must be None, 'relu', 'gelu', 'silu' or a callable, got {activation!r}")
    return activation
  if not callable(activation):
    raise ValueError(f"{fn}: activation must be None, 'relu', 'gelu', 'silu' or a callable, got {activation!r}")
  if activation is jax.nn.relu:
    return "relu"
  if activation is jax.nn.silu or activation is getattr(jax.nn, "swish", None):
    return "silu"
  fn_, kw = activation, {}
  if isinstance(activation, functools.partial) and not activation.args:
    fn_, kw = activation.func, dict(activation.keywords)
  if fn_ is jax.nn.gelu and kw.get("approximate", True) is True and set(kw) <= {"approximate"}:
    return "gelu"  # jax.nn.gelu's default is the tanh approximation, the one the epilogue computes
  return None


def _layout_shapes(nsp, x_shape, w_shape, data_format):
  """(x channels, w in-features, w out-features) under a data_format."""
  if data_format == CHANNELS_LAST:
    return x_shape[-1], w_shape[-2], w_shape[-1]
  return x_shape[1], w_shape[1], w_shape[0]


def _check_conv_nd(nsp, x, w, bias, groups, data_format, fn):
  """The checks of conv1d/2d/3d in their own vocabulary (x, w, groups, data_format)."""
  if data_format not in (CHANNELS_LAST, CHANNELS_FIRST):
    raise ValueError(f"{fn}: data_format must be 'channels_last' or 'channels_first', got {data_format!r}")
  nd = nsp + 2
  layouts = {CHANNELS_LAST: (f"(N, {_SPATIAL[nsp]}, C)", f"({_WINDOW[nsp]}, C // groups, K)"),
             CHANNELS_FIRST: (f"(N, C, {_SPATIAL[nsp]})", f"(K, C // groups, {_WINDOW[nsp]})")}
  x_form, w_form = layouts[data_format]
  for name, a, form in (("x", x, x_form), ("w", w, w_form)):
    if a.ndim != nd:
      raise ValueError(f"{fn}: {name} must have rank {nd} ({nsp} spatial dims, {form} for data_format="
                       f"{data_format!r}), got shape {tuple(a.shape)}")
  if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
    raise ValueError(f"{fn}: groups must be a positive integer, got {groups!r}")
  c, cg, k = _layout_shapes(nsp, x.shape, w.shape, data_format)
  if c != cg * groups or k % groups:
    other = CHANNELS_FIRST if data_format == CHANNELS_LAST else CHANNELS_LAST
    oc, ocg, ok = _layout_shapes(nsp, x.shape, w.shape, other)
    hint = (f"; x and w fit data_format={other!r} (x {layouts[other][0]}, w {layouts[other][1]})"
            if oc == ocg * groups and ok % groups == 0 and ok > 0 else "")
    if c != cg * groups:
      raise ValueError(f"{fn}: x has {c} channels (shape {tuple(x.shape)}, x is {x_form}) but w expects "
                       f"{cg} * groups = {cg * groups} (w shape {tuple(w.shape)}, w is {w_form}, groups={groups})"
                       f"{hint}")
    raise ValueError(f"{fn}: w's {k} output channels (w shape {tuple(w.shape)}, w is {w_form}) are not a multiple "
                     f"of groups={groups}{hint}")
  if bias is not None and tuple(jnp.shape(bias)) != (k,):
    raise ValueError(f"{fn}: bias must have shape ({k},), one value per output channel of w {tuple(w.shape)}, got "
                     f"{tuple(jnp.shape(bias))}")


def _alias(fn, name, value, alias_names, aliases, default):
  """The value of an argument given under its name or one alias (a ValueError for two different values)."""
  given = {n: v for n, v in ((name, value), *zip(alias_names, aliases)) if v is not None}
  if len(given) > 1 and len({repr(v) for v in given.values()}) > 1:
    raise ValueError(f"{fn}: {' and '.join(given)} are the same argument; pass one of them, got {given}")
  return next(iter(given.values())) if given else default


def _conv_nd(nsp, x, w, bias, *, stride, strides, padding, dilation, rhs_dilation, kernel_dilation, groups,
             activation, data_format, precision, preferred_element_type, algorithm):
  fn = f"conv{nsp}d"
  stride = _alias(fn, "stride", stride, ("strides",), (strides,), 1)
  dilation = _alias(fn, "dilation", dilation, ("rhs_dilation", "kernel_dilation"), (rhs_dilation, kernel_dilation),
                    1)
  x, w = jnp.asarray(x), jnp.asarray(w)
  _check_conv_nd(nsp, x, w, bias, groups, data_format, fn)
  named = fused_activation(activation, fn)
  nd = nsp + 2
  if data_format == CHANNELS_LAST:
    dn = lax.ConvDimensionNumbers((0, nd - 1, *range(1, nd - 1)), (nd - 1, nd - 2, *range(nd - 2)),
                                  (0, nd - 1, *range(1, nd - 1)))
  else:
    dn = lax.ConvDimensionNumbers(tuple(range(nd)), tuple(range(nd)), tuple(range(nd)))
  y = _conv(x, w, bias, window_strides=_normalize.int_tuple(stride, nsp, "stride", fn),
            padding=_normalize.padding_for_conv_nd(padding, nsp, fn), lhs_dilation=None,
            rhs_dilation=_normalize.int_tuple(dilation, nsp, "dilation", fn, error=TypeError),
            dimension_numbers=dn, feature_group_count=groups, batch_group_count=1, precision=precision,
            preferred_element_type=preferred_element_type, activation=named, algorithm=algorithm, fn=fn,
            groups_name="groups")
  if activation is not None and named is None:
    y = activation(y)  # a callable the epilogue does not know: applied by XLA after the fused conv + bias
  return y


_CONV_ND_DOC = """{n}-D convolution on jaxconv's kernels, with an optional fused bias and activation.

  Args:
    x: input, (N, {sp}, C) for channels_last or (N, C, {sp}) for channels_first.
    w: filter, ({win}, C // groups, K) for channels_last or (K, C // groups, {win}) for channels_first.
    bias: optional (K,) vector added before the activation.
    stride: int or {n} ints (default 1); ``strides`` is the same argument under Flax's name.
    padding: 'SAME', 'SAME_LOWER', 'VALID', an int, {n} ints (symmetric) or {n} (low, high) pairs.
    dilation: filter dilation, int or {n} ints (default 1); ``rhs_dilation`` (lax's name) and ``kernel_dilation``
      (Flax's) are the same argument.
    groups: feature groups (groups == C == K is depthwise).
    activation: None, 'relu', 'gelu' (tanh approximation, as jax.nn.gelu) or 'silu', or a callable:
      jax.nn.relu, jax.nn.silu and jax.nn.gelu (approximate=True) are fused into the kernel's epilogue like their
      names; any other callable is applied after the fused conv + bias. Under differentiation the activation is
      applied by XLA on the fused conv + bias.
    data_format: 'channels_last' (default) or 'channels_first'.
    precision, preferred_element_type: as for lax.conv_general_dilated (every dtype lax takes).
    algorithm: 'auto' (default) or the name of one kernel family or variant to force (experts and tests).

  Returns:
    activation(conv(x, w) + bias), laid out like x.
"""


def conv1d(x, w, bias=None, *, stride: Union[int, Sequence[int], None] = None,
           padding: Union[str, int, Sequence] = "VALID", dilation: Union[int, Sequence[int], None] = None,
           groups: int = 1, activation: Activation = None, data_format: str = CHANNELS_LAST, precision=None,
           preferred_element_type=None, algorithm: str = "auto", strides=None, rhs_dilation=None,
           kernel_dilation=None):
  return _conv_nd(1, x, w, bias, stride=stride, strides=strides, padding=padding, dilation=dilation,
                  rhs_dilation=rhs_dilation, kernel_dilation=kernel_dilation, groups=groups, activation=activation,
                  data_format=data_format, precision=precision, preferred_element_type=preferred_element_type,
                  algorithm=algorithm)


def conv2d(x, w, bias=None, *, stride: Union[int, Sequence[int], None] = None,
           padding: Union[str, int, Sequence] = "VALID", dilation: Union[int, Sequence[int], None] = None,
           groups: int = 1, activation: Activation = None, data_format: str = CHANNELS_LAST, precision=None,
           preferred_element_type=None, algorithm: str = "auto", strides=None, rhs_dilation=None,
           kernel_dilation=None):
  return _conv_nd(2, x, w, bias, stride=stride, strides=strides, padding=padding, dilation=dilation,
                  rhs_dilation=rhs_dilation, kernel_dilation=kernel_dilation, groups=groups, activation=activation,
                  data_format=data_format, precision=precision, preferred_element_type=preferred_element_type,
                  algorithm=algorithm)


def conv3d(x, w, bias=None, *, stride: Union[int, Sequence[int], None] = None,
           padding: Union[str, int, Sequence] = "VALID", dilation: Union[int, Sequence[int], None] = None,
           groups: int = 1, activation: Activation = None, data_format: str = CHANNELS_LAST, precision=None,
           preferred_element_type=None, algorithm: str = "auto", strides=None, rhs_dilation=None,
           kernel_dilation=None):
  return _conv_nd(3, x, w, bias, stride=stride, strides=strides, padding=padding, dilation=dilation,
                  rhs_dilation=rhs_dilation, kernel_dilation=kernel_dilation, groups=groups, activation=activation,
                  data_format=data_format, precision=precision, preferred_element_type=preferred_element_type,
                  algorithm=algorithm)


conv1d.__doc__ = _CONV_ND_DOC.format(n=1, sp="W", win="KW")
conv2d.__doc__ = _CONV_ND_DOC.format(n=2, sp="H, W", win="KH, KW")
conv3d.__doc__ = _CONV_ND_DOC.format(n=3, sp="D, H, W", win="KD, KH, KW")
