"""Algorithm registry and autotuning: which CUDA kernel family runs each convolution op.

Every algorithm has a name (spec.ALGORITHMS, mapped onto the native enum) and a predicate for the problems it
supports. The predicates live in C++ (csrc/algorithms.h), shared with the CUDA dispatch, and are reached
through `_native.algorithm_error`; nothing here repeats them. "auto" is the heuristic: the native default
choice, made by the handler from the same predicates.

The choice is made when a program is lowered, so a compiled program is fixed. `_make_lowering` asks
`lowering_params` for each CUDA custom call (fwd, dgrad and wgrad separately: the gradients of a user's
forward call are other ops with their own best algorithm), and that looks the problem up in a JSON cache
depending on the mode (`set_autotune`, env JAXCONV_AUTOTUNE):

  off    (default) the heuristic only: reproducible, independent of any file.
  cache  cached choices where there are any, never timing.
  on     as cache, and on a miss at trace time the candidates of the problem's three ops are timed on the
         current GPU and the winners stored (see `tune_on_trace`).

`autotune(...)` times the candidates explicitly. Cache entries are keyed by the GPU's device_kind, jaxconv's
version, the op, the operand and result dtypes, and the packed params with the fields that do not change
which kernel is fastest zeroed (`_KEY_ZEROED`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import math
import os
import tempfile
import threading
import time
import warnings
from typing import Dict, Optional, Sequence, Tuple

import jax
import numpy as np

from jaxconv import _native
from jaxconv import spec as _spec

# ---------------------------------------------------------------------------------------------------------
# The registry.
# ---------------------------------------------------------------------------------------------------------
HEURISTIC = "auto"
OPS = ("fwd", "dgrad", "wgrad")
MODES = ("off", "cache", "on")

_DESCRIPTIONS = {
    "auto": "the heuristic: the native default choice among the algorithms below (csrc/algorithms.h)",
    "direct": "general direct convolution on CUDA cores; runs every configuration",
    "depthwise": "depthwise convolution: groups == c == k (channel multiplier 1)",
    "long1d": "long 1-D windows with few channels (c, k <= 8), unit stride and dilations",
    "small": "few channels (c <= 16, k <= 64), channels-last, no groups: first layers, 1-channel images",
    "implicit_gemm": "tensor cores (CUTLASS implicit GEMM): channels-last, no groups, aligned channel counts",
    "implicit_gemm_sm80": "implicit_gemm restricted to its mma.sync (sm_80) kernels, also on Hopper",
}
# name -> one-line description, in the native enum's order ("auto" first).
ALGORITHMS: Dict[str, str] = {name: _DESCRIPTIONS.get(name, "(no description)") for name in _spec.ALGORITHMS}


def names() -> Tuple[str, ...]:
  """The algorithms that can be forced (every name but the heuristic "auto"), in the native enum's order."""
  return tuple(n for n in ALGORITHMS if n != HEURISTIC)


def heuristic(op: str, params) -> str:
  """The heuristic's choice: "auto", i.e. the native handler picks from the same predicates at run time."""
  del op, params  # the native choice needs nothing from Python
  return HEURISTIC


@functools.cache
def _field_offset(field: str) -> int:
  pos = 0
  for name, count in _native.param_fields():
    if name == field:
      return pos
    pos += count
  raise KeyError(field)


def with_algorithm(params, name: str) -> np.ndarray:
  """A copy of the packed params with the algorithm field set to `name`."""
  out = np.array(params, dtype=np.int64, copy=True)
  out[_field_offset("algorithm")] = _spec.ALGORITHMS.index(name)
  return out


def algorithm_of(params) -> str:
  """The name of the algorithm field of packed params."""
  return _spec.ALGORITHMS[int(np.asarray(params)[_field_offset("algorithm")])]


def _check_op(op, fn):
  if op not in OPS:
    raise ValueError(f"{fn}: op must be one of {OPS}, got {op!r}")


