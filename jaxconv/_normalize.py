"""lax's convolution arguments -> one Plan (a ConvSpec, the layout transposes and the dtypes), with every check.

Shared by the public functions (api.py) and autotuning (tuning/tuner.py). Every invalid argument raises TypeError or
ValueError here, at trace time, naming the argument, with lax's exception type and wording where lax has one.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv import _dtypes, registry
from jaxconv.spec import ACTIVATIONS, CHANNELS_LAST, ConvSpec

# The largest spatial extent (input, window, output), and the largest stride, dilation and padding magnitude, the
# kernels take: csrc/core/conv_params.h's kMaxExtent and kMaxStep (the handlers refuse larger ones again).
MAX_EXTENT = 2 ** 32
MAX_STEP = 2 ** 30


class PaddingTypeError(ValueError, RuntimeError):
  """An unknown padding string: lax raises RuntimeError for it; a ValueError is what the argument error is."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """One convolution as the primitives run it. lhs and rhs (with a size-1 spatial dim appended when zero_d) are
  converted to dtypes.operand_dtype; x = transpose(lhs, x_perm) and w = transpose(rhs, w_perm) in the spec's native
  layout and dtypes.compute_dtype (the real and imaginary parts when dtypes.complex_parts); y_native = conv_fwd(x, w)
  in dtypes.kernel_out_dtype; transpose(y_native, out_perm) cast to dtypes.out_dtype (and, when zero_d, without its
  last axis) is the result lax would return."""
  spec: ConvSpec
  x_perm: Tuple[int, ...]
  w_perm: Tuple[int, ...]
  out_perm: Tuple[int, ...]
  dtypes: _dtypes.DTypePlan
  nck: Tuple[int, int, int]
  zero_d: bool = False
  out_feature_axis: int = 1  # the result's feature axis (where an unfused bias is added)

  @property
  def compute_dtype(self) -> np.dtype:
    return self.dtypes.compute_dtype

  @property
  def kernel_out_dtype(self) -> np.dtype:
    return self.dtypes.kernel_out_dtype

  @property
  def out_dtype(self) -> np.dtype:
    return self.dtypes.out_dtype

  def expanded(self, shape) -> Tuple[int, ...]:
    """An operand's shape as the spec sees it (a 0-D convolution's with its size-1 spatial dim)."""
    return (*shape, 1) if self.zero_d else tuple(shape)


def int_tuple(value, n, name, fn, *, minimum=1, default=1, error=ValueError, length_error=None, range_error=None):
  """An int or a sequence of n ints, each >= minimum (else `error`, the exception type lax raises, with range_error's
  message if given); length_error: the message for a wrong length."""
  if value is None:
    return (default,) * n
  if isinstance(value, (int, np.integer)):
    value = (value,) * n
  try:
    out = tuple(operator.index(v) for v in value)
  except TypeError:
    raise TypeError(f"{fn}: {name} must be an integer or a sequence of {n} integers, got {value!r}") from None
  if len(out) != n:
    raise ValueError(length_error or f"{fn}: {name} must have one entry per spatial dimension ({n}), got {value!r}")
  if any(v < minimum for v in out):
    raise error(range_error or f"{fn}: {name} entries must be >= {minimum}, got {value!r}")
  return out


def _canonical_precision(precision, fn) -> str:
  """lax's precision forms (None, str, lax.Precision, or a pair) -> 'default' | 'high' | 'highest'."""
  if precision is None:
    precision = jax.config.jax_default_matmul_precision
    if precision is None:
      return "default"
  items = precision if isinstance(precision, (tuple, list)) else (precision,)
  if len(items) not in (1, 2):
    raise ValueError(f"{fn}: precision must be None, a lax.Precision, a string or a pair of them, "
                     f"got {precision!r}")
  level = 0
  for p in items:
    try:
      p = p if isinstance(p, lax.Precision) else lax.Precision(p)
    except (ValueError, TypeError, KeyError):
      raise ValueError(f"{fn}: precision must be None, a lax.Precision, one of the strings 'default', "
                       f"'high', 'highest', 'bfloat16', 'tensorfloat32', 'float32', or a pair of them; "
                       f"got {precision!r}") from None
    level = max(level, {lax.Precision.DEFAULT: 0, lax.Precision.HIGH: 1, lax.Precision.HIGHEST: 2}[p])
  return ("default", "high", "highest")[level]


