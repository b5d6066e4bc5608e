"""The three convolution primitives and their rules: shapes, binding, differentiation, batching.

    conv_fwd_p(x, w[, bias])  -> y     forward convolution (optionally act(conv + bias))
    conv_dgrad_p(dy, w)       -> dx    data gradient (transposed convolution)
    conv_wgrad_p(x, dy)       -> dw    filter gradient

All three carry the same ConvSpec (the forward relation) and the result dtype. They are bilinear and closed
under transposition, so gradients of every order run on the project's kernels:

    fwd:   d/dx -> dgrad(ct, w)     d/dw -> wgrad(x, ct)
    dgrad: d/ddy -> fwd(ct, w)      d/dw -> wgrad(ct, dy)
    wgrad: d/dx -> dgrad(dy, ct)    d/ddy -> fwd(x, ct)

The fused epilogue (bias, activation) is only ever a primal: its JVP computes the pre-activation with the
fused bias, applies the activation with jax.numpy, and builds tangents from the linear forward convolution.

vmap folds the mapped axis into the batch when only activations are mapped, into the output features
(inside each group) when only the filter is, and into feature groups (or batch groups) when both are, so a
per-example gradient is one grouped wgrad call, not a loop.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from jaxconv.primitives import sharding
from jaxconv.spec import ConvSpec

conv_fwd_p = Primitive("jaxconv_fwd")
conv_dgrad_p = Primitive("jaxconv_dgrad")
conv_wgrad_p = Primitive("jaxconv_wgrad")

_ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
}


def activation_fn(name):
  """The jax.numpy function of an epilogue activation (identity for None)."""
  return (lambda z: z) if name is None else _ACTIVATIONS[name]


# ---------------------------------------------------------------------------------------------------------
# Shapes (abstract evaluation). User-facing validation with friendly messages lives in api.py; these checks
# catch internal misuse of the primitives.
# ---------------------------------------------------------------------------------------------------------
def _require(cond, msg):
  if not cond:
    raise ValueError(msg)


_FLOATS = tuple(np.dtype(d) for d in ("float32", "float64", jnp.bfloat16, "float16"))
_INTS = tuple(np.dtype(d) for d in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"))


def _check_operands(name, a, b, out_dtype):
  """The kernels' dtype pairs (csrc/core/types.h ValidDTypePair): a floating operand type with itself or float32 (for
  16-bit operands) as the result; an integer or bool operand type with any integer or bool result (forward only)."""
  _require(a.ndim == b.ndim, f"{name}: operands have ranks {a.ndim} and {b.ndim}")
  if a.dtype != b.dtype:
    raise TypeError(f"{name}: operands must share one dtype, got {a.dtype} and {b.dtype}")
  out_dtype = np.dtype(out_dtype)
  if a.dtype in _INTS:
    ok = out_dtype in _INTS and name == "jaxconv_fwd"
  else:
    ok = a.dtype in _FLOATS and (out_dtype == a.dtype or (out_dtype == np.float32 and a.dtype != np.float64))
  if not ok:
    raise TypeError(f"{name}: result dtype {out_dtype} is not supported for {a.dtype} operands (the public "
                    "functions convert other types to ones the kernels take)")


def fwd_shape(x_shape, w_shape, spec: ConvSpec):
  nb_ax, f_ax = spec.act_axes()
  o_ax, i_ax = spec.filter_axes()
  n, c = x_shape[nb_ax], x_shape[f_ax]
  k, cg = w_shape[o_ax], w_shape[i_ax]
  g, b = spec.feature_groups, spec.batch_groups
  _require(spec.spatial_of_act(x_shape) == spec.in_spatial,
           f"jaxconv_fwd: x spatial dims {x_shape} do not match the spec {spec.in_spatial}")
  _require(spec.spatial_of_filter(w_shape) == spec.window,
           f"jaxconv_fwd: w window {w_shape} does not match the spec {spec.window}")
  _require(c % g == 0 and c // g == cg, f"jaxconv_fwd: x features {c} / groups {g} != w in-features {cg}")
  _require(k % g == 0 and k % b == 0 and n % b == 0,
           f"jaxconv_fwd: groups {g}, batch groups {b} do not divide K={k}, N={n}")
  return spec.act_shape(n // b, k, spec.out_spatial)


def dgrad_shape(dy_shape, w_shape, spec: ConvSpec):
  nb_ax, f_ax = spec.act_axes()
  o_ax, i_ax = spec.filter_axes()
  _require(spec.spatial_of_act(dy_shape) == spec.out_spatial,
           f"jaxconv_dgrad: dy spatial dims {dy_shape} do not match the spec {spec.out_spatial}")
  _require(spec.spatial_of_filter(w_shape) == spec.window,
           f"jaxconv_dgrad: w window {w_shape} does not match the spec {spec.window}")
  _require(dy_shape[f_ax] == w_shape[o_ax],
           f"jaxconv_dgrad: dy features {dy_shape[f_ax]} != w out-features {w_shape[o_ax]}")
  k = w_shape[o_ax]
  _require(k % spec.feature_groups == 0 and k % spec.batch_groups == 0,
           f"jaxconv_dgrad: groups do not divide K={k}")
  return spec.act_shape(dy_shape[nb_ax] * spec.batch_groups, w_shape[i_ax] * spec.feature_groups,
                        spec.in_spatial)


def wgrad_shape(x_shape, dy_shape, spec: ConvSpec):
  nb_ax, f_ax = spec.act_axes()
  _require(spec.spatial_of_act(x_shape) == spec.in_spatial,
           f"jaxconv_wgrad: x spatial dims {x_shape} do not match the spec {spec.in_spatial}")
  _require(spec.spatial_of_act(dy_shape) == spec.out_spatial,
           f"jaxconv_wgrad: dy spatial dims {dy_shape} do not match the spec {spec.out_spatial}")
  n, c, k = x_shape[nb_ax], x_shape[f_ax], dy_shape[f_ax]
  g, b = spec.feature_groups, spec.batch_groups
  _require(c % g == 0 and k % g == 0 and k % b == 0 and n % b == 0 and n // b == dy_shape[nb_ax],
           f"jaxconv_wgrad: x {x_shape} and dy {dy_shape} do not fit groups {g}, batch groups {b}")
  return spec.filter_shape(k, c // g)


def _fwd_abstract(x, w, *bias, spec, out_dtype):
  _check_operands("jaxconv_fwd", x, w, out_dtype)
  shape = fwd_shape(x.shape, w.shape, spec)
  _require(len(bias) == int(spec.has_bias), "jaxconv_fwd: bias operand does not match spec.has_bias")
  if bias:
    k = shape[spec.act_axes()[1]]
    _require(bias[0].shape == (k,) and bias[0].dtype == np.dtype(out_dtype),
             f"jaxconv_fwd: bias must have shape ({k},) and dtype {np.dtype(out_dtype)}")
  return ShapedArray(shape, out_dtype)


def _dgrad_abstract(dy, w, *, spec, out_dtype):
  _check_operands("jaxconv_dgrad", dy, w, out_dtype)
  _require(not spec.has_epilogue, "jaxconv_dgrad: the spec must have no epilogue")
  return ShapedArray(dgrad_shape(dy.shape, w.shape, spec), out_dtype)


def _wgrad_abstract(x, dy, *, spec, out_dtype):
  _check_operands("jaxconv_wgrad", x, dy, out_dtype)
  _require(not spec.has_epilogue, "jaxconv_wgrad: the spec must have no epilogue")
  return ShapedArray(wgrad_shape(x.shape, dy.shape, spec), out_dtype)


conv_fwd_p.def_abstract_eval(_fwd_abstract)
conv_dgrad_p.def_abstract_eval(_dgrad_abstract)
conv_wgrad_p.def_abstract_eval(_wgrad_abstract)


# ---------------------------------------------------------------------------------------------------------
# Binding helpers: every caller (api, AD rules, batching rules) goes through these. They answer
# empty problems without a custom call (an empty reduction gives zeros, or act(bias)).
# ---------------------------------------------------------------------------------------------------------
def conv_fwd(x, w, bias, spec: ConvSpec, out_dtype):
  """y = act(conv(x, w) + bias) with spec's epilogue; bias is None unless spec.has_bias."""
  out_dtype = np.dtype(out_dtype)
  shape = fwd_shape(x.shape, w.shape, spec)
  operands = (x, w) if bias is None else (x, w, bias)
  if math.prod(shape) == 0:
    return jnp.zeros(shape, out_dtype)
  if x.size == 0 or w.size == 0:
    z = jnp.zeros(shape, out_dtype)
    if bias is not None:
      z = z + jax.lax.broadcast_in_dim(bias, shape, (spec.act_axes()[1],))
    return activation_fn(spec.activation)(z).astype(out_dtype)
  return conv_fwd_p.bind(*operands, spec=spec, out_dtype=out_dtype)


