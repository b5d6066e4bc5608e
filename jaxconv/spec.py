"""ConvSpec: the geometry and options of one convolution, shared by the three primitives.

A ConvSpec describes the *forward* relation y = conv(x, w) in one of the two native layouts; the data
gradient and the filter gradient are the same relation read another way, so fwd, dgrad and wgrad of one
convolution carry the same spec. It holds everything except the batch and channel sizes (N, C, K), which
come from the operands and change under vmap, and the result dtype, which differs per op.

The spec is frozen and hashable (it is a primitive parameter) and packs itself into the int64 attribute
array that every native handler decodes (the field order is defined once, in csrc/conv_params.h, and read
from the extension).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np

CHANNELS_LAST = "channels_last"    # x (N, *S, C), w (*W, C/G, K), y (N/B, *O, K)
CHANNELS_FIRST = "channels_first"  # x (N, C, *S), w (K, C/G, *W), y (N/B, K, *O)
LAYOUTS = (CHANNELS_LAST, CHANNELS_FIRST)

PRECISIONS = ("default", "high", "highest")
ACTIVATIONS = (None, "relu", "gelu", "silu")

_LAYOUT_CODE = {CHANNELS_LAST: 0, CHANNELS_FIRST: 1}
_ACT_CODE = {None: 0, "relu": 1, "gelu": 2, "silu": 3}


def _dilated(size: int, dilation: int) -> int:
  return 0 if size == 0 else (size - 1) * dilation + 1


def conv_output_size(in_size, window, stride, pad, lhs_dilation, rhs_dilation) -> int:
  """Output length of one spatial dim, exactly as lax computes it."""
  span = _dilated(in_size, lhs_dilation) + pad[0] + pad[1] - _dilated(window, rhs_dilation)
  return max(0, span // stride + 1)


@dataclasses.dataclass(frozen=True)
class ConvSpec:
  """Geometry and options of one convolution (see module docstring)."""
  layout: str
  in_spatial: Tuple[int, ...]
  window: Tuple[int, ...]
  strides: Tuple[int, ...]
  padding: Tuple[Tuple[int, int], ...]
  lhs_dilation: Tuple[int, ...]
  rhs_dilation: Tuple[int, ...]
  feature_groups: int = 1
  batch_groups: int = 1
  precision: str = "default"
  activation: Optional[str] = None
  has_bias: bool = False
  algorithm: str = "auto"  # the request: "auto", a family or a variant name (jaxconv/registry.py)
  poison: bool = False

  def __post_init__(self):
    n = len(self.in_spatial)
    assert self.layout in LAYOUTS, self.layout
    assert 1 <= n <= 3, n
    for name in ("window", "strides", "padding", "lhs_dilation", "rhs_dilation"):
      assert len(getattr(self, name)) == n, (name, getattr(self, name))
    assert self.precision in PRECISIONS and self.activation in ACTIVATIONS
    assert not (self.feature_groups > 1 and self.batch_groups > 1)

  # ---- derived geometry -------------------------------------------------------------------------------
  @property
  def nspatial(self) -> int:
    return len(self.in_spatial)

  @property
  def out_spatial(self) -> Tuple[int, ...]:
    return tuple(
        conv_output_size(*a) for a in zip(self.in_spatial, self.window, self.strides, self.padding,
                                           self.lhs_dilation, self.rhs_dilation))

  @property
  def channels_last(self) -> bool:
    return self.layout == CHANNELS_LAST

  @property
  def has_epilogue(self) -> bool:
    return self.has_bias or self.activation is not None

  def replace(self, **changes) -> "ConvSpec":
    return dataclasses.replace(self, **changes)

  def linear(self) -> "ConvSpec":
    """The same convolution without bias or activation: bilinear in (x, w)."""
    return self.replace(has_bias=False, activation=None)

  # ---- axes of the native layouts ---------------------------------------------------------------------
  # Activations (x, dx, y, dy): (batch axis, feature axis). Filters (w, dw): (out-feature, in-feature).
  def act_axes(self) -> Tuple[int, int]:
    nd = self.nspatial + 2
    return (0, nd - 1) if self.channels_last else (0, 1)

  def filter_axes(self) -> Tuple[int, int]:
    nd = self.nspatial + 2
    return (nd - 1, nd - 2) if self.channels_last else (0, 1)

  def act_shape(self, batch: int, features: int, spatial) -> Tuple[int, ...]:
    spatial = tuple(spatial)
    return ((batch, *spatial, features) if self.channels_last else (batch, features, *spatial))

  def filter_shape(self, out_features: int, in_features: int) -> Tuple[int, ...]:
    return ((*self.window, in_features, out_features) if self.channels_last
            else (out_features, in_features, *self.window))

  def spatial_of_act(self, shape) -> Tuple[int, ...]:
    return tuple(shape[1:-1]) if self.channels_last else tuple(shape[2:])

  def spatial_of_filter(self, shape) -> Tuple[int, ...]:
    return tuple(shape[:-2]) if self.channels_last else tuple(shape[2:])

  # ---- native attribute block --------------------------------------------------------------------------
  def ffi_params(self, n: int, c: int, k: int, variant: int = -1) -> np.ndarray:
    """The packed int64 `params` attribute for batch n, lhs features c and output features k, with the variant the
    lowering chose for the request (-1: none, the handler chooses)."""
    from jaxconv import _native, registry  # the field order and the request codes live in the extension
    pad = 3 - self.nspatial

    def sp(values, fill):
      return [fill] * pad + [int(v) for v in values]

    values = {
        "abi_version": [_native.PARAMS_ABI_VERSION],
        "layout": [_LAYOUT_CODE[self.layout]],
        "nspatial": [self.nspatial],
        "n": [n], "c": [c], "k": [k],
        "groups": [self.feature_groups], "batch_groups": [self.batch_groups],
        "in": sp(self.in_spatial, 1), "win": sp(self.window, 1), "out": sp(self.out_spatial, 1),
        "stride": sp(self.strides, 1),
        "pad_lo": sp((p[0] for p in self.padding), 0), "pad_hi": sp((p[1] for p in self.padding), 0),
        "lhs_dil": sp(self.lhs_dilation, 1), "rhs_dil": sp(self.rhs_dilation, 1),
        "precision": [PRECISIONS.index(self.precision)],
        "activation": [_ACT_CODE[self.activation]],
        "has_bias": [int(self.has_bias)],
        "algorithm": [registry.request_code(self.algorithm)],
        "variant": [int(variant)],
        "poison": [int(self.poison)],
    }
    packed = []
    for name, count in _native.param_fields():
      vals = values.pop(name)
      assert len(vals) == count, (name, vals, count)
      packed.extend(int(v) for v in vals)
    assert not values, f"fields unknown to the native module: {sorted(values)}"
    return np.asarray(packed, dtype=np.int64)
