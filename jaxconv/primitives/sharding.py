"""Sharding for the three convolution primitives: SPMD partitioning under `jit` and `shard_map` support.

Under a sharded `jit`, XLA replicates (all-gathers) the operands of a custom call it knows nothing about.
`register` gives every primitive two things, at one registration point:

1. A partitioned lowering. The primitive's lowering rule lowers a `custom_partitioning` function whose body
   binds a private *local* twin of the primitive (same abstract evaluation, lowered by the plain FFI rule).
   AD and vmap act on the public primitives, so every instance they produce (forward, data gradient, filter
   gradient, per-example versions) is partitioned the same way. The partition callback plans per op:

     op     batch-sharded N (mesh axes a)                 output-channel-sharded K (mesh axes m)
     fwd    x, y sharded on N; w, bias replicated         w, bias, y sharded on K; x replicated
     dgrad  dy, dx sharded on N; w replicated             dy, w sharded on K; local dx psum'd over m
     wgrad  x, dy sharded on N; local dw psum'd over a    dy, dw sharded on K; x replicated

   Both at once (a 2-D data x model mesh) compose. N sharding needs batch_group_count == 1; K sharding
   needs feature_group_count == batch_group_count == 1; both need the dimension divisible by the number of
   shards. Everything else (sharded spatial dims, sharded input channels, grouped channels, uneven shards,
   shardings that are not NamedShardings) is replicated by the plan: correct, possibly slower, never a wrong
   answer. The native params attribute (N, C, K) is computed from the *local* shapes of each shard.

   Propagation: a Shardy rule (jax's default partitioner) and an `infer_sharding_from_operands` callback
   (GSPMD) describe the same plan.

2. Sharding in types. Under explicit mesh axes (jax.make_mesh's default) a result's type carries its sharding, as
   lax's convolution's does (`_conv_general_dilated_sharding_rule`): the abstract evaluation derives it from the
   operands' types (`result_sharding`), the lowering constrains the result to it, and the transposes bring each
   cotangent to its primal's type (`match_sharding`). Activations keep the batch and spatial sharding of the
   activation operand where the extent allows (lax's rule); the output channels take the filter's (or dy's)
   channel sharding as the partition plan does, where lax would ask for an out_sharding; everything else is
   replicated. Under Auto or manual axes only, results are typed as lax's are (replicated, or varying manual axes).

3. `shard_map` support (varying manual axes). Operands are brought to one set of varying manual axes before
   every bind (`pvary` on a replicated filter whose activations vary, as lax does for its own ops), and the
   result's type carries that set. Since `pvary` transposes to `psum`, the filter gradient of a replicated
   filter is summed over the devices, instead of each device keeping its local part (the wrong-gradient bug
   of jax-finufft #226, fixed by jax-finufft #232 the same way).
"""

from __future__ import annotations

import functools
import math

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxconv import _jax_compat

# ---------------------------------------------------------------------------------------------------------
# shard_map: varying manual axes.
# ---------------------------------------------------------------------------------------------------------
def reconcile_vma(*args):
  """Operands with one common set of varying manual axes (pvary where needed); a no-op outside shard_map."""
  if not args:
    return args
  return tuple(_jax_compat.get("insert_reshard")(*args))


