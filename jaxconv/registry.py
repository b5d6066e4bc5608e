"""The kernel variant registry as Python sees it: a mirror of csrc/dispatch/variants.def, read from the extension.

Every CUDA kernel variant is one entry: a name ("<family>.<technique>"), its family, the ops and operand dtypes it
implements, the file it lives in, and a pure predicate (in C++) that says why it does not run a problem. `auto` is
the table's order plus each variant's cost rule; nothing else chooses a kernel. A request is "auto", a family name
(the first of its variants that applies) or a variant name (that one).

The predicates need the GPU's description (compute capability, multiprocessors, shared memory): `device()` gives the
one the lowering compiles for, a default Hopper where there is no GPU (as when exporting).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Tuple

import numpy as np

from jaxconv import _native

AUTO = "auto"
OPS = ("fwd", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Variant:
  """One registry entry (csrc/dispatch/variants.def)."""
  name: str
  family: str
  also: str
  ops: Tuple[str, ...]
  dtypes: Tuple[str, ...]
  file: str
  summary: str

  @property
  def selectors(self) -> Tuple[str, ...]:
    """The names that select it: its own, its family's and its second selector's."""
    return tuple(s for s in (self.name, self.family, self.also) if s)


@functools.cache
def variants() -> Tuple[Variant, ...]:
  """Every variant, in the order auto tries them."""
  return tuple(Variant(name=v["name"], family=v["family"], also=v["also"], ops=tuple(v["ops"]),
                       dtypes=tuple(v["dtypes"]), file=v["file"], summary=v["summary"])
               for v in _native.ext().variants())


@functools.cache
def families() -> Tuple[str, ...]:
  """The family selector names (algorithm= takes these as before)."""
  return tuple(_native.ext().families())


def variant_names() -> Tuple[str, ...]:
  return tuple(v.name for v in variants())


def names() -> Tuple[str, ...]:
  """Every name algorithm= takes but "auto": the families, then the variants."""
  return families() + variant_names()


def request_code(name: str) -> int:
  """The params.algorithm code of a request name; ValueError for a name the registry does not know."""
  code = int(_native.ext().request_of(str(name)))
  if code < 0:
    raise ValueError(f"unknown algorithm {name!r}: expected 'auto', a family ({', '.join(families())}) or a "
                     f"variant name (python -m jaxconv.algorithms lists them)")
  return code


def has_kernels() -> bool:
  """Whether this build has the CUDA kernels and so the predicates (a CPU-only build has the names only)."""
  return bool(_native.ext().has_kernels())


# ---------------------------------------------------------------------------------------------------------
# The device the predicates are asked about.
# ---------------------------------------------------------------------------------------------------------
DeviceInfo = Tuple[int, int, int]  # (compute capability as major * 10 + minor, multiprocessors, opt-in smem bytes)


@functools.cache
def default_device(arch: int = 90) -> DeviceInfo:
  return tuple(int(v) for v in _native.ext().default_device(int(arch)))


@functools.cache
def device() -> DeviceInfo:
  """The GPU programs are lowered for: JAX's first GPU, as the CUDA runtime describes it; a default Hopper when
  there is none."""
  import jax
  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    gpus = []
  if gpus:
    ordinal = int(getattr(gpus[0], "local_hardware_id", None) or 0)
    info = _native.ext().device_info(ordinal)
    if info is not None:
      return tuple(int(v) for v in info)
  return default_device()


# ---------------------------------------------------------------------------------------------------------
# The choice.
# ---------------------------------------------------------------------------------------------------------
def selects(request: str, name: str) -> bool:
  """Whether a request ("auto", a family or a variant name) selects the variant called `name`."""
  return request == AUTO or any(v.name == name and request in v.selectors for v in variants())


def op_request(op: str, request: str) -> str:
  """The request an op runs: a forced variant that has no kernel for this op (a forward-only variant, say, under
  differentiation) hands the op to its family."""
  for v in variants():
    if v.name == request:
      return request if op in v.ops else v.family
  return request


def _args(op, params, dtype, out_dtype, dev):
  if op not in OPS:
    raise ValueError(f"op must be one of {OPS}, got {op!r}")
  out_dtype = dtype if out_dtype is None else out_dtype
  return (op, [int(v) for v in np.asarray(params)], str(np.dtype(dtype)), str(np.dtype(out_dtype)),
          device() if dev is None else tuple(dev))


@dataclasses.dataclass(frozen=True)
class Choice:
  """What a request runs: the variant's index and name and its workspace, or why nothing does."""
  index: int
  name: str
  workspace_bytes: int
  why: str

  @property
  def ok(self) -> bool:
    return self.index >= 0


def resolve(op: str, params, dtype, out_dtype=None, dev: Optional[DeviceInfo] = None) -> Choice:
  """The variant the request in the packed params (ConvSpec.ffi_params) runs for this op on the device."""
  index, name, ws, why = _native.ext().resolve(*_args(op, params, dtype, out_dtype, dev))
  return Choice(int(index), str(name), int(ws), str(why))


def explain(op: str, params, dtype, out_dtype=None, dev: Optional[DeviceInfo] = None):
  """[(variant name, why it does not apply or '', why auto passes it over or '')], in the table's order."""
  return [(str(n), str(r), str(p)) for n, r, p in _native.ext().explain(*_args(op, params, dtype, out_dtype, dev))]


def candidates(op: str, params, dtype, out_dtype=None, request: str = AUTO,
               dev: Optional[DeviceInfo] = None) -> Tuple[str, ...]:
  """The variants the request selects that apply to the problem, in the table's order (autotune's candidates)."""
  selected = {v.name for v in variants() if request == AUTO or request in v.selectors}
  return tuple(n for n, why, _ in explain(op, params, dtype, out_dtype, dev) if not why and n in selected)