def candidates(op: str, params, dtype, out_dtype=None) -> Tuple[str, ...]:
  """The algorithms that can run this problem: those the native predicate accepts when forced.

  Args:
    op: 'fwd', 'dgrad' or 'wgrad'. (Today's predicates are the same for the three ops; the argument keeps
      per-op predicates possible without changing callers.)
    params: the packed int64 params (ConvSpec.ffi_params); the algorithm field is ignored.
    dtype: the operands' dtype; out_dtype: the result's (default: dtype).
  """
  _check_op(op, "candidates")
  return tuple(n for n in names() if not _native.algorithm_error(with_algorithm(params, n), dtype, out_dtype))


# ---------------------------------------------------------------------------------------------------------
# The mode switch.
# ---------------------------------------------------------------------------------------------------------
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
# The cache: one JSON file, {"format": 1, "entries": {key: {"algorithm": name, ...}}}.
# ---------------------------------------------------------------------------------------------------------
CACHE_FILE = "autotune.json"
_FORMAT = 1
# Fields zeroed in the key: the algorithm (what the entry answers), the debug poison fill (a debug run should run
# the kernels production runs), and the fused epilogue (an elementwise tail every algorithm applies the same
# way; zeroing it lets jaxconv.autotune, which has lax's signature, tune conv2d(..., bias, activation) calls and
# the epilogue-free forward that differentiation binds).
_KEY_ZEROED = ("algorithm", "poison", "activation", "has_bias")

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
  _check_op(op, "cache_key")
  p = np.array(params, dtype=np.int64, copy=True)
  for field in _KEY_ZEROED:
    p[_field_offset(field)] = 0
  return "|".join((str(device_kind), f"jaxconv-{_version()}", op,
                   f"{np.dtype(dtype).name}->{np.dtype(out_dtype).name}", ",".join(str(int(v)) for v in p)))


def _warn_once(tag, message):
  if tag not in _warned:
    _warned.add(tag)
    warnings.warn(message, stacklevel=3)