def _normalize_padding(padding, in_spatial, window, strides, rhs_dilation, lhs_dilation, fn):
  n = len(in_spatial)
  if isinstance(padding, str):
    if any(d != 1 for d in lhs_dilation):  # as lax: the string forms are undefined for transposed convs
      raise ValueError(f"{fn}: String padding is not implemented for transposed convolution (lhs_dilation "
                       f"{tuple(lhs_dilation)}, padding {padding!r}). Please either exactly specify the required "
                       "padding or use conv_transpose.")
    if padding.upper() not in ("SAME", "SAME_LOWER", "VALID"):
      raise PaddingTypeError(f"{fn}: Unrecognized padding type: expected 'VALID', 'SAME', or 'SAME_LOWER', got "
                             f"{padding} (padding must be one of these strings or a sequence of {n} (low, high) "
                             "integer pairs).")
    eff_window = [0 if k == 0 else (k - 1) * d + 1 for k, d in zip(window, rhs_dilation)]
    return tuple((int(lo), int(hi)) for lo, hi in
                 lax.padtype_to_pads(in_spatial, eff_window, strides, padding.upper()))
  try:
    if not all(len(p) == 2 for p in padding):
      raise ValueError
    pads = tuple((operator.index(p[0]), operator.index(p[1])) for p in padding)
  except (TypeError, ValueError, IndexError):
    raise ValueError(f"{fn}: padding argument to conv_general_dilated should be a string or a sequence of "
                     f"(low, high) pairs, got {padding!r}") from None
  if len(pads) != n:
    raise TypeError(f"{fn}: Wrong number of explicit pads for convolution: expected {n}, got {len(pads)} "
                    f"(padding={padding!r}).")
  return pads


def _check_padding(pads, in_spatial, lhs_dilation, fn):
  for i, ((lo, hi), size, ld) in enumerate(zip(pads, in_spatial, lhs_dilation)):
    if abs(lo) > MAX_STEP or abs(hi) > MAX_STEP:
      raise ValueError(f"{fn}: padding {(lo, hi)} of spatial dimension {i} has a magnitude above 2^30, more than "
                       "jaxconv's kernels take")
    dilated = 0 if size == 0 else (size - 1) * ld + 1
    if dilated + lo + hi < 0:  # lax's rule: the padded input may be empty, not negative
      raise ValueError(f"{fn}: Negative padding is larger than the size of the corresponding dimension: got "
                       f"padding={tuple(pads)} for lhs spatial dimension {i} of (dilated) size {dilated}")


def _check_magnitudes(spec: ConvSpec, fn):
  """The bounds of csrc/core/conv_params.h's DecodeParams, at trace time and naming the argument."""
  named = (("window_strides", spec.strides), ("lhs_dilation", spec.lhs_dilation),
           ("rhs_dilation", spec.rhs_dilation))
  for name, values in named:
    if any(v > MAX_STEP for v in values):
      raise ValueError(f"{fn}: {name} {tuple(values)} has an entry above 2^30, more than jaxconv's kernels take")
  for name, values in (("lhs (input) spatial", spec.in_spatial), ("rhs (window) spatial", spec.window),
                       ("output spatial", spec.out_spatial)):
    if any(v > MAX_EXTENT for v in values):
      raise ValueError(f"{fn}: the {name} sizes {tuple(values)} exceed 2^32, more than jaxconv's kernels take "
                       "(the output follows from the input, window, window_strides, padding and dilations)")


def padding_for_conv_nd(padding, n, fn):
  """conv_nd's padding forms: a string, an int, n ints (symmetric), or n (lo, hi) pairs."""
  if isinstance(padding, str):
    return padding
  if isinstance(padding, (int, np.integer)):
    return ((int(padding), int(padding)),) * n
  try:
    items = list(padding)
  except TypeError:
    raise TypeError(f"{fn}: padding must be a string, an int, or a sequence, got {padding!r}") from None
  if items and all(isinstance(p, (int, np.integer)) for p in items):
    if len(items) != n:
      raise ValueError(f"{fn}: padding must have one entry per spatial dimension ({n}), got {padding!r}")
    return tuple((int(p), int(p)) for p in items)
  return items


