"""Autotuning: timing the variants that run each op of a convolution on the current GPU and caching the fastest.

`autotune(...)` times a convolution's ops explicitly; in mode 'on' (cache.set_autotune) `tune_on_trace` does it at
trace time on a cache miss. The candidates of an op are the registry variants whose predicates accept it
(registry.candidates); each is forced by name, compiled once and timed on fresh random inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import threading
import time
import warnings
from typing import Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxconv import _native, _normalize, registry
from jaxconv import spec as _spec
from jaxconv.primitives import rules
from jaxconv.tuning import cache


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
  def nck(self) -> Tuple[int, int, int]:
    """(N, C, K) of the forward relation."""
    return tuple(int(v) for v in rules.nck(rules.PRIMITIVES[self.op], self.spec, self.operands))

  @property
  def params(self) -> np.ndarray:
    return self.spec.ffi_params(*self.nck)

  def key(self, device_kind: str) -> str:
    return cache.cache_key(self.op, self.params, self.dtype, self.out_dtype, device_kind)

  def candidates(self) -> Tuple[str, ...]:
    """The variants that run this op on the GPU programs are lowered for."""
    return registry.candidates(self.op, self.params, self.dtype, self.out_dtype)


def _op_eqns(closed_jaxpr):
  """(op name, eqn) of every jaxconv primitive in a jaxpr, sub-jaxprs included."""
  ops = rules.OP_NAMES

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
  lin = spec.linear().replace(algorithm=registry.AUTO, poison=False)
  out_dtype = np.dtype(out_dtype)
  x = jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
  w = jax.ShapeDtypeStruct(tuple(w.shape), w.dtype)
  ct = jax.ShapeDtypeStruct(rules.fwd_shape(x.shape, w.shape, lin), out_dtype)

  def fwd_and_grads(x, w, ct):
    if not jnp.issubdtype(x.dtype, jnp.floating):  # integer convolutions have no gradients (nor in lax)
      return rules.conv_fwd(x, w, None, lin, out_dtype)
    y, vjp = jax.vjp(lambda x, w: rules.conv_fwd(x, w, None, lin, out_dtype), x, w)
    return (y, *vjp(ct))

  with _suspended():
    jaxpr = jax.make_jaxpr(fwd_and_grads)(x, w, ct)
  found = {}
  for op, eqn in _op_eqns(jaxpr):
    operands = tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars[:2])
    found.setdefault(op, Problem(op, eqn.params["spec"], operands, np.dtype(eqn.params["out_dtype"])))
  return found


def _problems_of_call(lhs, rhs, conv_kwargs, fn) -> Dict[str, Problem]:
  """The problems of jaxconv.conv_general_dilated(lhs, rhs, **conv_kwargs), with its checks and errors."""
  def abstract(a):
    a = a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a)
    return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype)

  lhs, rhs = abstract(lhs), abstract(rhs)
  p = _normalize.plan(lhs, rhs, None, fn=fn, **conv_kwargs)
  lhs_shape, rhs_shape = p.expanded(lhs.shape), p.expanded(rhs.shape)
  x = jax.ShapeDtypeStruct(tuple(lhs_shape[a] for a in p.x_perm), p.compute_dtype)
  w = jax.ShapeDtypeStruct(tuple(rhs_shape[a] for a in p.w_perm), p.compute_dtype)
  return problems_of(p.spec, x, w, p.kernel_out_dtype)


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
  prim = rules.PRIMITIVES[problem.op]
  out_shape = jax.eval_shape(lambda a, b: prim.bind(a, b, spec=problem.spec, out_dtype=problem.out_dtype),
                             *problem.operands)
  set_bytes = sum(_nbytes(a) for a in problem.operands) + _nbytes(out_shape)
  nsets = max(1, min(_MAX_SETS, _SET_BUDGET_BYTES // max(1, set_bytes)))
  sets = _random_sets(problem, nsets, seed)

  compiled, errors = {}, {}
  for name in names_:
    spec = problem.spec.replace(algorithm=name)  # a forced variant

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
    cached = cache.lookup(key) if reuse_cache else None
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
    cache.store(new_entries)
  return result


def autotune(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None, dimension_numbers=None,
             feature_group_count=1, batch_group_count=1, precision=None, preferred_element_type=None, *,
             ops: Sequence[str] = registry.OPS, reuse_cache: bool = False) -> AutotuneResult:
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
  if not ops or any(op not in registry.OPS for op in ops):
    raise ValueError(f"{fn}: ops must be a non-empty subset of {registry.OPS}, got {ops!r}")
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
  if cache.autotune_mode() != "on" or getattr(_state, "suspended", False) or jax.default_backend() != "gpu":
    return
  if not _native.built_with_cuda():
    return
  kind = jax.devices()[0].device_kind
  sig = (spec.linear().replace(poison=False), tuple(x.shape), np.dtype(x.dtype), tuple(w.shape),
         np.dtype(out_dtype), kind, cache.cache_path())
  if sig in _on_trace_done:
    return
  _on_trace_done.add(sig)
  try:
    problems = problems_of(spec, x, w, out_dtype)
    missing = [p for p in problems.values() if cache.lookup(p.key(kind)) is None]
    if missing:
      with _suspended(), jax.ensure_compile_time_eval():
        _tune(missing, kind, reuse_cache=False)
  except Exception as e:  # noqa: BLE001 - tuning must never break the user's program
    warnings.warn(f"jaxconv: autotuning at trace time failed ({type(e).__name__}: {e}); the heuristic is used",
                  stacklevel=3)