def _read_file(path) -> Dict[str, dict]:
  """The valid entries of the cache file; a missing file is empty, an unreadable one empty with a warning."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return {}
  except OSError as e:
    _warn_once(("stat", path), f"jaxconv: cannot read the autotuning cache {path}: {e}; ignoring it")
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
      known = set(names())
      entries = {k: v for k, v in data["entries"].items()
                 if isinstance(k, str) and isinstance(v, dict) and v.get("algorithm") in known}
    except (OSError, ValueError, UnicodeDecodeError) as e:  # json's decode error is a ValueError
      _warn_once(("read", path, stamp), f"jaxconv: ignoring the autotuning cache {path}, which cannot be read "
                                        f"({type(e).__name__}: {e}); the heuristic is used and the next stored "
                                        "choice replaces the file")
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
    if entry.get("algorithm") not in names():
      raise ValueError(f"store: entry {key!r} has algorithm {entry.get('algorithm')!r}, not one of {names()}")
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
def _gpu_kind() -> Optional[str]:
  """device_kind of the first GPU, the one programs are lowered for; None without a GPU backend."""
  try:
    devices = jax.devices("gpu")
  except RuntimeError:
    return None
  return devices[0].device_kind if devices else None


def lowering_params(op: str, spec, nck, dtype, out_dtype, platform: str) -> np.ndarray:
  """The packed params a custom call is lowered with: the spec's, with a cached choice in place of "auto".

  Only CUDA lowerings of "auto" specs in modes 'cache' and 'on' consult the cache (the CPU handlers have one
  kernel set); a cached choice the predicates no longer accept is ignored with a warning.
  """
  params = spec.ffi_params(*nck)
  if platform != "cuda" or spec.algorithm != HEURISTIC or _mode == "off":
    return params
  kind = _gpu_kind()
  if kind is None:  # lowering for CUDA on a machine without a GPU (jax.export): no device to key on
    return params
  key = cache_key(op, params, dtype, out_dtype, kind)
  name = lookup(key)
  if name is None:
    return params
  chosen = with_algorithm(params, name)
  why = _native.algorithm_error(chosen, dtype, out_dtype)
  if why:
    _warn_once(("stale", key), f"jaxconv: ignoring the cached algorithm {name!r} for {op}: {why}")
    return params
  return chosen


# ---------------------------------------------------------------------------------------------------------
# Problems: the three ops of one convolution, exactly as the lowering will see them.
# ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Problem:
  """One op of one convolution: its spec (linear, "auto", no poison), operands and result dtype."""
  op: str
  spec: _spec.ConvSpec
  operands: Tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]
  out_dtype: np.dtype

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(self.operands[0].dtype)

  @property
  def params(self) -> np.ndarray:
    from jaxconv import primitives
    prim = {"fwd": primitives.conv_fwd_p, "dgrad": primitives.conv_dgrad_p, "wgrad": primitives.conv_wgrad_p}
    return self.spec.ffi_params(*primitives._nck(prim[self.op], self.spec, self.operands))

  def key(self, device_kind: str) -> str:
    return cache_key(self.op, self.params, self.dtype, self.out_dtype, device_kind)

  def candidates(self) -> Tuple[str, ...]:
    return candidates(self.op, self.params, self.dtype, self.out_dtype)


def _op_eqns(closed_jaxpr):
  """(op name, eqn) of every jaxconv primitive in a jaxpr, sub-jaxprs included."""
  from jaxconv import primitives
  ops = {primitives.conv_fwd_p: "fwd", primitives.conv_dgrad_p: "dgrad", primitives.conv_wgrad_p: "wgrad"}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive in ops:
        yield ops[eqn.primitive], eqn
      for v in eqn.params.values():
        for sub in (v if isinstance(v, (tuple, list)) else (v,)):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            yield from walk(inner)

  return list(walk(closed_jaxpr.jaxpr))


def problems_of(spec, x, w, out_dtype) -> Dict[str, Problem]:
  """{op: Problem} of the forward conv(x, w) with `spec` (native layout) and its two gradients.

  Derived by tracing jax.vjp of the forward primitive, so the gradients' operand and result dtypes and shapes
  are the ones the differentiation rules bind. Empty problems (no custom call) have no entry.
  """
  from jaxconv import primitives
  lin = spec.linear().replace(algorithm=HEURISTIC, poison=False)
  out_dtype = np.dtype(out_dtype)
  x = jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
  w = jax.ShapeDtypeStruct(tuple(w.shape), w.dtype)
  ct = jax.ShapeDtypeStruct(primitives.fwd_shape(x.shape, w.shape, lin), out_dtype)

  def fwd_and_grads(x, w, ct):
    y, vjp = jax.vjp(lambda x, w: primitives.conv_fwd(x, w, None, lin, out_dtype), x, w)
    return (y, *vjp(ct))

  with _suspended():
    jaxpr = jax.make_jaxpr(fwd_and_grads)(x, w, ct)
  found = {}
  for op, eqn in _op_eqns(jaxpr):
    operands = tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars[:2])
    found.setdefault(op, Problem(op, eqn.params["spec"], operands, np.dtype(eqn.params["out_dtype"])))
  return found


def _problems_of_call(lhs, rhs, conv_kwargs, fn) -> Dict[str, Problem]:
  """The problems of jaxconv.conv_general_dilated(lhs, rhs, **conv_kwargs), found by tracing it."""
  from jaxconv import api
  def abstract(a):
    a = a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a)
    return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype)

  lhs, rhs = abstract(lhs), abstract(rhs)
  with _suspended():
    # The same validation and spec construction as the convolution, with errors naming `fn`.
    jaxpr = jax.make_jaxpr(lambda a, b: api._conv(a, b, None, activation=None, algorithm=HEURISTIC, fn=fn,
                                                  **conv_kwargs))(lhs, rhs)
  fwd = [eqn for op, eqn in _op_eqns(jaxpr) if op == "fwd"]
  if not fwd:  # an empty convolution: answered without a kernel
    return {}
  (eqn,) = fwd
  x, w = (v.aval for v in eqn.invars[:2])
  return problems_of(eqn.params["spec"], x, w, eqn.params["out_dtype"])


def problems(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
             feature_group_count=1, batch_group_count=1, precision=None,
             preferred_element_type=None) -> Dict[str, Problem]:
  """{op: Problem} of jaxconv.conv_general_dilated with these arguments: what `autotune` times and what the
  lowering looks up (lhs and rhs may be arrays or jax.ShapeDtypeStructs)."""
  kwargs = dict(window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
                rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
                feature_group_count=feature_group_count, batch_group_count=batch_group_count,
                precision=precision, preferred_element_type=preferred_element_type)
  return _problems_of_call(lhs, rhs, kwargs, "problems")


# ---------------------------------------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OpResult:
  """The outcome for one op.

  Attributes:
    op: 'fwd', 'dgrad' or 'wgrad'.
    winner: the algorithm stored for it.
    times_us: {algorithm: median device time per op, in microseconds} of the candidates timed (empty when the
      entry came from the cache or when only one algorithm applies, which needs no timing).
    errors: {algorithm: message} of candidates that failed to compile or run (never chosen).
    source: 'timed', 'single candidate' or 'cache'.
    key: the cache key.
  """
  op: str
  winner: str
  times_us: Dict[str, float]
  errors: Dict[str, str]
  source: str
  key: str

  def __str__(self):
    detail = ", ".join(f"{n} {t:.1f} us" for n, t in sorted(self.times_us.items(), key=lambda kv: kv[1]))
    detail += "".join(f", {n} failed ({m})" for n, m in self.errors.items())
    return f"{self.op}: {self.winner} [{self.source}]" + (f"  ({detail})" if detail else "")


class AutotuneResult(dict):
  """{op: OpResult} for the ops tuned; str() gives one line per op."""

  def __str__(self):
    return "\n".join(str(r) for r in self.values())

  def winners(self) -> Dict[str, str]:
    return {op: r.winner for op, r in self.items()}


_SET_BUDGET_BYTES = 256 << 20  # device memory for the distinct input/output sets of one timing
_MAX_SETS = 8
_TIME_BUDGET_S = 0.25          # timed calls per op (all candidates together), after compilation and warm-up
_MIN_ROUNDS, _MAX_ROUNDS = 5, 200
_PRUNE_AFTER, _PRUNE_RATIO = 3, 1.5  # after 3 rounds, candidates 1.5x slower than the best are not timed further


def _nbytes(a) -> int:
  return math.prod(a.shape) * np.dtype(a.dtype).itemsize


def _random_sets(problem: Problem, nsets: int, seed: int):
  """nsets distinct operand pairs of standard normal values (never zeros: no kernel sees a trivial input)."""
  import jax.numpy as jnp
  keys = jax.random.split(jax.random.key(seed), 2 * nsets)
  sets = []
  for i in range(nsets):
    sets.append(tuple(jax.random.normal(keys[2 * i + j], a.shape, jnp.float32).astype(a.dtype)
                      for j, a in enumerate(problem.operands)))
  return jax.block_until_ready(sets)


def _time_problem(problem: Problem, names_: Sequence[str], seed: int = 0):
  """({name: seconds per op}, {name: error}) for forced runs of each algorithm on the current default device.

  Method: for each candidate one jitted program applies the op to S distinct input sets (distinct data, so
  XLA cannot merge the calls; every output is returned, so none is dropped) and is compiled once and run once
  to warm up. Then the candidates are called in interleaved rounds (so clock and thermal drift hit all of them
  alike), each call timed from dispatch to block_until_ready; the time per op is the median over rounds divided
  by S. The fixed cost of one call (dispatch, synchronisation) is the same for every candidate, since the
  programs differ in one attribute only, so it cannot change the ranking; S amortises it in the reported
  times. Rounds continue until _TIME_BUDGET_S has passed (at least _MIN_ROUNDS); from round _PRUNE_AFTER on,
  candidates clearly slower than the best drop out (their time is the median of the rounds they ran).
  """
  from jaxconv import primitives
  prim = {"fwd": primitives.conv_fwd_p, "dgrad": primitives.conv_dgrad_p, "wgrad": primitives.conv_wgrad_p}
  prim = prim[problem.op]
  out_shape = jax.eval_shape(lambda a, b: prim.bind(a, b, spec=problem.spec, out_dtype=problem.out_dtype),
                             *problem.operands)
  set_bytes = sum(_nbytes(a) for a in problem.operands) + _nbytes(out_shape)
  nsets = max(1, min(_MAX_SETS, _SET_BUDGET_BYTES // max(1, set_bytes)))
  sets = _random_sets(problem, nsets, seed)

  compiled, errors = {}, {}
  for name in names_:
    spec = problem.spec.replace(algorithm=name)

    def run_all(sets, spec=spec):
      return [prim.bind(a, b, spec=spec, out_dtype=problem.out_dtype) for a, b in sets]

    try:
      fn = jax.jit(run_all).lower(sets).compile()
      jax.block_until_ready(fn(sets))  # warm-up: the first call loads the executable and touches the buffers
      compiled[name] = fn
    except Exception as e:  # noqa: BLE001 - a failing candidate is reported, not fatal
      errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
  samples = {name: [] for name in compiled}
  active = dict(compiled)
  start = time.perf_counter()
  rounds = 0
  while active and rounds < _MAX_ROUNDS and (
      rounds < _MIN_ROUNDS or (len(active) > 1 and time.perf_counter() - start < _TIME_BUDGET_S)):
    for name, fn in active.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(sets))
      samples[name].append(time.perf_counter() - t0)
    rounds += 1
    if rounds >= _PRUNE_AFTER:
      # A candidate clearly slower than the best (by its fastest call) cannot win: stop spending time on it
      # (a slow kernel on a large problem would otherwise take most of the budget).
      best = min(min(samples[n]) for n in active)
      active = {n: fn for n, fn in active.items() if min(samples[n]) <= _PRUNE_RATIO * best}
  times = {name: float(np.median(s)) / nsets for name, s in samples.items()}
  return times, errors


def _require_gpu(fn):
  if not _native.built_with_cuda():
    raise RuntimeError(f"{fn}: jaxconv was built without CUDA, so there are no GPU algorithms to choose from")
  backend = jax.default_backend()
  if backend != "gpu":
    raise RuntimeError(f"{fn}: needs a GPU: JAX's default backend is {backend!r}. The CPU handlers run every "
                       "problem with one kernel set and ignore the algorithm, so timing them would choose nothing")
  return jax.devices()[0].device_kind


def _tune(problems: Sequence[Problem], kind: str, reuse_cache: bool) -> AutotuneResult:
  result, new_entries = AutotuneResult(), {}
  for problem in problems:
    key = problem.key(kind)
    cached = lookup(key) if reuse_cache else None
    if cached is not None:
      result[problem.op] = OpResult(problem.op, cached, {}, {}, "cache", key)
      continue
    cands = problem.candidates()
    if len(cands) == 1:
      winner, times, errors, source = cands[0], {}, {}, "single candidate"
    else:
      times, errors = _time_problem(problem, cands)
      if not times:
        raise RuntimeError(f"autotune: every algorithm failed for {problem.op}: {errors}")
      winner = min(times, key=lambda n: (times[n], cands.index(n)))
      source = "timed"
    times_us = {n: t * 1e6 for n, t in times.items()}
    result[problem.op] = OpResult(problem.op, winner, times_us, errors, source, key)
    new_entries[key] = {
        "algorithm": winner, "times_us": {n: round(t, 3) for n, t in times_us.items()},
        "operands": [f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in problem.operands],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
  if new_entries:
    store(new_entries)
  return result


def autotune(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
             feature_group_count=1, batch_group_count=1, precision=None, preferred_element_type=None, *,
             ops: Sequence[str] = OPS, reuse_cache: bool = False) -> AutotuneResult:
  """Times every applicable algorithm of a convolution's ops on the current GPU and caches the fastest.

  Takes jaxconv.conv_general_dilated's arguments (lhs and rhs may be arrays or jax.ShapeDtypeStructs; only
  their shapes and dtypes are used). For each op, every algorithm whose predicate accepts the problem is
  compiled once with fresh random inputs, warmed up and timed (see `_time_problem`), and the winner is stored in
  the cache file (`cache_path()`). Programs lowered afterwards in mode 'cache' or 'on' (`set_autotune`) use
  it; a fused bias or activation (conv2d(..., bias, activation=...)) shares the entry of its convolution.

  Args:
    lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
      batch_group_count, precision, preferred_element_type: as for jaxconv.conv_general_dilated.
    ops: which of 'fwd', 'dgrad' (data gradient) and 'wgrad' (filter gradient) to tune.
    reuse_cache: return ops already in the cache without timing them again.

  Returns:
    An AutotuneResult {op: OpResult(winner, times_us, ...)}; print it for a table.

  Raises:
    RuntimeError: without a GPU backend (the CPU handlers ignore the algorithm) or a CUDA build of jaxconv.
  """
  fn = "autotune"
  ops = (ops,) if isinstance(ops, str) else tuple(ops)
  if not ops or any(op not in OPS for op in ops):
    raise ValueError(f"{fn}: ops must be a non-empty subset of {OPS}, got {ops!r}")
  kwargs = dict(window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
                rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
                feature_group_count=feature_group_count, batch_group_count=batch_group_count,
                precision=precision, preferred_element_type=preferred_element_type)
  problems = _problems_of_call(lhs, rhs, kwargs, fn)  # validates the arguments first, as the convolution would
  kind = _require_gpu(fn)
  with _suspended(), jax.ensure_compile_time_eval():
    return _tune([problems[op] for op in ops if op in problems], kind, reuse_cache)


# ---------------------------------------------------------------------------------------------------------
# Mode 'on': tuning at trace time.
# ---------------------------------------------------------------------------------------------------------
_state = threading.local()
_on_trace_done = set()  # problems this process already handled in mode 'on' (tuned, cached or failed)


@contextlib.contextmanager
def _suspended():
  """No trace-time tuning inside: autotune's own tracing must not start another autotune."""
  previous = getattr(_state, "suspended", False)
  _state.suspended = True
  try:
    yield
  finally:
    _state.suspended = previous


