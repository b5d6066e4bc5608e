"""Loads the compiled extension and registers its FFI targets with XLA, once, at import."""

from __future__ import annotations

import functools

import jax
import numpy as np

try:
  from jaxconv import _jaxconv_native as _ext
except ImportError as err:  # pragma: no cover - only on a broken install
  raise ImportError(
      "jaxconv's native extension is missing: install the package with `pip install -e .` so that its "
      "C++ (and, where nvcc is found, CUDA) code is compiled") from err

TARGETS = ("jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad")
PARAMS_ABI_VERSION = int(_ext.build_info()["abi_version"])


@functools.cache
def param_fields():
  """[(name, count)] of the packed params attribute, in the order the handlers decode it."""
  return tuple((str(name), int(count)) for name, count in _ext.param_fields())


@functools.cache
def build_info() -> dict:
  """What the extension was built with (CUDA or not, CUDA architectures, runtime version)."""
  return dict(_ext.build_info())


def built_with_cuda() -> bool:
  return bool(build_info()["cuda"])


def algorithm_error(params, dtype, out_dtype=None) -> str:
  """Why the forced algorithm in these packed params cannot run the problem ('' when it can).

  Args:
    params: the packed int64 params (ConvSpec.ffi_params).
    dtype: the operands' dtype; out_dtype: the result's (default: dtype).
  """
  out_dtype = dtype if out_dtype is None else out_dtype
  return str(_ext.algorithm_error([int(v) for v in params], str(np.dtype(dtype)), str(np.dtype(out_dtype))))


def workspace_bytes(op: str, params, dtype, out_dtype=None) -> int:
  """Device workspace (bytes) the CUDA kernels need for `op` on these packed params, operand and result dtypes."""
  out_dtype = dtype if out_dtype is None else out_dtype
  return int(_ext.workspace_bytes(op, [int(v) for v in params], str(np.dtype(dtype)), str(np.dtype(out_dtype))))


def _register():
  for platform, targets in _ext.registrations().items():
    for name, capsule in targets.items():
      jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register()