def conv_dgrad(dy, w, spec: ConvSpec, out_dtype):
  out_dtype = np.dtype(out_dtype)
  shape = dgrad_shape(dy.shape, w.shape, spec)
  if math.prod(shape) == 0 or dy.size == 0 or w.size == 0:
    return jnp.zeros(shape, out_dtype)
  return conv_dgrad_p.bind(dy, w, spec=spec, out_dtype=out_dtype)


def conv_wgrad(x, dy, spec: ConvSpec, out_dtype):
  out_dtype = np.dtype(out_dtype)
  shape = wgrad_shape(x.shape, dy.shape, spec)
  if math.prod(shape) == 0 or x.size == 0 or dy.size == 0:
    return jnp.zeros(shape, out_dtype)
  return conv_wgrad_p.bind(x, dy, spec=spec, out_dtype=out_dtype)


# ---------------------------------------------------------------------------------------------------------
# Evaluation outside jit (the lowerings live in lowering.py).
# ---------------------------------------------------------------------------------------------------------
def _def_impl(prim):
  @functools.cache
  def compiled(spec, out_dtype, nargs):
    return jax.jit(lambda *args: prim.bind(*args, spec=spec, out_dtype=out_dtype))

  prim.def_impl(lambda *args, spec, out_dtype: compiled(spec, out_dtype, len(args))(*args))


