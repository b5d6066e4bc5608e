"""In-stream timing of a jitted span: the device time of T ops, free of the host's dispatch work.

The wall time of call + block_until_ready grows by tens of microseconds per input set in host dispatch (arguments
are prepared before the device starts), so a wall-clock slope over T is the kernel time plus that. A mark before
and after the span, each a side-effecting custom call (`jaxconv_timer_mark`) that records a CUDA event on XLA's
stream (a host clock on the CPU), times what the device did between them: kernels, and the launch gaps between
them, nothing before the first.

    timer = StreamTimer()
    f = jax.jit(timer.wrap(run))   # run(sets) -> outputs
    outs = f(sets); jax.block_until_ready(outs)
    timer.elapsed_s()              # device time of run's ops in that call
"""
from __future__ import annotations

import jax
import numpy as np


TARGET = "jaxconv_timer_mark"


def _ext():
    from jaxconv import _native
    return _native._ext


def available() -> bool:
    """Whether the extension provides the marks (any jaxconv build of this version does)."""
    try:
        return hasattr(_ext(), "timer_create")
    except Exception:
        return False


def _mark(values, timer_id, slot):
    """(token, *values): the values pass through the mark aliased (no copy, except that XLA copies an argument of
    the jitted function before a call may own it), so whatever uses the returned values runs after the mark."""
    shapes = [jax.ShapeDtypeStruct((), np.int32)] + [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in values]
    call = jax.ffi.ffi_call(TARGET, shapes, has_side_effect=True,
                            input_output_aliases={i: i + 1 for i in range(len(values))})
    out = call(*values, timer=np.int64(timer_id), slot=np.int64(slot))
    return out[0], list(out[1:])


def _used_leaves(fn, args):
    """Per flattened argument of fn, whether fn's jaxpr reads it."""
    closed = jax.make_jaxpr(fn)(*args)
    jaxpr = closed.jaxpr
    read = {id(v) for e in jaxpr.eqns for v in e.invars} | {id(v) for v in jaxpr.outvars}
    return [id(v) in read for v in jaxpr.invars]


class StreamTimer:
    """One timer id: wrap() a function once, then read elapsed_s() after each call of the compiled result."""

    def __init__(self):
        self.id = int(_ext().timer_create())

    def wrap(self, fn):
        """fn(*args) -> outputs becomes (*args) -> (outputs, start token, end token). The arguments reach fn
        through the start mark and fn's outputs leave through the end mark (aliased, data dependences XLA keeps,
        where an optimization barrier was dropped on the CPU), so all of fn's ops run between the marks. XLA
        copies the arguments before the start mark (they are the caller's buffers): outside the span."""
        def timed(*args):
            leaves, tree = jax.tree.flatten(args)
            # Only the arguments fn reads pass through the mark (an unused one would be copied for nothing).
            used = _used_leaves(fn, args)
            t0, marked = _mark([v for v, u in zip(leaves, used) if u], self.id, 0)
            it = iter(marked)
            leaves = [next(it) if u else v for v, u in zip(leaves, used)]
            outs = fn(*jax.tree.unflatten(tree, leaves))
            oleaves, otree = jax.tree.flatten(outs)
            t1, oleaves = _mark(oleaves, self.id, 1)
            return jax.tree.unflatten(otree, oleaves), t0, t1
        timed.__name__ = timed.__qualname__ = getattr(fn, "__name__", "timed")
        return timed

    def elapsed_s(self) -> float:
        """Seconds between the marks of the last call (waits for its end mark)."""
        return float(_ext().timer_elapsed_us(self.id)) * 1e-6

    def release(self):
        _ext().timer_release(self.id)