def _varying(aval):
  mat = getattr(aval, "manual_axis_type", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", frozenset()))


def _with_vma(out_aval, in_avals):
  """The result type with the operands' varying manual axes (they must agree: reconcile_vma made them)."""
  vmas = {_varying(a) for a in in_avals}
  if len(vmas) > 1:
    raise ValueError(f"jaxconv: operands vary over different manual mesh axes {sorted(map(sorted, vmas))}; "
                     "bind the primitives through jaxconv's functions (they insert the pvary)")
  vma = vmas.pop() if vmas else frozenset()
  if not vma:
    return out_aval
  return out_aval.update(sharding=_jax_compat.get("get_cur_mesh_sharding")(),
                         manual_axis_type=_jax_compat.get("ManualAxisType")(varying=vma))


# ---------------------------------------------------------------------------------------------------------
# Sharding in types.
# ---------------------------------------------------------------------------------------------------------
def _mesh_of(avals):
  """The operands' abstract mesh, else the current one (as lax's rules choose it)."""
  for a in avals:
    mesh = getattr(getattr(a, "sharding", None), "mesh", None)
    if mesh is not None and not mesh.empty:
      return mesh
  return jax.sharding.get_abstract_mesh()


def _explicit_axes(mesh) -> frozenset:
  if mesh is None or mesh.empty:
    return frozenset()
  return frozenset(n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Explicit)


def _entries(aval):
  """An operand's PartitionSpec entries, one per dim (None: replicated)."""
  spec = tuple(getattr(aval.sharding, "spec", ()))
  return spec + (None,) * (aval.ndim - len(spec))


def _kept(entry, in_size, out_size, mesh):
  """lax's rule for a dim whose size may change: the operand's sharding stays where the extent allows it."""
  if entry is None or in_size == out_size:
    return entry
  return entry if out_size % math.prod(mesh.shape[a] for a in _axes(entry)) == 0 else None


def result_spec(kind, spec, avals, out_shape, mesh):
  """The PartitionSpec of an op's result under explicit axes (module docstring, item 2), in the native layout."""
  nb_ax, f_ax = spec.act_axes()
  o_ax, _ = spec.filter_axes()
  g, b = spec.feature_groups, spec.batch_groups
  nd = len(out_shape)
  out = [None] * nd
  a, bb = avals[0], avals[1]
  a_spec, b_spec = _entries(a), _entries(bb)

  def size(entry):
    return math.prod(mesh.shape[x] for x in _axes(entry))

  if kind in (_FWD, _DGRAD):  # an activation result: batch and spatial dims from the activation operand
    for d in range(nd):
      if d != f_ax:
        out[d] = _kept(a_spec[d], a.shape[d], out_shape[d], mesh)
    if kind == _FWD and a_spec[f_ax] is None and g == 1 and b == 1:
      k_entry = b_spec[o_ax]
      if k_entry is not None and out_shape[f_ax] % size(k_entry) == 0:
        out[f_ax] = k_entry
  else:  # a filter gradient: output channels as dy's channels, the rest replicated (summed over the batch)
    k_entry = b_spec[f_ax]
    if k_entry is not None and g == 1 and b == 1 and out_shape[o_ax] % size(k_entry) == 0:
      out[o_ax] = k_entry
  used = set()
  for d, entry in enumerate(out):  # a mesh axis shards one dim at most
    if entry is not None and set(_axes(entry)) & used:
      out[d] = None
    elif entry is not None:
      used |= set(_axes(entry))
  return P(*out)


def _typed(kind, spec, out_aval, in_avals):
  """The result type: its sharding as lax's rules give it, or the varying manual axes inside shard_map."""
  out_aval = _with_vma(out_aval, in_avals)
  if _varying(out_aval):
    return out_aval
  mesh = _mesh_of(in_avals)
  if not _explicit_axes(mesh):
    return out_aval if mesh.empty else out_aval.update(sharding=NamedSharding(mesh, P()))
  return out_aval.update(sharding=NamedSharding(mesh, result_spec(kind, spec, in_avals, out_aval.shape, mesh)))


def match_sharding(x, aval):
  """x with aval's sharding in types (a cotangent brought to its primal's type under explicit axes, as lax's
  transposes pass the primal's sharding as out_sharding); x itself otherwise."""
  want = getattr(aval, "sharding", None)
  if want is None or not _explicit_axes(want.mesh) or _varying(aval):
    return x
  have = getattr(jax.typeof(x), "sharding", None)
  if have is not None and tuple(_entries(jax.typeof(x))) == tuple(_entries(aval)):
    return x
  return jax.sharding.reshard(x, want)


# ---------------------------------------------------------------------------------------------------------
# Partition plans.
# ---------------------------------------------------------------------------------------------------------
_FWD, _DGRAD, _WGRAD = "jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad"


def _axes(entry):
  """Mesh axis names of one PartitionSpec entry, as a tuple."""
  if entry is None:
    return ()
  if isinstance(entry, str):
    return (entry,)
  return tuple(entry)


def _entry(axes):
  return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def _spec_of(sharding, ndim):
  """The PartitionSpec entries of one operand: all None when not known yet (GSPMD propagation asks with
  partial information), None for a sharding that is not a NamedSharding (the plan then replicates)."""
  if sharding is None:
    return (None,) * ndim
  if not isinstance(sharding, NamedSharding):
    return None
  spec = tuple(sharding.spec) + (None,) * (ndim - len(tuple(sharding.spec)))
  return spec


def _pspec(ndim, **dims):
  """A PartitionSpec of rank ndim with mesh axes at the given dims ({axis: axes})."""
  entries = [None] * ndim
  for ax, axes in dims.values():
    entries[ax] = _entry(axes)
  return P(*entries)


class _Plan:
  """How one op runs on shards: operand and result PartitionSpecs and the axes of a psum of the result."""

  def __init__(self, arg_specs, out_spec, psum_axes=()):
    self.arg_specs, self.out_spec, self.psum_axes = arg_specs, out_spec, tuple(psum_axes)


def _plan(kind, spec, mesh, shapes, shardings):
  """The plan for op `kind` with global operand shapes and the shardings proposed for them."""
  nb_ax, f_ax = spec.act_axes()
  o_ax, _ = spec.filter_axes()
  nd = spec.nspatial + 2
  g, b = spec.feature_groups, spec.batch_groups
  nargs = len(shapes)
  specs = [_spec_of(s, len(sh)) for s, sh in zip(shardings, shapes)]
  replicated = _Plan([P()] * nargs, P())
  if mesh is None or getattr(mesh, "empty", True) or any(s is None for s in specs):
    return replicated

  def size(axes):
    return math.prod(mesh.shape[a] for a in axes)

  def usable(axes, extent, taken=()):
    return bool(axes) and not set(axes) & set(taken) and extent % size(axes) == 0

  # Batch axes: from the activation that carries N (x for fwd/wgrad, dy for dgrad).
  n_axes = _axes(specs[0][nb_ax])
  if kind == _WGRAD and not n_axes:
    n_axes = _axes(specs[1][nb_ax])
  n_extent = shapes[0][nb_ax]
  if not (b == 1 and usable(n_axes, n_extent)):
    n_axes = ()
  # Output-channel axes: from the filter (fwd, dgrad) or dy (wgrad); K must be ungrouped.
  if kind == _FWD:
    k_axes, k_extent = _axes(specs[1][o_ax]), shapes[1][o_ax]
    if not k_axes and nargs == 3:
      k_axes = _axes(specs[2][0])
  elif kind == _DGRAD:
    k_axes, k_extent = _axes(specs[1][o_ax]) or _axes(specs[0][f_ax]), shapes[1][o_ax]
  else:
    k_axes, k_extent = _axes(specs[1][f_ax]), shapes[1][f_ax]
  if not (g == 1 and b == 1 and usable(k_axes, k_extent, n_axes)):
    k_axes = ()

  act_nk = _pspec(nd, n=(nb_ax, n_axes), k=(f_ax, k_axes))
  if kind == _FWD:
    args = [_pspec(nd, n=(nb_ax, n_axes)), _pspec(nd, k=(o_ax, k_axes))]
    if nargs == 3:
      args.append(P(_entry(k_axes)))
    return _Plan(args, act_nk)
  if kind == _DGRAD:
    return _Plan([act_nk, _pspec(nd, k=(o_ax, k_axes))], _pspec(nd, n=(nb_ax, n_axes)), k_axes)
  return _Plan([_pspec(nd, n=(nb_ax, n_axes)), act_nk], _pspec(nd, k=(o_ax, k_axes)), n_axes)


def _sharding_rule(kind, spec):
  """The Shardy rule (einsum-like) matching _plan: only n and k may stay sharded."""
  nb_ax, f_ax = spec.act_axes()
  o_ax, i_ax = spec.filter_axes()
  nd = spec.nspatial + 2
  g, b = spec.feature_groups, spec.batch_groups
  si = [f"i{d}" for d in range(spec.nspatial)]
  so = [f"o{d}" for d in range(spec.nspatial)]
  sw = [f"r{d}" for d in range(spec.nspatial)]
  n_in, n_out = ("n", "n") if b == 1 else ("n", "nb")
  k = "k" if g == 1 and b == 1 else "kg"
  c_act, c_w = ("c", "c") if g == 1 else ("c", "cg")

  def act(n, c, spatial):
    dims = [None] * nd
    dims[nb_ax], dims[f_ax] = n, c
    rest = iter(spatial)
    return " ".join(d if d is not None else next(rest) for d in dims)

  def filt(kk, cc):
    dims = [None] * nd
    dims[o_ax], dims[i_ax] = kk, cc
    rest = iter(sw)
    return " ".join(d if d is not None else next(rest) for d in dims)

  x, w, y = act(n_in, c_act, si), filt(k, c_w), act(n_out, k, so)
  if kind == _FWD:
    operands = [x, w] + ([k] if spec.has_bias else [])
    rule = f"{', '.join(operands)} -> {y}"
  elif kind == _DGRAD:
    rule = f"{y}, {w} -> {x}"
  else:
    rule = f"{x}, {y} -> {w}"
  # Everything but an ungrouped batch and ungrouped output channels is replicated by the plan.
  replicate = [*si, *so, *sw, "c", "cg", "nb", "kg"] + (["n"] if b > 1 else [])
  order = list(dict.fromkeys(rule.replace(",", " ").replace("->", " ").split()))  # Shardy wants them sorted
  return rule, dict(need_replication_factors=tuple(f for f in order if f in replicate))


# ---------------------------------------------------------------------------------------------------------
# Registration.
# ---------------------------------------------------------------------------------------------------------
def _local_twin(prim, lowerings):
  """A private primitive with prim's shapes, lowered straight to the FFI call (no partitioning)."""
  local = Primitive(prim.name + "_local")
  shape_only = prim.abstract_eval
  local.def_effectful_abstract_eval(shape_only)
  for platform, rule in lowerings.items():
    mlir.register_lowering(local, rule, platform=platform)
  return local


def _partitioned(prim, local):
  kind = prim.name

  def impl(spec, out_dtype, *args):
    return local.bind(*args, spec=spec, out_dtype=out_dtype)

  fn = custom_partitioning(impl, static_argnums=(0, 1))

  def partition(spec, out_dtype, mesh, arg_shapes, result_shape):
    shapes = [a.shape for a in arg_shapes]
    plan = _plan(kind, spec, mesh, shapes, [a.sharding for a in arg_shapes])
    # lower_fn runs per shard, so it is traced under an all-manual mesh: jax >= 0.11 calls `partition` where the
    # caller's explicit mesh is current, which would put sharding constraints into the psum's reducer (XLA refuses).
    manual = jax.sharding.AbstractMesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names),
                                       axis_types=(jax.sharding.AxisType.Manual,) * len(mesh.axis_names))

    def lower_fn(*args):
      with jax.sharding.use_abstract_mesh(manual):
        out = local.bind(*args, spec=spec, out_dtype=out_dtype)
        return jax.lax.psum(out, plan.psum_axes) if plan.psum_axes else out

    arg_shardings = tuple(NamedSharding(mesh, s) for s in plan.arg_specs)
    return mesh, lower_fn, NamedSharding(mesh, plan.out_spec), arg_shardings

  def infer(spec, out_dtype, mesh, arg_shapes, result_shape):
    plan = _plan(kind, spec, mesh, [a.shape for a in arg_shapes], [a.sharding for a in arg_shapes])
    return NamedSharding(mesh, plan.out_spec)

  def rule(spec, out_dtype, mesh, value_types, result_types):
    return _sharding_rule(kind, spec)

  fn.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule)
  return fn


