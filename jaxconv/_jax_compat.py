"""The private jax APIs (`jax._src`) that jaxconv uses, resolved in one place.

jax promises nothing about `jax._src`, so a jax release outside the supported range may rename or drop any of
these. Every use goes through `get(key)`, which raises `JaxAPIError` (an ImportError) naming the missing API, the
installed jax and the range jaxconv supports, instead of an AttributeError deep inside a lowering.

`PRIVATE_APIS` lists each one once: a key, then the dotted paths to try in order (older names after newer ones).
"""

from __future__ import annotations

import functools
import importlib

# The range in pyproject.toml's dependencies; kept here for the error message.
SUPPORTED_JAX = ">=0.10.2,<0.12"

PRIVATE_APIS: dict[str, tuple[str, ...]] = {
    # shard_map: brings operands to one set of varying manual axes (pvary) before a bind.
    "insert_reshard": ("jax._src.core.auto_insert_reshard", "jax._src.core.standard_insert_pvary"),
    # shard_map: the type of an aval's varying manual axes, and the mesh sharding of the current context.
    "ManualAxisType": ("jax._src.core.ManualAxisType",),
    "get_cur_mesh_sharding": ("jax._src.core.get_cur_mesh_sharding",),
    # custom_partitioning's callbacks need the concrete devices when the primitive is lowered.
    "prim_requires_devices_during_lowering": ("jax._src.dispatch.prim_requires_devices_during_lowering",),
    # The lowering context's axis context: partitioned jit or (partly) manual shard_map.
    "ShardingContext": ("jax._src.sharding_impls.ShardingContext",),
    "SPMDAxisContext": ("jax._src.sharding_impls.SPMDAxisContext",),
    # Sharding in types: the sharding constraint lax's lowerings put on their results.
    "lower_with_sharding_in_types": ("jax._src.interpreters.mlir.lower_with_sharding_in_types",),
    # lax's canonicalisation of a requested result dtype (float64 -> float32 with its warning when x64 is off).
    "check_and_canonicalize_user_dtype": ("jax._src.dtypes.check_and_canonicalize_user_dtype",),
}


class JaxAPIError(ImportError):
  """A private jax API that jaxconv needs is missing from the installed jax."""


def _resolve(path: str):
  module, _, name = path.rpartition(".")
  try:
    mod = importlib.import_module(module)
  except ImportError:
    return None, False
  if not hasattr(mod, name):
    return None, False
  return getattr(mod, name), True


def _jax_version() -> str:
  try:
    import jax
    return jax.__version__
  except Exception:  # noqa: BLE001 - only for the message
    return "unknown"


@functools.cache
def get(key: str):
  """The object behind `key` in PRIVATE_APIS, from the first of its paths that the installed jax has."""
  paths = PRIVATE_APIS[key]
  for path in paths:
    obj, found = _resolve(path)
    if found:
      return obj
  names = " or ".join(paths)
  raise JaxAPIError(
      f"jaxconv needs the private jax API {names}, which jax {_jax_version()} does not have; jaxconv supports "
      f"jax{SUPPORTED_JAX}: install a jax in that range (pip install 'jax{SUPPORTED_JAX}' "
      f"'jaxlib{SUPPORTED_JAX}')")


def missing() -> list[str]:
  """The keys of PRIVATE_APIS that the installed jax lacks (empty when every one resolves)."""
  out = []
  for key in PRIVATE_APIS:
    try:
      get(key)
    except JaxAPIError:
      out.append(key)
  return out


def check() -> None:
  """Raises JaxAPIError for the first private API the installed jax lacks, naming it."""
  for key in PRIVATE_APIS:
    get(key)