for _p in (conv_fwd_p, conv_dgrad_p, conv_wgrad_p):
  _def_impl(_p)


def nck(prim, spec: ConvSpec, avals):
  """(N, C, K) of the forward relation from an op's operand shapes."""
  nb_ax, f_ax = spec.act_axes()
  o_ax, i_ax = spec.filter_axes()
  a, b = avals[0].shape, avals[1].shape
  if prim is conv_fwd_p:
    return a[nb_ax], a[f_ax], b[o_ax]
  if prim is conv_dgrad_p:
    return a[nb_ax] * spec.batch_groups, b[i_ax] * spec.feature_groups, b[o_ax]
  return a[nb_ax], a[f_ax], b[f_ax]


OP_NAMES = {conv_fwd_p: "fwd", conv_dgrad_p: "dgrad", conv_wgrad_p: "wgrad"}
PRIMITIVES = {name: prim for prim, name in OP_NAMES.items()}


# ---------------------------------------------------------------------------------------------------------
# Differentiation.
# ---------------------------------------------------------------------------------------------------------
def _wider(a, b):
  """The wider of two kernel float types; bfloat16 with float16 is float32. Not jnp.promote_types: under
  jax_numpy_dtype_promotion='strict' that refuses bfloat16 with float32, which lax's gradients take."""
  a, b = np.dtype(a), np.dtype(b)
  if a == b:
    return a
  if a.itemsize != b.itemsize:
    return a if a.itemsize > b.itemsize else b
  return np.dtype(np.float32)


def _common_dtype(*arrays):
  """Casts operands to one dtype (a cotangent may be wider than the primal it meets, as in lax)."""
  dt = functools.reduce(_wider, [a.dtype for a in arrays])
  return [a if a.dtype == dt else a.astype(dt) for a in arrays], dt


def _fwd_jvp(primals, tangents, *, spec, out_dtype):
  x, w, *bias = primals
  dx, dw, *dbias = tangents
  z = conv_fwd_p.bind(*primals, spec=spec.replace(activation=None), out_dtype=out_dtype)
  lin = spec.linear()
  parts = []
  if type(dx) is not ad.Zero:
    parts.append(conv_fwd(dx, w, None, lin, out_dtype))
  if type(dw) is not ad.Zero:
    parts.append(conv_fwd(x, dw, None, lin, out_dtype))
  if dbias and type(dbias[0]) is not ad.Zero:
    parts.append(jax.lax.broadcast_in_dim(dbias[0], z.shape, (spec.act_axes()[1],)))
  if spec.activation is None:
    return z, (functools.reduce(jnp.add, parts) if parts else ad.Zero.from_primal_value(z))
  dz = functools.reduce(jnp.add, parts) if parts else jnp.zeros_like(z)
  return jax.jvp(activation_fn(spec.activation), (z,), (dz,))


