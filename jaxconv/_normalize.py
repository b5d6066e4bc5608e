"""lax's convolution arguments -> one Plan (a ConvSpec, the layout transposes and the dtypes), with every check.

Shared by the public functions (api.py) and autotuning (tuning/tuner.py). Every invalid argument raises TypeError or
ValueError here, at trace time, naming the argument, in the wording lax uses where lax has one.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxconv import registry
from jaxconv.spec import ACTIVATIONS, CHANNELS_LAST, ConvSpec

_SUPPORTED_DTYPES = tuple(np.dtype(d) for d in (jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16))


@dataclasses.dataclass(frozen=True)
class Plan:
  """One convolution as the primitives run it: x = transpose(lhs, x_perm) and w = transpose(rhs, w_perm) in the
  spec's native layout and compute dtype, y_native = conv_fwd(x, w) in kernel_out_dtype, then
  transpose(y_native, out_perm) cast to out_dtype is the result lax would return."""
  spec: ConvSpec
  x_perm: Tuple[int, ...]
  w_perm: Tuple[int, ...]
  out_perm: Tuple[int, ...]
  compute_dtype: np.dtype
  kernel_out_dtype: np.dtype
  out_dtype: np.dtype
  nck: Tuple[int, int, int]


def int_tuple(value, n, name, fn, *, minimum=1, default=1, error=ValueError):
  """An int or a sequence of n ints, each >= minimum (else `error`, the exception type lax raises)."""
  if value is None:
    return (default,) * n
  if isinstance(value, (int, np.integer)):
    value = (value,) * n
  try:
    out = tuple(operator.index(v) for v in value)
  except TypeError:
    raise TypeError(f"{fn}: {name} must be an integer or a sequence of {n} integers, got {value!r}") from None
  if len(out) != n:
    raise ValueError(f"{fn}: {name} must have one entry per spatial dimension ({n}), got {value!r}")
  if any(v < minimum for v in out):
    raise error(f"{fn}: {name} entries must be >= {minimum}, got {value!r}")
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
      raise ValueError(f"{fn}: string padding {padding!r} is not implemented for transposed convolution "
                       "(lhs_dilation != 1); give explicit (low, high) pairs for padding")
    if padding.upper() not in ("SAME", "SAME_LOWER", "VALID"):
      raise ValueError(f"{fn}: padding must be 'SAME', 'SAME_LOWER', 'VALID' or a sequence of {n} "
                       f"(low, high) integer pairs, got {padding!r}")
    eff_window = [0 if k == 0 else (k - 1) * d + 1 for k, d in zip(window, rhs_dilation)]
    pads = tuple((int(lo), int(hi)) for lo, hi in
                 lax.padtype_to_pads(in_spatial, eff_window, strides, padding.upper()))
  else:
    try:
      pads = tuple((operator.index(p[0]), operator.index(p[1])) for p in padding)
      ok = all(len(p) == 2 for p in padding)
    except (TypeError, IndexError):
      ok = False
    if not ok or len(pads) != n:
      raise ValueError(f"{fn}: padding must be 'SAME', 'SAME_LOWER', 'VALID' or a sequence of {n} "
                       f"(low, high) integer pairs, got {padding!r}")
  for i, ((lo, hi), size, ld) in enumerate(zip(pads, in_spatial, lhs_dilation)):
    dilated = 0 if size == 0 else (size - 1) * ld + 1
    if dilated + lo + hi < 0:  # lax's rule: the padded input may be empty, not negative
      raise ValueError(f"{fn}: padding {(lo, hi)} of spatial dimension {i} removes more than the "
                       f"(dilated) input size {dilated}")
  return pads


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


def _check_dtypes(lhs, rhs, fn):
  for name, a in (("lhs", lhs), ("rhs", rhs)):
    if np.dtype(a.dtype) not in _SUPPORTED_DTYPES:
      raise TypeError(f"{fn}: {name} has dtype {a.dtype}, which jaxconv does not support; expected one of "
                      "float32, float64, bfloat16, float16")
  if lhs.dtype != rhs.dtype:
    raise TypeError(f"{fn} requires lhs and rhs to have the same dtype, got {lhs.dtype} and {rhs.dtype}")


def _plan_dtypes(in_dtype, preferred, fn):
  """(dtype the kernel computes from, dtype the kernel writes, dtype returned)."""
  in_dtype = np.dtype(in_dtype)
  if preferred is None:
    return in_dtype, in_dtype, in_dtype
  out = np.dtype(preferred)
  if not jnp.issubdtype(out, jnp.floating):
    raise TypeError(f"{fn}: preferred_element_type must be a floating dtype for {in_dtype} inputs, got {out}")
  if jnp.finfo(out).bits < jnp.finfo(in_dtype).bits:
    raise TypeError(f"{fn}: preferred_element_type {out} is narrower than the input dtype {in_dtype}")
  if out == in_dtype or (out == np.float32 and in_dtype != np.float64):
    return in_dtype, out, out
  if out == np.float64:
    return out, out, out  # upcast is exact; compute in float64
  return in_dtype, np.dtype(np.float32), out  # e.g. bf16 -> f16: accumulate in f32, then round


def plan(lhs, rhs, bias=None, *, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
         dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
         preferred_element_type=None, activation=None, algorithm="auto", poison=False, fn,
         groups_name="feature_group_count") -> Plan:
  """Checks every argument of a convolution (lhs, rhs, bias: anything with .shape and .dtype) and returns its Plan;
  TypeError or ValueError naming the argument, in lax's wording where lax has one."""
  _check_dtypes(lhs, rhs, fn)
  if lhs.ndim != rhs.ndim:
    raise TypeError(f"{fn}: lhs and rhs must have the same number of dimensions, but got {lhs.shape} "
                     f"and {rhs.shape}.")
  if not 3 <= lhs.ndim <= 5:
    raise ValueError(f"{fn}: lhs must have 1, 2 or 3 spatial dimensions (rank 3 to 5), got shape {lhs.shape}")
  nsp = lhs.ndim - 2
  dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  lhs_spec, rhs_spec, out_spec = dn
  strides = int_tuple(window_strides, nsp, "window_strides", fn)
  # lax raises TypeError ("All dilations must be positive") for these.
  lhs_dil = int_tuple(lhs_dilation, nsp, "lhs_dilation", fn, error=TypeError)
  rhs_dil = int_tuple(rhs_dilation, nsp, "rhs_dilation", fn, error=TypeError)
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
  prec = _canonical_precision(precision, fn)
  if activation not in ACTIVATIONS:
    raise ValueError(f"{fn}: activation must be one of None, 'relu', 'gelu', 'silu', got {activation!r}")
  try:
    registry.request_code(algorithm)
  except ValueError as e:
    raise ValueError(f"{fn}: {e}") from None
  compute_dt, kernel_out_dt, out_dt = _plan_dtypes(lhs.dtype, preferred_element_type, fn)
  if bias is not None:
    if tuple(bias.shape) != (k,):
      raise ValueError(f"{fn}: bias must have shape ({k},) (one value per output feature), got {bias.shape}")
    if not jnp.issubdtype(bias.dtype, jnp.floating):
      raise TypeError(f"{fn}: bias must be floating point, got {bias.dtype}")

  # Every layout runs channels-last, where the fast kernels are (tensor cores read channel vectors): XLA transposes
  # other layouts around the call, as it does for lax's own convolutions on the GPU, and fuses the transposes with
  # neighbouring ops where it can.
  layout = CHANNELS_LAST
  x_perm = (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])
  w_perm = (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])
  y_logical = (0, *range(2, lhs.ndim), 1)  # native y axis -> logical (0 batch, 1 feature, 2.. spatial)
  spec = ConvSpec(layout=layout, in_spatial=in_spatial, window=window, strides=strides, padding=pads,
                  lhs_dilation=lhs_dil, rhs_dilation=rhs_dil, feature_groups=g, batch_groups=b,
                  precision=prec, activation=activation, has_bias=bias is not None, algorithm=algorithm,
                  poison=poison)
  if algorithm != registry.AUTO and registry.has_kernels():
    # A forced request is checked against the GPU predicates of its forward op now, on the CPU too, so that a
    # program fails the same way on both platforms (the CPU runs every problem with its one kernel set); a
    # variant without a forward kernel hands the forward to its family.
    fwd = spec.replace(algorithm=registry.op_request("fwd", algorithm))
    choice = registry.resolve("fwd", fwd.ffi_params(n, c, k), compute_dt, kernel_out_dt)
    if not choice.ok:
      raise ValueError(f"{fn}: algorithm={algorithm!r} cannot run this convolution: {choice.why}")
  # Output axis a holds logical dim argsort(out_spec)[a]; find where the native result keeps it.
  out_perm = tuple(y_logical.index(int(l)) for l in np.argsort(out_spec))
  return Plan(spec=spec, x_perm=tuple(int(a) for a in x_perm), w_perm=tuple(int(a) for a in w_perm),
              out_perm=out_perm, compute_dtype=np.dtype(compute_dt), kernel_out_dtype=np.dtype(kernel_out_dt),
              out_dtype=np.dtype(out_dt), nck=(int(n), int(c), int(k)))
