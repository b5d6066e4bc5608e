"""Lowering the three primitives to their FFI custom calls, and the choice of the CUDA kernel variant.

For CUDA the lowering resolves the spec's request ("auto", a family or a variant; with autotuning on, a cached
variant in place of "auto") with the registry for the GPU it compiles for, and writes the chosen variant into the
params; the variant's workspace becomes a second result of the custom call, which XLA allocates (XLA's FFI scratch
allocator gave no memory on jaxlib 0.11's CUDA plugin). The handler confirms the choice on the device it runs on.
Where the registry picks XLA's own convolution (the xla.conv variant), the op lowers to what lax would emit instead
of a custom call. The CPU handlers have one kernel set and ignore the request.
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax
from jax.core import ShapedArray
from jax.interpreters import mlir

from jaxconv import _native, registry
from jaxconv.primitives import rules, sharding
from jaxconv.spec import ConvSpec
from jaxconv.tuning import cache


def choose(op: str, spec: ConvSpec, nck, dtype, out_dtype, dev=None) -> registry.Choice:
  """The variant a CUDA lowering of this op runs, and its workspace.

  The forward runs the spec's request (ValueError when nothing it selects applies). The gradient ops run it where
  it can, else the registry's auto choice: a request forces the user's convolution, and a family written for a
  forward need not have every gradient of it.
  """
  request = registry.op_request(op, spec.algorithm)
  params = spec.replace(algorithm=request).ffi_params(*nck)
  if request == registry.AUTO and cache.autotune_mode() != "off":
    cached = cache.cached_choice(op, params, dtype, out_dtype)
    if cached is not None:
      choice = registry.resolve(op, spec.replace(algorithm=cached).ffi_params(*nck), dtype, out_dtype, dev)
      if choice.ok:
        return choice
      cache.warn_stale(op, cached, choice.why)
  choice = registry.resolve(op, params, dtype, out_dtype, dev)
  if not choice.ok and op != "fwd" and request != registry.AUTO:
    choice = registry.resolve(op, spec.replace(algorithm=registry.AUTO).ffi_params(*nck), dtype, out_dtype, dev)
  if not choice.ok:
    raise ValueError(f"jaxconv_{op}: {choice.why}")
  return choice


XLA_VARIANT = "xla.conv"
_PRECISION = {"default": lax.Precision.DEFAULT, "high": lax.Precision.HIGH, "highest": lax.Precision.HIGHEST}


def _native_dimension_numbers(spec: ConvSpec):
  nsp = "DHW"[3 - spec.nspatial:]
  if spec.channels_last:
    return ("N" + nsp + "C", nsp + "IO", "N" + nsp + "C")
  return ("NC" + nsp, "OI" + nsp, "NC" + nsp)


def xla_op(op: str, spec: ConvSpec, out_dtype):
  """The op as XLA's own convolution (what lax runs), on the primitive's operands: fwd(x, w[, bias]) ->
  act(conv + bias); dgrad(dy, w) and wgrad(x, dy) as lax's transposes of the forward."""
  out_dtype = np.dtype(out_dtype)

  def conv(x, w):
    return lax.conv_general_dilated(
        x, w, spec.strides, spec.padding, lhs_dilation=spec.lhs_dilation, rhs_dilation=spec.rhs_dilation,
        dimension_numbers=_native_dimension_numbers(spec), feature_group_count=spec.feature_groups,
        batch_group_count=spec.batch_groups, precision=_PRECISION[spec.precision],
        preferred_element_type=out_dtype)

  def fwd(x, w, *bias):
    y = conv(x, w)
    if bias:
      y = y + lax.broadcast_in_dim(bias[0], y.shape, (spec.act_axes()[1],))
    return rules.activation_fn(spec.activation)(y).astype(out_dtype)

  def dgrad(dy, w):
    dx_shape = rules.dgrad_shape(dy.shape, w.shape, spec)
    w = w.astype(out_dtype)  # the transpose computes in the result's type, as lax's rule does
    (dx,) = jax.linear_transpose(lambda x: conv(x, w), jax.ShapeDtypeStruct(dx_shape, out_dtype))(
        dy.astype(out_dtype))
    return dx

  def wgrad(x, dy):
    dw_shape = rules.wgrad_shape(x.shape, dy.shape, spec)
    x = x.astype(out_dtype)
    (dw,) = jax.linear_transpose(lambda w: conv(x, w), jax.ShapeDtypeStruct(dw_shape, out_dtype))(
        dy.astype(out_dtype))
    return dw

  return {"fwd": fwd, "dgrad": dgrad, "wgrad": wgrad}[op]


def _make_lowering(prim, platform):
  op = rules.OP_NAMES[prim]

  def lowering(ctx, *args, spec, out_dtype):
    nck = rules.nck(prim, spec, ctx.avals_in)
    choice = choose(op, spec, nck, ctx.avals_in[0].dtype, out_dtype) if platform == "cuda" else None
    if choice is not None and choice.name == XLA_VARIANT:
      return mlir.lower_fun(xla_op(op, spec, out_dtype), multiple_results=False)(ctx, *args)
    if prim is rules.conv_fwd_p and not spec.has_bias:
      # The fwd handler always takes a bias operand; an empty one means "no bias".
      empty = np.zeros((0,), np.dtype(out_dtype))
      args = (*args, mlir.ir_constant(empty))
      ctx = ctx.replace(avals_in=(*ctx.avals_in, ShapedArray(empty.shape, empty.dtype)))
    if platform != "cuda":
      return jax.ffi.ffi_lowering(prim.name)(ctx, *args, params=spec.ffi_params(*nck))
    # The request stays in the params (a forced one must not widen on another GPU); the variant is the choice.
    request = registry.op_request(op, spec.algorithm)
    if not registry.selects(request, choice.name):
      request = registry.AUTO  # a gradient op the request has no variant for (choose)
    params = spec.replace(algorithm=request).ffi_params(*nck, variant=choice.index)
    ws = ShapedArray((choice.workspace_bytes,), np.uint8)
    out = jax.ffi.ffi_lowering(prim.name)(ctx.replace(avals_out=(*ctx.avals_out, ws)), *args, params=params)
    return out[:1]

  return lowering


def _no_cuda_lowering(ctx, *args, **params):
  raise NotImplementedError(
      "jaxconv was compiled without CUDA (nvcc was not found at build time), so its convolutions cannot "
      "run on the GPU; reinstall with nvcc on the PATH (JAXCONV_CUDA=ON) or run on the CPU")


for _p in (rules.conv_fwd_p, rules.conv_dgrad_p, rules.conv_wgrad_p):
  # Partitioned lowerings (batch / output-channel sharding), shard_map varying axes: see sharding.py.
  sharding.register(_p, {"cpu": _make_lowering(_p, "cpu"),
                         "cuda": _make_lowering(_p, "cuda") if _native.built_with_cuda() else _no_cuda_lowering})
