"""The autotuning mode and cache: which variant each op of a convolution runs when autotuning is on.

The mode (`set_autotune`, env JAXCONV_AUTOTUNE) decides whether the lowering reads the cache:

  off    (default) the registry's auto choice only: reproducible, independent of any file.
  cache  cached choices where there are any, never timing.
  on     as cache, and on a miss at trace time the candidates of the problem's three ops are timed on the
         current GPU and the winners stored (tuner.tune_on_trace).

The cache is one JSON file, {"format": 1, "entries": {key: {"algorithm": name, ...}}}, keyed by the GPU's
device_kind, jaxconv's version, the op, the operand and result dtypes, and the packed params with the fields that do
not change which kernel is fastest zeroed (`_KEY_ZEROED`). It is written atomically and merged under a file lock;
anything unreadable is ignored with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
import tempfile
import threading
import warnings
from typing import Dict, Optional, Tuple

import numpy as np

from jaxconv import _native, registry

MODES = ("off", "cache", "on")


def _parse_mode(value, what) -> str:
  mode = str(value).strip().lower() if value is not None else "off"
  if mode not in MODES:
    raise ValueError(f"{what} must be one of 'off', 'cache', 'on', got {value!r}")
  return mode


def _mode_from_env(value: Optional[str]) -> str:
  try:
    return _parse_mode(value or "off", "JAXCONV_AUTOTUNE")
  except ValueError as e:  # a typo in the environment should not stop every import of jaxconv
    warnings.warn(f"jaxconv: {e}; autotuning stays off", stacklevel=2)
    return "off"


_mode = _mode_from_env(os.environ.get("JAXCONV_AUTOTUNE"))


def set_autotune(mode: str) -> str:
  """Sets the autotuning mode and returns the previous one (pass it back to restore).

  Args:
    mode: 'off' (default; the heuristic only, reproducible), 'cache' (use cached choices, never time) or
      'on' (use cached choices; on a miss, time the candidates on the current GPU while tracing and store the
      winners). The environment variable JAXCONV_AUTOTUNE sets the initial mode.

  The mode applies to programs traced and lowered after the call (jit's caches keep programs already compiled).
  """
  global _mode
  previous, _mode = _mode, _parse_mode(mode, "set_autotune: mode")
  return previous


def autotune_mode() -> str:
  """The current autotuning mode: 'off', 'cache' or 'on'."""
  return _mode


# ---------------------------------------------------------------------------------------------------------
# The cache file.
# ---------------------------------------------------------------------------------------------------------
CACHE_FILE = "autotune.json"
_FORMAT = 1
# Fields zeroed in the key: the request and the variant (what the entry answers), the debug poison fill (a debug run should run
# the kernels production runs), and the fused epilogue (an elementwise tail every algorithm applies the same
# way; zeroing it lets jaxconv.autotune, which has lax's signature, tune conv2d(..., bias, activation) calls and
# the epilogue-free forward that differentiation binds).
_KEY_ZEROED = ("algorithm", "variant", "poison", "activation", "has_bias")

_lock = threading.RLock()
_memo: Dict[str, Tuple[tuple, Dict[str, dict]]] = {}  # path -> (stat stamp, entries): one parse per change
_session: Dict[str, Dict[str, dict]] = {}  # path -> entries stored by this process (kept if a write fails)
_warned = set()


def cache_dir() -> str:
  """$JAXCONV_CACHE_DIR, else $XDG_CACHE_HOME/jaxconv, else ~/.cache/jaxconv."""
  explicit = os.environ.get("JAXCONV_CACHE_DIR")
  if explicit:
    return explicit
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "jaxconv")


def cache_path() -> str:
  """The autotuning cache file (read again whenever it changes)."""
  return os.path.join(cache_dir(), CACHE_FILE)


def _version() -> str:
  import jaxconv  # the package's version is set after its submodules are imported
  return str(jaxconv.__version__)


def cache_key(op: str, params, dtype, out_dtype, device_kind: str) -> str:
  """The cache key of one op: GPU, jaxconv version, op, dtypes and the normalised packed params."""
  if op not in registry.OPS:
    raise ValueError(f"cache_key: op must be one of {registry.OPS}, got {op!r}")
  p = np.array(params, dtype=np.int64, copy=True)
  for field in _KEY_ZEROED:
    p[_native.param_offset(field)] = 0
  return "|".join((str(device_kind), f"jaxconv-{_version()}", op,
                   f"{np.dtype(dtype).name}->{np.dtype(out_dtype).name}", ",".join(str(int(v)) for v in p)))


def _warn_once(tag, message):
  if tag not in _warned:
    _warned.add(tag)
    warnings.warn(message, stacklevel=3)


def _read_file(path) -> Dict[str, dict]:
  """The valid entries of the cache file; a missing file is empty; anything else that is not a readable cache (a
  directory, a FIFO, bad JSON, deep nesting, entries of the wrong shape) is ignored with a warning."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return {}
  except OSError as e:
    _warn_once(("stat", path), f"jaxconv: cannot read the autotuning cache {path}: {e}; ignoring it")
    return {}
  if not stat.S_ISREG(st.st_mode):  # opening a FIFO would block, a directory would fail: neither is a cache
    _warn_once(("kind", path), f"jaxconv: the autotuning cache {path} is not a regular file; ignoring it")
    return {}
  stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
  with _lock:
    hit = _memo.get(path)
    if hit is not None and hit[0] == stamp:
      return hit[1]
    try:
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
      if not (isinstance(data, dict) and data.get("format") == _FORMAT and isinstance(data.get("entries"), dict)):
        raise ValueError(f"not a jaxconv autotuning cache of format {_FORMAT}")
      entries, unknown = {}, set()
      known = set(registry.names())
      for k, v in data["entries"].items():
        name = v.get("algorithm") if isinstance(v, dict) else None
        if not (isinstance(k, str) and isinstance(name, str)):
          unknown.add(repr(name)[:40])
        elif name not in known:
          unknown.add(name)
        else:
          entries[k] = v
      if unknown:
        _warn_once(("unknown", path, stamp), f"jaxconv: the autotuning cache {path} has entries naming algorithms "
                                             f"this jaxconv does not have ({', '.join(sorted(unknown)[:5])}); "
                                             "they are ignored")
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:  # json's decode error is a ValueError
      _warn_once(("read", path, stamp), f"jaxconv: ignoring the autotuning cache {path}, which cannot be read "
                                        f"({type(e).__name__}: {str(e)[:200]}); the heuristic is used and the next "
                                        "stored choice replaces the file")
      entries = {}
    _memo[path] = (stamp, entries)
    return entries


def load_cache() -> Dict[str, dict]:
  """Every entry in effect: the file's, overlaid with those this process stored."""
  path = cache_path()
  with _lock:
    return {**_read_file(path), **_session.get(path, {})}


def lookup(key: str) -> Optional[str]:
  """The cached algorithm name for a key, or None."""
  entry = load_cache().get(key)
  return None if entry is None else entry["algorithm"]


@contextlib.contextmanager
def _file_lock(directory):
  """An exclusive advisory lock on the cache directory, so that processes tuning at once merge their entries."""
  try:
    import fcntl
  except ImportError:  # pragma: no cover - not POSIX: the atomic replace alone (a concurrent entry may be lost)
    yield
    return
  with open(os.path.join(directory, ".autotune.lock"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def store(entries: Dict[str, dict]) -> None:
  """Adds entries ({key: {"algorithm": name, ...}}) to the cache: merged with the file, written atomically.

  A failed write warns and keeps the entries for this process.
  """
  for key, entry in entries.items():
    if entry.get("algorithm") not in registry.names():
      raise ValueError(f"store: entry {key!r} has algorithm {entry.get('algorithm')!r}, which the registry does not "
                       "name")
  path = cache_path()
  directory = os.path.dirname(path)
  with _lock:
    _session.setdefault(path, {}).update(entries)
    tmp = None
    try:
      os.makedirs(directory, exist_ok=True)
      with _file_lock(directory):
        merged = {**_read_file(path), **entries}  # re-read: another process may have stored meanwhile
        fd, tmp = tempfile.mkstemp(prefix=".autotune.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
          json.dump({"format": _FORMAT, "entries": merged}, f, indent=1, sort_keys=True)
          f.write("\n")
        os.replace(tmp, path)  # readers see the old file or the new one, never a partial write
        tmp = None
    except OSError as e:
      warnings.warn(f"jaxconv: could not write the autotuning cache {path}: {e}; the choices apply to this "
                    "process only", stacklevel=2)
    finally:
      if tmp is not None:
        with contextlib.suppress(OSError):
          os.remove(tmp)


def clear_cache() -> None:
  """Deletes the cache file (of the current cache_dir) and forgets this process's stored choices."""
  path = cache_path()
  with _lock:
    _session.pop(path, None)
    _memo.pop(path, None)
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)


# ---------------------------------------------------------------------------------------------------------
# The lowering's lookup.
# ---------------------------------------------------------------------------------------------------------
@functools.cache
def gpu_kind() -> Optional[str]:
  """device_kind of the first GPU, the one programs are lowered for; None without a GPU backend."""
  import jax
  try:
    devices = jax.devices("gpu")
  except RuntimeError:
    return None
  return devices[0].device_kind if devices else None


def cached_choice(op: str, params, dtype, out_dtype) -> Optional[str]:
  """The cached variant for an op of these packed params on this process's GPU, or None (no GPU: lowering for
  CUDA without one, as jax.export does, has no device to key on)."""
  kind = gpu_kind()
  return None if kind is None else lookup(cache_key(op, params, dtype, out_dtype, kind))


def warn_stale(op: str, name: str, why: str) -> None:
  _warn_once(("stale", op, name, why), f"jaxconv: ignoring the cached algorithm {name!r} for {op}: {why}")