def _dimension_numbers(lhs, rhs, dimension_numbers, fn):
  """lax's ConvDimensionNumbers, with lax's errors: lax.conv_dimension_numbers' TypeErrors (a rank mismatch among
  them) and, for a ConvDimensionNumbers given as is, its shape rule's ValueError for a rank mismatch."""
  if lhs.ndim != rhs.ndim and isinstance(dimension_numbers, lax.ConvDimensionNumbers):
    raise ValueError(f"{fn}: conv_general_dilated lhs and rhs must have the same number of dimensions, but got "
                     f"{tuple(lhs.shape)} and {tuple(rhs.shape)}.")
  try:
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  except TypeError as e:
    raise TypeError(f"{fn}: {e}") from None
  if not 2 <= lhs.ndim <= 5:
    raise ValueError(f"{fn}: lhs must have 0 to 3 spatial dimensions (rank 2 to 5), got shape {tuple(lhs.shape)}")
  for name, perm in zip(("lhs_spec", "rhs_spec", "out_spec"), dn):
    if sorted(int(a) for a in perm) != list(range(lhs.ndim)):
      raise ValueError(f"{fn}: dimension_numbers.{name} {tuple(perm)} is not a permutation of the {lhs.ndim} "
                       "dimensions of lhs and rhs")
  return dn


