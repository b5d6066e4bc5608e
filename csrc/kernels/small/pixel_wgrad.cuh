// The 4 -> 4 filter gradients of the few-channel family (small.pixel_wgrad on FMAs, small.pixel_wgrad_mma on tensor
// cores for 16-bit data): their arguments, block order and plan. Both write one partial filter (f32) per tile of
// their work to the workspace, which the family's reduction (reduce.h) adds in tile order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {

inline constexpr int kPxTaps = 3;  // taps along the last dim per slice of the FMA kernel
// The tensor-core kernel's blocks: 16 warps, 8 strips of 16 columns (the other factor of the warps halves the rows).
inline constexpr int kWgMmaWarps = 16;
inline constexpr int kWgMmaStrips = 8;

struct PxWgArgs {
  int64_t xN, dN, blocks, welems;
  int osp[3], in[3], taps[3], stride[3], pad[3], rdil[3];
  int xS0, xS1, dS0, dS1;  // channels-last: the pixel stride along the last dim is 4
  int planes, ctiles, per_chunk, rchunks, tgroups, nslices;  // planes = n * out0; rchunks = chunks per plane
  int mma;  // ScPixelWgradMmaKernel: nslices = taps0; chunks of source rows, per_chunk even; 128-column tiles
};

// Block b of the pixel filter gradients: slice (fastest), column tile, row chunk, plane; tile = its partial vector.
struct PxWgBlock {
  int slice, ctile, rc, plane;
  int64_t tile;
};
__device__ __forceinline__ PxWgBlock DecodeBlock(const PxWgArgs& g, int b) {
  PxWgBlock k;
  k.slice = b % g.nslices; b /= g.nslices;
  k.ctile = b % g.ctiles; b /= g.ctiles;
  k.rc = b % g.rchunks;
  k.plane = b / g.rchunks;
  k.tile = (static_cast<int64_t>(k.plane) * g.rchunks + k.rc) * g.ctiles + k.ctile;
  return k;
}

// The plan for p ("" where it applies): 4 -> 4 channels-last, no lhs dilation, float partial sums, at least 32
// output columns; g.mma: the tensor-core kernel's plan (16-bit data, at most 4 x 4 taps per window plane, unit row
// stride), else the FMA kernel's. Row chunks such that slices x column tiles x chunks is about 1 block per SM for
// 16-bit data, 2 for float32 (fastest with the reduction on msd's 512^2 layer, of 1 to 4).
inline std::string PixelWgradPlan(const ConvParams& p, DType in, PxWgArgs* out) {
  if (in == DType::kF64 || p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) {
    return "it takes 16-bit or float32 channels-last operands without groups";
  }
  if (p.c[0] != 4 || p.k[0] != 4) return "it takes 4 -> 4 channels";
  if (p.out[2] < 32) return "it takes at least 32 output columns";
  // a clamped column must exist
  if (p.in[0] < 1 || p.in[1] < 1 || p.in[2] < 1) return "it takes nonempty input extents";
  PxWgArgs g{};
  for (int d = 0; d < 3; ++d) {
    if (p.lhs_dil[d] != 1) return "it takes no lhs dilation";
    g.osp[d] = static_cast<int>(p.out[d]);
    g.in[d] = static_cast<int>(p.in[d]);
    g.taps[d] = static_cast<int>(p.win[d]);
    g.stride[d] = static_cast<int>(p.stride[d]);
    g.pad[d] = static_cast<int>(p.pad_lo[d]);
    g.rdil[d] = static_cast<int>(p.rhs_dil[d]);
  }
  const int64_t planes = p.n[0] * p.out[0];
  if (planes <= 0 || p.out[1] <= 0 || planes >= (int64_t(1) << 30)) return "it takes 1 to 2^30 output planes, rows";
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  g.xN = xs.s[0]; g.xS0 = static_cast<int>(xs.s[2]); g.xS1 = static_cast<int>(xs.s[3]);
  g.dN = ys.s[0]; g.dS0 = static_cast<int>(ys.s[2]); g.dS1 = static_cast<int>(ys.s[3]);
  g.welems = WElements(p);
  g.planes = static_cast<int>(planes);
  g.mma = (in == DType::kBF16 || in == DType::kF16) && p.win[1] <= 4 && p.win[2] <= 4 && p.stride[1] == 1;
  // 16-bit data: the tensor-core kernel, with at most one block of 16 warps per SM (a second wave of a few blocks
  // doubled its time), which also keeps the partial vectors few (the reduction's warp per element takes up to 128).
  if (g.mma) {
    g.nslices = static_cast<int>(p.win[0]);
    g.ctiles = static_cast<int>(CeilDiv(p.out[2], kWgMmaStrips * 16));
    const int64_t want = std::max<int64_t>(1, kPlanSms / (static_cast<int64_t>(g.nslices) * g.ctiles * planes));
    g.per_chunk = static_cast<int>(2 * CeilDiv(CeilDiv(p.in[1], std::min<int64_t>(want, p.in[1])), 2));
    g.rchunks = static_cast<int>(CeilDiv(p.in[1], g.per_chunk));
    const int64_t tiles = planes * g.rchunks * g.ctiles;
    g.blocks = tiles * g.nslices;
    if (tiles * g.welems * 4 > (int64_t(1) << 28)) return "its partial filters would take more than 256 MiB";
    *out = g;
    return {};
  }
  g.tgroups = static_cast<int>(CeilDiv(p.win[2], kPxTaps));
  g.nslices = static_cast<int>(p.win[0] * p.win[1]) * g.tgroups;
  g.ctiles = static_cast<int>(CeilDiv(p.out[2], kPxThreads));
  const int64_t per_sm = in == DType::kF32 ? 2 : 1;
  const int64_t want = CeilDiv(per_sm * kPlanSms, static_cast<int64_t>(g.nslices) * g.ctiles * planes);
  g.per_chunk = static_cast<int>(CeilDiv(p.out[1], std::min<int64_t>(std::max<int64_t>(want, 1), p.out[1])));
  g.rchunks = static_cast<int>(CeilDiv(p.out[1], g.per_chunk));
  const int64_t tiles = planes * g.rchunks * g.ctiles;
  g.blocks = tiles * g.nslices;
  if (tiles * g.welems * 4 > (int64_t(1) << 28)) return "its partial filters would take more than 256 MiB";
  *out = g;
  return {};
}

// Partial vectors the plan writes (its workspace holds this many times welems floats).
inline int64_t PixelWgradTiles(const PxWgArgs& g) { return static_cast<int64_t>(g.planes) * g.rchunks * g.ctiles; }

}  // namespace small_channel
}  // namespace cuda
}  // namespace jaxconv
