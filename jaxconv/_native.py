"""Loads the compiled extension and registers its FFI targets with XLA, once, at import."""

from __future__ import annotations

import functools

import jax

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
def param_offset(field: str) -> int:
  """Position of a field's first value in the packed params."""
  pos = 0
  for name, count in param_fields():
    if name == field:
      return pos
    pos += count
  raise KeyError(field)


@functools.cache
def build_info() -> dict:
  """What the extension was built with (CUDA or not, CUDA architectures, runtime version)."""
  return dict(_ext.build_info())


def built_with_cuda() -> bool:
  return bool(build_info()["cuda"])


def ext():
  """The compiled extension module (registry, params layout, timers)."""
  return _ext


def _register():
  for platform, targets in _ext.registrations().items():
    for name, capsule in targets.items():
      jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register()