def tune_on_trace(spec, x, w, out_dtype) -> None:
  """Mode 'on': called by api._conv for an "auto" convolution while tracing (x, w in the native layout).

  On a cache miss for any of the problem's three ops (the gradients of the user's call need dgrad and wgrad),
  times their candidates on the default GPU and stores the winners. Only shapes and dtypes are used and the
  timing runs under jax.ensure_compile_time_eval, so it computes eagerly even inside a jit trace. A failure
  warns and leaves the heuristic in charge.
  """
  if _mode != "on" or getattr(_state, "suspended", False) or jax.default_backend() != "gpu":
    return
  if not _native.built_with_cuda():
    return
  kind = jax.devices()[0].device_kind
  sig = (spec.linear().replace(poison=False), tuple(x.shape), np.dtype(x.dtype), tuple(w.shape),
         np.dtype(out_dtype), kind, cache_path())
  if sig in _on_trace_done:
    return
  _on_trace_done.add(sig)
  try:
    problems = problems_of(spec, x, w, out_dtype)
    missing = [p for p in problems.values() if lookup(p.key(kind)) is None]
    if missing:
      with _suspended(), jax.ensure_compile_time_eval():
        _tune(missing, kind, reuse_cache=False)
  except Exception as e:  # noqa: BLE001 - tuning must never break the user's program
    warnings.warn(f"jaxconv: autotuning at trace time failed ({type(e).__name__}: {e}); the heuristic is used",
                  stacklevel=3)