def _partitioned_context(ctx) -> bool:
  """Whether the op is lowered for the SPMD partitioner over more than one device."""
  ac = ctx.module_context.axis_context
  if isinstance(ac, _jax_compat.get("ShardingContext")):
    return ac.num_devices > 1 and ac.device_assignment is not None
  if isinstance(ac, _jax_compat.get("SPMDAxisContext")):
    return set(ac.manual_axes) != set(ac.mesh.axis_names)
  return False


def register(prim, lowerings):
  """Makes `prim` shardable: partitioned lowerings from the plain FFI `lowerings` ({platform: rule}),
  results typed with the operands' varying manual axes, and operands reconciled (pvary) before each bind."""
  local = _local_twin(prim, lowerings)
  fn = _partitioned(prim, local)

  def lowering(ctx, *args, spec, out_dtype):
    if _partitioned_context(ctx):
      call = lambda *a: fn(spec, out_dtype, *a)
    else:  # one device, or inside a fully manual shard_map: the FFI call as it is
      call = lambda *a: local.bind(*a, spec=spec, out_dtype=out_dtype)
    out = mlir.lower_fun(call, multiple_results=False)(ctx, *args)
    aval = ctx.avals_out[0]
    if not _explicit_axes(getattr(aval.sharding, "mesh", None)):
      return out
    # Explicit axes: the result is constrained to its type's sharding, as lax's lowerings do.
    lower = _jax_compat.get("lower_with_sharding_in_types")
    (value,) = out
    return [lower(ctx, value, aval)]

  for platform in lowerings:
    mlir.register_lowering(prim, lowering, platform=platform)
  # Like custom_partitioning itself: the partitioner callbacks need the concrete devices at lowering time.
  _jax_compat.get("prim_requires_devices_during_lowering").add(prim)

  shape_only = prim.abstract_eval
  prim.def_effectful_abstract_eval(
      lambda *avals, **params: (lambda out, eff: (_typed(prim.name, params["spec"], out, avals), eff))(
          *shape_only(*avals, **params)))

  plain_bind = type(prim).bind
  prim.bind = functools.partial(_reconciled_bind, plain_bind, prim)


def _reconciled_bind(plain_bind, prim, *args, **params):
  return plain_bind(prim, *reconcile_vma(*args), **params)