def _like(y, aval):
  """A cotangent in its primal's type: its dtype, and under explicit mesh axes its sharding (as lax's transposes
  pass the primal's sharding as the out_sharding of theirs)."""
  return sharding.match_sharding(y.astype(aval.dtype), aval)


def _fwd_transpose(ct, x, w, *bias, spec, out_dtype):
  # Only the linear forward convolution appears in tangent equations, so only it is transposed.
  assert not bias and not spec.has_epilogue, "jaxconv_fwd with an epilogue is not linear"
  if ad.is_undefined_primal(x):
    if type(ct) is ad.Zero:
      return ad.Zero(x.aval), None
    (ct_, w_), dt = _common_dtype(ct, w)
    return _like(conv_dgrad(ct_, w_, spec, dt), x.aval), None
  if type(ct) is ad.Zero:
    return None, ad.Zero(w.aval)
  (x_, ct_), dt = _common_dtype(x, ct)
  return None, _like(conv_wgrad(x_, ct_, spec, dt), w.aval)


ad.primitive_jvps[conv_fwd_p] = _fwd_jvp
ad.primitive_transposes[conv_fwd_p] = _fwd_transpose


def _dgrad_transpose_dy(ct, dy, w, *, spec, out_dtype):
  (ct_, w_), dt = _common_dtype(ct, w)
  return _like(conv_fwd(ct_, w_, None, spec, dt), dy.aval)


def _dgrad_transpose_w(ct, dy, w, *, spec, out_dtype):
  (ct_, dy_), dt = _common_dtype(ct, dy)
  return _like(conv_wgrad(ct_, dy_, spec, dt), w.aval)


def _wgrad_transpose_x(ct, x, dy, *, spec, out_dtype):
  (dy_, ct_), dt = _common_dtype(dy, ct)
  return _like(conv_dgrad(dy_, ct_, spec, dt), x.aval)


def _wgrad_transpose_dy(ct, x, dy, *, spec, out_dtype):
  (x_, ct_), dt = _common_dtype(x, ct)
  return _like(conv_fwd(x_, ct_, None, spec, dt), dy.aval)


ad.defbilinear(conv_dgrad_p, _dgrad_transpose_dy, _dgrad_transpose_w)
ad.defbilinear(conv_wgrad_p, _wgrad_transpose_x, _wgrad_transpose_dy)


