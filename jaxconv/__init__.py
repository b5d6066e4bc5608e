"""jaxconv: convolutions for JAX on the project's own CPU and CUDA kernels, as XLA FFI custom calls."""

from jaxconv import _native, algorithms, primitives, registry
from jaxconv.api import (conv1d, conv2d, conv3d, conv_general_dilated, debug_poison, set_debug_poison)
from jaxconv.primitives import conv_dgrad_p, conv_fwd_p, conv_wgrad_p
from jaxconv.spec import ConvSpec
from jaxconv.tuning.cache import autotune_mode, set_autotune
from jaxconv.tuning.tuner import AutotuneResult, autotune

__version__ = "0.1.0"


def build_info() -> dict:
  """How the native extension was built: CUDA on or off, CUDA architectures, CUDA runtime version."""
  return _native.build_info()


def cuda_available() -> bool:
  """True when the extension has CUDA kernels and JAX has a GPU backend to run them on."""
  if not _native.built_with_cuda():
    return False
  try:
    import jax
    return len(jax.devices("gpu")) > 0
  except RuntimeError:
    return False


__all__ = [
    "AutotuneResult", "ConvSpec", "algorithms", "autotune", "autotune_mode", "build_info", "conv1d", "conv2d",
    "conv3d", "conv_dgrad_p", "conv_fwd_p", "conv_general_dilated", "conv_wgrad_p", "cuda_available",
    "debug_poison", "primitives", "registry", "set_autotune", "set_debug_poison",
]
