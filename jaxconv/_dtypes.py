"""Which element types a convolution takes and returns, and how each is run on the kernels: lax's dtype rules.

lax.conv_general_dilated takes every numeric type and bool. The kernels compute in four floating types (float32,
float64, bfloat16, float16) and in the integer types and bool (the integer kernels); everything else is run through
them the way XLA:CPU runs it, so that results match lax's bit for bit where XLA's are exact:

  integers, bool      the integer kernels: operands widened to the result type, sums modulo 2^bits (wraparound).
                      int4/uint4 run as int8/uint8 and wrap to 4 bits, as XLA does.
  float8, float4      widened to float16 (float32 for float8_e8m0fnu, whose range float16 lacks), convolved with
                      float32 accumulation rounded to float16, then rounded to the 8-bit type: XLA:CPU's double
                      rounding exactly.
  complex             three real convolutions (Gauss's product, as lax lowers complex convolutions on the CPU and
                      GPU), so gradients follow from the real ones.
  integer -> float    (preferred_element_type floating) operands converted to that type first, as XLA converts them.

`route` returns a DTypePlan; every check raises lax's exception type with lax's wording.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxconv import _jax_compat

# Floating types the kernels compute in.
NATIVE_FLOATS = tuple(np.dtype(d) for d in (jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16))
# Integer types and bool the integer kernels take.
NATIVE_INTS = tuple(np.dtype(d) for d in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                          "bool"))
_SUB_BYTE_INTS = {np.dtype(ml_dtypes.int4): np.dtype("int8"), np.dtype(ml_dtypes.uint4): np.dtype("uint8")}
# Types lax accepts but XLA:CPU cannot convolve (it fails at compile time): refused at trace time instead.
_UNSUPPORTED = tuple(np.dtype(getattr(ml_dtypes, n)) for n in ("int2", "uint2") if hasattr(ml_dtypes, n))

def _canonicalize_user_dtype(dtype, fun_name):
  """lax's canonicalisation of a requested dtype (the x64 warning, float64 -> float32 when x64 is off)."""
  return _jax_compat.get("check_and_canonicalize_user_dtype")(dtype, fun_name)


@dataclasses.dataclass(frozen=True)
class DTypePlan:
  """operand_dtype: what lhs and rhs are converted to first. complex_parts: the operands are complex and run as three
  real convolutions of their parts. compute_dtype / kernel_out_dtype: the kernel's operand and result types (of the
  parts, for complex). out_dtype: the result lax returns."""
  operand_dtype: np.dtype
  complex_parts: bool
  compute_dtype: np.dtype
  kernel_out_dtype: np.dtype
  out_dtype: np.dtype

  @property
  def fusable(self) -> bool:
    """Whether a bias and activation can run in the float kernels' epilogue (else XLA applies them after)."""
    return not self.complex_parts and self.operand_dtype in NATIVE_FLOATS


def _is_narrow_float(dt) -> bool:
  return jnp.issubdtype(dt, jnp.floating) and dt not in NATIVE_FLOATS


def _widened_float(dt) -> np.dtype:
  """The kernel type a float type computes in: itself, or for the narrow types the one XLA:CPU widens it to."""
  if dt in NATIVE_FLOATS:
    return dt
  fi = ml_dtypes.finfo(dt)
  f16 = ml_dtypes.finfo(np.float16)
  # float16 holds every value of the 8- and 4-bit types but float8_e8m0fnu (exponents to 2^127).
  fits = float(fi.max) <= float(f16.max) and float(fi.smallest_subnormal) >= float(f16.smallest_subnormal)
  return np.dtype(np.float16) if fits else np.dtype(np.float32)


def check_operands(lhs_dtype, rhs_dtype, fn) -> np.dtype:
  """The one operand dtype (lax's TypeErrors for mixed or unsupported ones)."""
  lhs_dtype, rhs_dtype = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
  for name, dt in (("lhs", lhs_dtype), ("rhs", rhs_dtype)):
    numeric = jnp.issubdtype(dt, jnp.number) or dt == np.dtype(bool)
    if not numeric or dt in _UNSUPPORTED or jnp.issubdtype(dt, jax.dtypes.extended):
      raise TypeError(f"{fn}: {name} has dtype {dt}, which convolutions do not take (XLA has no convolution of it); "
                      "expected a floating, complex, integer or bool dtype")
  if lhs_dtype != rhs_dtype:
    raise TypeError(f"{fn} requires arguments to have the same dtypes, got {lhs_dtype}, {rhs_dtype} (lhs and rhs).")
  return lhs_dtype