# ---------------------------------------------------------------------------------------------------------
# Batching.
# ---------------------------------------------------------------------------------------------------------
def _merge(a, axis, inner_groups=1):
  """Folds the mapped axis (at 0) into `axis` of the unmapped array, V-major; with inner_groups=g the axis
  is read as (g, m) and becomes (g, V, m), i.e. V goes inside each group."""
  v = a.shape[0]
  a = jnp.moveaxis(a, 0, axis)
  s = a.shape
  size = s[axis + 1]
  a = a.reshape(s[:axis] + (v, inner_groups, size // inner_groups) + s[axis + 2:])
  a = jnp.swapaxes(a, axis, axis + 1)
  return a.reshape(s[:axis] + (v * size,) + s[axis + 2:])


def _unmerge(a, axis, v, inner_groups=1):
  """Inverse of _merge: splits V out of `axis` and returns it as axis 0."""
  s = a.shape
  size = s[axis] // v
  a = a.reshape(s[:axis] + (inner_groups, v, size // inner_groups) + s[axis + 1:])
  a = jnp.swapaxes(a, axis, axis + 1)
  a = a.reshape(s[:axis] + (v, size) + s[axis + 1:])
  return jnp.moveaxis(a, axis, 0)


def _to_front(args, dims, size):
  """Moves every mapped axis to 0 and broadcasts unmapped operands (when all must be mapped)."""
  out = []
  for a, d in zip(args, dims):
    if d is None:
      out.append(jnp.broadcast_to(a, (size, *a.shape)))
    else:
      out.append(jnp.moveaxis(a, d, 0))
  return out


def _axis_size(args, dims):
  return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def _grouped(spec: ConvSpec, v: int) -> ConvSpec:
  """The spec after folding v mapped problems into groups (feature groups, or batch groups if in use)."""
  if spec.batch_groups > 1:
    return spec.replace(batch_groups=spec.batch_groups * v)
  return spec.replace(feature_groups=spec.feature_groups * v)


def _empty_batch(prim, args, dims, v, spec, out_dtype):
  unmapped = [a if d is None else jax.ShapeDtypeStruct(
      a.shape[:d] + a.shape[d + 1:], a.dtype) for a, d in zip(args, dims)]
  shape = {conv_fwd_p: fwd_shape, conv_dgrad_p: dgrad_shape, conv_wgrad_p: wgrad_shape}[prim](
      unmapped[0].shape, unmapped[1].shape, spec)
  return jnp.zeros((v, *shape), out_dtype), 0


def _fwd_batch(args, dims, *, spec, out_dtype):
  v = _axis_size(args, dims)
  if v == 0:
    return _empty_batch(conv_fwd_p, args, dims, v, spec, out_dtype)
  nb_ax, f_ax = spec.act_axes()
  o_ax, _ = spec.filter_axes()
  x_mapped = dims[0] is not None
  others_mapped = any(d is not None for d in dims[1:])
  bias = args[2] if len(args) > 2 else None
  if x_mapped and not others_mapped:  # fold into the batch: x (B, V, N/B) -> y (V, N/B)
    x = _merge(jnp.moveaxis(args[0], dims[0], 0), nb_ax, spec.batch_groups)
    return _unmerge(conv_fwd(x, args[1], bias, spec, out_dtype), nb_ax, v), 0
  if not x_mapped:  # fold into the output features, inside each group
    grp = max(spec.feature_groups, spec.batch_groups)
    w, *b = _to_front(args[1:], dims[1:], v)
    w = _merge(w, o_ax, grp)
    b = _merge(b[0], 0, grp) if b else None
    return _unmerge(conv_fwd(args[0], w, b, spec, out_dtype), f_ax, v, grp), 0
  x, w, *b = _to_front(args, dims, v)  # both: fold into groups
  x = _merge(x, nb_ax if spec.batch_groups > 1 else f_ax)
  y = conv_fwd(x, _merge(w, o_ax), _merge(b[0], 0) if b else None, _grouped(spec, v), out_dtype)
  return _unmerge(y, f_ax, v), 0


def _dgrad_batch(args, dims, *, spec, out_dtype):
  v = _axis_size(args, dims)
  if v == 0:
    return _empty_batch(conv_dgrad_p, args, dims, v, spec, out_dtype)
  nb_ax, f_ax = spec.act_axes()
  o_ax, _ = spec.filter_axes()
  if dims[1] is None:  # fold into the batch: dy (V, N/B) -> dx (B, V, N/B)
    dy = _merge(jnp.moveaxis(args[0], dims[0], 0), nb_ax)
    return _unmerge(conv_dgrad(dy, args[1], spec, out_dtype), nb_ax, v, spec.batch_groups), 0
  dy, w = _to_front(args, dims, v)
  dx = conv_dgrad(_merge(dy, f_ax), _merge(w, o_ax), _grouped(spec, v), out_dtype)
  return _unmerge(dx, nb_ax if spec.batch_groups > 1 else f_ax, v), 0


def _wgrad_batch(args, dims, *, spec, out_dtype):
  v = _axis_size(args, dims)
  if v == 0:
    return _empty_batch(conv_wgrad_p, args, dims, v, spec, out_dtype)
  nb_ax, f_ax = spec.act_axes()
  o_ax, _ = spec.filter_axes()
  x, dy = _to_front(args, dims, v)
  x = _merge(x, nb_ax if spec.batch_groups > 1 else f_ax)
  dw = conv_wgrad(x, _merge(dy, f_ax), _grouped(spec, v), out_dtype)
  return _unmerge(dw, o_ax, v), 0


batching.primitive_batchers[conv_fwd_p] = _fwd_batch
batching.primitive_batchers[conv_dgrad_p] = _dgrad_batch
batching.primitive_batchers[conv_wgrad_p] = _wgrad_batch