def plan(lhs, rhs, bias=None, *, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
         dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
         preferred_element_type=None, activation=None, algorithm="auto", poison=False, fn,
         groups_name="feature_group_count") -> Plan:
  """Checks every argument of a convolution (lhs, rhs, bias: anything with .shape and .dtype) and returns its Plan;
  TypeError or ValueError naming the argument, in lax's wording where lax has one."""
  in_dtype = _dtypes.check_operands(lhs.dtype, rhs.dtype, fn)
  lhs_spec, rhs_spec, out_spec = _dimension_numbers(lhs, rhs, dimension_numbers, fn)
  nsp = lhs.ndim - 2
  strides = int_tuple(window_strides, nsp, "window_strides", fn, length_error=(
      f"{fn} window and window_strides must have the same number of dimensions, but got {nsp} "
      f"and {len(window_strides) if hasattr(window_strides, '__len__') else window_strides!r} "
      f"(window_strides={window_strides!r})"))
  # lax raises TypeError ("All dilations must be positive") for these.
  lhs_dil, rhs_dil = (int_tuple(v, nsp, name, fn, error=TypeError,
                                range_error=f"{fn}: All dilations must be positive, got {v!r} ({name}).")
                      for name, v in (("lhs_dilation", lhs_dilation), ("rhs_dilation", rhs_dilation)))
  for name, v in ((groups_name, feature_group_count), ("batch_group_count", batch_group_count)):
    if not isinstance(v, (int, np.integer)) or v < 1:
      raise ValueError(f"{fn}: {name} must be a positive integer, got {v!r}")
  g, b = int(feature_group_count), int(batch_group_count)
  n, c = lhs.shape[lhs_spec[0]], lhs.shape[lhs_spec[1]]
  k, cg = rhs.shape[rhs_spec[0]], rhs.shape[rhs_spec[1]]
  if g > 1 and b > 1:
    raise ValueError(f"{fn}: at most one of batch_group_count and {groups_name} may be > 1, got "
                     f"batch_group_count={b} and {groups_name}={g}")
  if c % g:
    raise ValueError(f"{fn}: {groups_name} must divide lhs feature dimension size, but {g} does not "
                     f"divide {c}.")
  if c // g != cg:
    raise ValueError(f"{fn}: lhs feature dimension size divided by {groups_name} must equal the rhs "
                     f"input feature dimension size, but {c} // {g} != {cg}.")
  if k % g:
    raise ValueError(f"{fn}: rhs output feature dimension size must be a multiple of {groups_name}, "
                     f"but {k} is not a multiple of {g}.")
  if n % b:
    raise ValueError(f"{fn}: batch_group_count must divide lhs batch dimension size, but {b} does not "
                     f"divide {n}.")
  if k % b:
    raise ValueError(f"{fn}: rhs output feature dimension size must be a multiple of batch_group_count, "
                     f"but {k} is not a multiple of {b}.")
  in_spatial = tuple(int(lhs.shape[a]) for a in lhs_spec[2:])
  window = tuple(int(rhs.shape[a]) for a in rhs_spec[2:])
  pads = _normalize_padding(padding, in_spatial, window, strides, rhs_dil, lhs_dil, fn)
  _check_padding(pads, in_spatial, lhs_dil, fn)
  prec = _canonical_precision(precision, fn)
  if activation not in ACTIVATIONS:
    raise ValueError(f"{fn}: activation must be one of None, 'relu', 'gelu', 'silu', got {activation!r}")
  try:
    registry.request_code(algorithm)
  except ValueError as e:
    raise ValueError(f"{fn}: {e}") from None
  dts = _dtypes.route(in_dtype, _dtypes.check_preferred(in_dtype, preferred_element_type, fn), fn)
  if bias is not None:
    if tuple(bias.shape) != (k,):
      raise ValueError(f"{fn}: bias must have shape ({k},) (one value per output feature), got {bias.shape}")
    if not (jnp.issubdtype(bias.dtype, jnp.number) or bias.dtype == np.dtype(bool)):
      raise TypeError(f"{fn}: bias must be numeric, got {bias.dtype}")
    if jnp.issubdtype(dts.out_dtype, jnp.floating) and not jnp.issubdtype(bias.dtype, jnp.floating):
      raise TypeError(f"{fn}: bias must be floating point for a {dts.out_dtype} result, got {bias.dtype}")
  if (bias is not None or activation is not None) and not dts.fusable and algorithm != registry.AUTO:
    raise ValueError(f"{fn}: algorithm={algorithm!r} cannot fuse a bias or activation into a {in_dtype} convolution "
                     "(XLA applies them after the convolution; leave algorithm='auto')")

  zero_d = nsp == 0
  out_feature_axis = int(out_spec[1])
  if zero_d:  # no spatial dims: a 1-D convolution over a size-1 spatial dim appended to every operand
    lhs_spec, rhs_spec, out_spec = ((*spec, 2) for spec in (lhs_spec, rhs_spec, out_spec))
    in_spatial, window, strides, pads, lhs_dil, rhs_dil = (1,), (1,), (1,), ((0, 0),), (1,), (1,)
  ndim = len(lhs_spec)
  # Every layout runs channels-last, where the fast kernels are (tensor cores read channel vectors): XLA transposes
  # other layouts around the call, as it does for lax's own convolutions on the GPU, and fuses the transposes with
  # neighbouring ops where it can.
  layout = CHANNELS_LAST
  x_perm = (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])
  w_perm = (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])
  y_logical = (0, *range(2, ndim), 1)  # native y axis -> logical (0 batch, 1 feature, 2.. spatial)
  fused = dts.fusable
  spec = ConvSpec(layout=layout, in_spatial=in_spatial, window=window, strides=strides, padding=pads,
                  lhs_dilation=lhs_dil, rhs_dilation=rhs_dil, feature_groups=g, batch_groups=b,
                  precision=prec, activation=activation if fused else None, has_bias=bias is not None and fused,
                  algorithm=algorithm, poison=poison)
  _check_magnitudes(spec, fn)
  if algorithm != registry.AUTO and registry.has_kernels():
    # A forced request is checked against the GPU predicates of its forward op now, on the CPU too, so that a
    # program fails the same way on both platforms (the CPU runs every problem with its one kernel set); a
    # variant without a forward kernel hands the forward to its family.
    fwd = spec.replace(algorithm=registry.op_request("fwd", algorithm))
    choice = registry.resolve("fwd", fwd.ffi_params(n, c, k), dts.compute_dtype, dts.kernel_out_dtype)
    if not choice.ok:
      raise ValueError(f"{fn}: algorithm={algorithm!r} cannot run this convolution: {choice.why}")
  # Output axis a holds logical dim argsort(out_spec)[a]; find where the native result keeps it.
  out_perm = tuple(y_logical.index(int(l)) for l in np.argsort(out_spec))
  return Plan(spec=spec, x_perm=tuple(int(a) for a in x_perm), w_perm=tuple(int(a) for a in w_perm),
              out_perm=out_perm, dtypes=dts, nck=(int(n), int(c), int(k)), zero_d=zero_d,
              out_feature_axis=out_feature_axis)