def check_preferred(in_dtype, preferred, fn):
  """The canonical preferred_element_type (None, or a dtype lax accepts for these operands), as lax checks it."""
  if preferred is None:
    return None
  pref = np.dtype(_canonicalize_user_dtype(preferred, fn))
  kinds = (np.integer, np.floating, np.complexfloating)
  if not (jnp.issubdtype(in_dtype, np.integer) and jnp.issubdtype(pref, np.floating)):
    # lax's rule (_validate_preferred_element_type); bool, which is none of the kinds, takes anything.
    if any(jnp.issubdtype(in_dtype, t) and not jnp.issubdtype(pref, t) for t in kinds):
      raise TypeError(f"{fn}: Input type is incompatible with `preferred_element_type`. The compatible combinations "
                      "of (input_type, preferred_element_type) are (integral, integral), (integral, floating), "
                      f"(floating, floating), (complex, complex); got ({in_dtype}, {pref}).")
    if jnp.issubdtype(in_dtype, np.signedinteger) and not jnp.issubdtype(pref, np.signedinteger):
      raise TypeError(f"{fn}: `preferred_element_type` must have the same signedness as the original type, got "
                      f"{pref} for {in_dtype} operands.")
  if pref.itemsize < in_dtype.itemsize:
    raise TypeError(f"{fn}: `preferred_element_type` must not be narrower than the original type, got {pref} for "
                    f"{in_dtype} operands.")
  if pref in _UNSUPPORTED:
    raise TypeError(f"{fn}: preferred_element_type {pref} is not a type XLA convolves into")
  return pref


def _float_plan(in_dtype, target) -> tuple:
  """(compute, kernel_out) for floating operands of in_dtype and a floating result of type target."""
  if in_dtype not in NATIVE_FLOATS and target in NATIVE_FLOATS:
    # Narrow operands with a kernel-type result: converted to it (exactly) and convolved in it, as lax converts
    # them under differentiation too, so that gradients round once to the narrow type as lax's do.
    return target, target
  compute, out = _widened_float(in_dtype), _widened_float(target)
  if out == compute:
    return compute, compute
  if out == np.float64:
    return out, out  # the upcast is exact: compute in float64
  if compute == np.float64:  # lax refuses narrower results; a float64 kernel writes float64 only
    return compute, compute
  # 16-bit operands accumulate in float32 and round once to the target; float32 operands (float8_e8m0fnu's, with a
  # 16-bit target) likewise.
  return compute, np.dtype(np.float32)


def route(in_dtype, preferred, fn) -> DTypePlan:
  """How operands of in_dtype (check_operands) with a checked preferred type (check_preferred) run on the kernels."""
  in_dtype = np.dtype(in_dtype)
  pref = None if preferred is None else np.dtype(preferred)
  out = in_dtype if pref is None else pref
  if jnp.issubdtype(in_dtype, np.complexfloating):
    real_in, real_out = np.dtype(jnp.finfo(in_dtype).dtype), np.dtype(jnp.finfo(out).dtype)
    compute, kernel_out = _float_plan(real_in, real_out)
    return DTypePlan(in_dtype, True, compute, kernel_out, out)
  if jnp.issubdtype(in_dtype, np.floating):
    compute, kernel_out = _float_plan(in_dtype, out)
    return DTypePlan(in_dtype, False, compute, kernel_out, out)
  # Integers and bool.
  if jnp.issubdtype(out, np.floating) or jnp.issubdtype(out, np.complexfloating):
    # XLA converts the operands to the floating result type and convolves in it.
    sub = route(out, None, fn)
    return dataclasses.replace(sub, operand_dtype=out)
  operand = _SUB_BYTE_INTS.get(in_dtype, in_dtype)
  kernel_out = _SUB_BYTE_INTS.get(out, out)
  return DTypePlan(operand, False, operand, kernel_out, out)
