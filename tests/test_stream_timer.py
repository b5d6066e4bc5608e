"""The benchmarks' in-stream timer: its marks bracket exactly the wrapped ops, on whatever backend runs them."""

import re
import time

import jax
import jax.numpy as jnp
import pytest

from jaxconv.bench import stream_timer


def _entry_ops(compiled_text):
  """Instruction lines of the scheduled entry computation, in order."""
  body = compiled_text[compiled_text.index("ENTRY"):].splitlines()[1:]
  return [l.strip() for l in body if "=" in l and not l.strip().startswith("ROOT")]


def _chain(k):
  def run(x, w, unused):
    for _ in range(k):
      x = jnp.tanh(x @ w)
    return (x,)
  return run


def _args(n=384):
  kx, kw = jax.random.split(jax.random.key(3))
  x = jax.random.normal(kx, (n, n), jnp.float32)
  w = jax.random.normal(kw, (n, n), jnp.float32) / n**0.5
  return x, w, jnp.ones((n, n), jnp.float32)


def test_marks_bracket_every_op_and_skip_unused_arguments():
  timer = stream_timer.StreamTimer()
  try:
    text = jax.jit(timer.wrap(_chain(3))).lower(*_args()).compile().as_text()
  finally:
    timer.release()
  ops = _entry_ops(text)
  marks = [i for i, l in enumerate(ops) if stream_timer.TARGET in l and "custom-call" in l]
  assert len(marks) == 2, ops
  work = [i for i, l in enumerate(ops) if re.search(r"\s(dot|fusion|convolution|custom-call)\(", l)
          and stream_timer.TARGET not in l]
  assert work and marks[0] < min(work) and max(work) < marks[1], ops
  # The unused third argument is neither marked nor copied.
  assert not any(re.search(r"copy\(%\S*args_2", l) for l in ops), ops
  assert "args_2" not in ops[marks[0]], ops[marks[0]]


def test_span_grows_with_the_work_and_fits_in_the_call():
  """16 times the work gives a span over 4 times as long, never longer than the call. On a GPU a span also holds the
  host's launch work between the marks (tens of microseconds), so each step there is a 2048^2 product that outlasts
  its launch."""
  args = _args(2048 if jax.default_backend() == "gpu" else 512)
  spans = {}
  for k in (1, 16):
    timer = stream_timer.StreamTimer()
    try:
      f = jax.jit(timer.wrap(_chain(k)))
      jax.block_until_ready(f(*args))
      best = float("inf")
      for _ in range(10):
        t0 = time.perf_counter()
        out = f(*args)
        jax.block_until_ready(out)
        w = time.perf_counter() - t0
        s = timer.elapsed_s()
        assert 0 < s <= w, (k, s, w)
        best = min(best, s)
      spans[k] = best
    finally:
      timer.release()
  assert spans[16] > 4 * spans[1], spans


def test_errors_name_the_timer():
  timer = stream_timer.StreamTimer()
  f = jax.jit(timer.wrap(_chain(1)))
  with pytest.raises(ValueError, match="not marked"):
    timer.elapsed_s()  # before any call
  jax.block_until_ready(f(*_args(64)))
  assert timer.elapsed_s() > 0
  timer.release()
  with pytest.raises(ValueError, match="unknown timer id"):
    timer.elapsed_s()
  # (A call after release fails in the mark's handler too; not run here: the failed side-effect token would stay
  # in jax's runtime tokens and fail later effects barriers in this process.)
