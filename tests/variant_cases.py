"""Problems each kernel variant of the registry runs: the catalogue the variant tests force every variant on.

Every variant has at least one case here (a test checks it). A case is a conv1d/2d/3d call in channels-last layout,
its dtype and precision, and the ops the variant is forced on: on the host (CUDA builds) the tests check that the
variant's predicate accepts each op of each case on the default Hopper; on a GPU they force it, check that the
compiled program runs that variant, and compare the result with a float64 reference.

The shapes are odd and prime where the variant allows, small enough for a fast test, and large enough to reach
the variant's interesting paths (several tiles, split reductions, tails).
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

FWD, DGRAD, WGRAD = "fwd", "dgrad", "wgrad"
ALL = (FWD, DGRAD, WGRAD)


@dataclasses.dataclass(frozen=True)
class Case:
  x: Tuple[int, ...]             # (N, *spatial, C)
  w: Tuple[int, ...]             # (*window, C // groups, K)
  dtype: str = "float32"
  ops: Tuple[str, ...] = ALL
  stride: int = 1
  padding: object = "SAME"
  dilation: object = 1
  groups: int = 1
  precision: str = "highest"     # float32 HIGHEST: true FP32 (3xTF32 on the tensor-core variants)

  @property
  def nspatial(self) -> int:
    return len(self.x) - 2

  def conv_kwargs(self) -> dict:
    """Keyword arguments of jaxconv.conv{1,2,3}d."""
    return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                precision=self.precision)

  def label(self) -> str:
    return f"{self.dtype} x{self.x} w{self.w} s{self.stride} d{self.dilation} g{self.groups} {'/'.join(self.ops)}"


CATALOGUE = {
    "long1d.tiled": [
        Case((2, 3001, 1), (257, 1, 1)),
        Case((1, 2053, 2), (131, 2, 3), dtype="bfloat16", padding=((70, 3),)),
    ],
    # ---- tensor cores ----
    "implicit_gemm.im2col_frag": [
        Case((1, 17, 19, 3), (3, 3, 3, 16), ops=(FWD,)),
        Case((1, 15, 13, 3), (3, 3, 3, 32), dtype="bfloat16", ops=(FWD,)),
    ],
    "implicit_gemm.im2col_fused_fwd": [Case((2, 37, 41, 3), (7, 7, 3, 64), dtype="bfloat16", ops=(FWD,), stride=2)],
    "implicit_gemm.im2col_fused_wgrad": [
        Case((2, 37, 41, 3), (7, 7, 3, 64), dtype="bfloat16", ops=(WGRAD,), stride=2)],
    "implicit_gemm.im2col_chunked": [Case((2, 23, 29, 3), (5, 5, 3, 16), dtype="bfloat16")],
    "implicit_gemm.gemm1x1_sm90": [
        Case((2, 14, 13, 64), (1, 1, 64, 128), dtype="bfloat16", padding="VALID"),
        Case((2, 14, 13, 64), (1, 1, 64, 96), ops=(FWD,), padding="VALID", precision="default"),
    ],
    "implicit_gemm.flipped_dgrad_sm90": [
        Case((2, 14, 15, 64), (3, 3, 64, 64), ops=(DGRAD,), precision="default"),
        Case((2, 5, 7, 11, 64), (3, 3, 3, 64, 72), ops=(DGRAD,), precision="default", padding=((1, 2), (0, 1), (2, 1))),
    ],
    "implicit_gemm.phased_dgrad_sm90": [
        Case((2, 15, 17, 64), (3, 3, 64, 64), dtype="bfloat16", ops=(DGRAD,), stride=2),
        Case((2, 9, 11, 13, 64), (3, 3, 3, 64, 40), dtype="bfloat16", ops=(DGRAD,), stride=2),
        Case((1, 7, 9, 10, 64), (3, 2, 3, 64, 32), ops=(DGRAD,), stride=2, padding="VALID", precision="default"),
    ],
    "implicit_gemm.swapped_wgrad_sm90": [Case((4, 14, 15, 32), (3, 3, 32, 64), ops=(WGRAD,), precision="default")],
    "implicit_gemm.sm90": [
        Case((2, 14, 15, 64), (3, 3, 64, 64), dtype="bfloat16"),
        Case((2, 6, 7, 9, 32), (3, 3, 3, 32, 64), dtype="bfloat16", ops=(FWD,)),
    ],
    "implicit_gemm.sm80": [
        Case((2, 13, 11, 24), (3, 3, 24, 32)),
        Case((2, 13, 11, 16), (3, 3, 16, 32), dtype="bfloat16", stride=2),
    ],
    # k off the alignment (bf16: a multiple of 8; float32: of 4), zero-padded: on the Hopper kernels the bf16 ops
    # (the data gradient at unit stride) and the TF32 forward; on the mma.sync kernels the strided bf16 data gradient
    # and 3xTF32.
    "implicit_gemm.padded_k_sm90": [
        Case((2, 14, 15, 64), (3, 3, 64, 131), dtype="bfloat16"),
        Case((2, 13, 11, 24), (5, 3, 24, 45), ops=(FWD,), stride=2, precision="default"),
        Case((2, 5, 6, 7, 16), (3, 3, 3, 16, 21), dtype="bfloat16", ops=(FWD, WGRAD)),
    ],
    "implicit_gemm.padded_k_sm80": [
        Case((2, 15, 13, 40), (3, 3, 40, 3), dtype="bfloat16", stride=2),
        Case((2, 13, 11, 24), (3, 3, 24, 45)),
    ],
    # ---- few channels ----
    "small.plane_stencil": [
        Case((1, 67, 64, 1), (3, 3, 1, 1)),
        Case((2, 31, 48, 1), (3, 3, 1, 1), dtype="bfloat16", dilation=2),
    ],
    "small.reduce_stencil": [
        Case((1, 33, 40, 16), (3, 3, 16, 1), dtype="bfloat16", ops=(FWD,)),
        Case((2, 19, 23, 32), (3, 3, 32, 1), ops=(FWD,), dilation=2),
    ],
    "small.rowseg": [
        Case((2, 21, 26, 3), (3, 3, 3, 8), ops=(FWD,)),
        Case((1, 37, 45, 2), (7, 7, 2, 16), dtype="bfloat16", ops=(FWD,), stride=2),
    ],
    "small.pixel_mma": [Case((1, 29, 37, 4), (3, 3, 4, 4), dtype="bfloat16", ops=(FWD, DGRAD))],
    "small.pixel": [Case((1, 29, 37, 4), (3, 3, 4, 4), ops=(FWD, DGRAD))],
    "small.stencil": [Case((1, 24, 29, 8), (3, 3, 8, 1), ops=(FWD, DGRAD))],
    "small.gather": [
        Case((2, 13, 11, 5), (3, 3, 5, 7), ops=(FWD, DGRAD), stride=2),
        Case((2, 13, 11, 5), (3, 3, 5, 7), dtype="float64", ops=(FWD, DGRAD)),
    ],
    "small.pixel_wgrad_mma": [Case((1, 23, 41, 4), (3, 3, 4, 4), dtype="bfloat16", ops=(WGRAD,))],
    "small.pixel_wgrad": [Case((1, 23, 41, 4), (3, 3, 4, 4), ops=(WGRAD,))],
    "small.tiled_wgrad": [Case((2, 19, 21, 4), (3, 3, 4, 8), ops=(WGRAD,))],
    "small.chunked_wgrad": [
        Case((2, 13, 11, 5), (3, 3, 5, 7), ops=(WGRAD,), stride=2),
        Case((2, 13, 11, 5), (3, 3, 5, 7), dtype="float64", ops=(WGRAD,)),
    ],
    # ---- depthwise ----
    "depthwise.tma_sm90": [
        Case((2, 21, 29, 32), (3, 3, 1, 32), dtype="bfloat16", ops=(FWD, DGRAD), groups=32),
        Case((3, 20, 27, 48), (3, 3, 1, 48), ops=(FWD,), stride=2, groups=48),
    ],
    "depthwise.mma": [Case((2, 19, 37, 24), (7, 7, 1, 24), dtype="bfloat16", groups=24)],
    "depthwise.reg": [
        Case((2, 15, 13, 12), (5, 5, 1, 12), stride=2, groups=12),
        Case((2, 45, 12), (3, 1, 12), dtype="float16", groups=12),
    ],
    "depthwise.vec": [Case((2, 11, 9, 8), (3, 3, 1, 8), dilation=(2, 1), groups=8)],
    "depthwise.tiled": [Case((2, 9, 9, 6), (3, 3, 1, 6), dtype="float64", groups=6)],
    "depthwise.gather": [Case((2, 9, 10, 3), (3, 3, 1, 3), ops=(FWD, DGRAD), stride=2, groups=3)],
    # ---- integer and bool operands (forward only: lax has no integer gradients) ----
    "integer.mma_s8": [Case((2, 9, 11, 16), (3, 3, 16, 32), dtype="int8", ops=(FWD,))],
    "integer.direct": [
        Case((2, 9, 10, 5), (3, 3, 5, 7), dtype="int32", ops=(FWD,), stride=2),
        Case((1, 7, 6, 5, 3), (2, 3, 2, 3, 4), dtype="bool", ops=(FWD,)),
    ],
    # ---- XLA's own convolution and the CUDA-core floor ----
    "xla.conv": [
        Case((2, 9, 9, 8), (3, 3, 4, 6), groups=2),
        Case((2, 11, 7, 5, 3), (3, 2, 3, 3, 7), dtype="bfloat16", stride=2, precision="default"),
    ],
    "direct.cone_wgrad": [Case((2, 17, 19, 12), (3, 3, 12, 1), dtype="bfloat16", ops=(WGRAD,))],
    "direct.gemm": [
        Case((2, 9, 9, 8), (3, 3, 4, 6), groups=2, stride=2, padding=((2, -1), (0, 1))),
        Case((1, 7, 6, 5, 3), (2, 3, 2, 3, 5), dtype="float64", dilation=(1, 2, 1)),
        Case((3, 37, 3), (5, 3, 4), dtype="bfloat16", stride=3, dilation=2),
    ],
}
