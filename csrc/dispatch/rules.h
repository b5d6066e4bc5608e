// Conditions shared by several variants of a family: the problems a family's kernels are written for. Plain C++ on
// ConvParams: the registry, the variants' predicates and the Python layer (through the extension) all read these,
// with and without CUDA. Which applicable variant auto prefers is cost_rules.h's.
#pragma once

#include <cstdint>
#include <string>

#include "core/conv_params.h"
#include "core/types.h"

namespace jaxconv {

// groups == c == k, batch_groups == 1 (depthwise multiplier 1).
inline bool DepthwiseApplies(const ConvParams& p) {
  return p.groups[0] == p.c[0] && p.k[0] == p.c[0] && p.batch_groups[0] == 1 && p.c[0] >= 1;
}

// One spatial dim, stride, lhs and rhs dilation 1, groups == batch_groups == 1, 1 <= c, k <= 8.
inline bool Long1DApplies(const ConvParams& p) {
  if (p.groups[0] != 1 || p.batch_groups[0] != 1) return false;
  if (p.c[0] < 1 || p.c[0] > 8 || p.k[0] < 1 || p.k[0] > 8) return false;
  for (int d = 0; d < 3; ++d) {
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1 || p.rhs_dil[d] != 1) return false;
  }
  for (int d = 0; d < 2; ++d) {
    if (p.in[d] != 1 || p.win[d] != 1 || p.out[d] != 1) return false;
  }
  return true;
}

// Channels-last, groups == batch_groups == 1, 1 <= c <= 16, 1 <= k <= 64, taps * c * k <= 12288, and 32-bit
// per-image coordinates.
inline bool SmallChannelApplies(const ConvParams& p) {
  if (p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) return false;
  if (p.c[0] < 1 || p.c[0] > 16 || p.k[0] < 1 || p.k[0] > 64) return false;
  const int64_t ntaps = SpatialCount(p.win);
  if (ntaps < 1 || ntaps * p.c[0] * p.k[0] > 12288) return false;
  // The kernels do per-image coordinate and offset arithmetic in 32 bits: bound every coordinate they form
  // (fwd q = o*stride - pad_lo + f*rhs_dil, dgrad q = i*lhs_dil + pad_lo - f*rhs_dil, plus a few strides of
  // look-ahead) and the per-image element counts of x and y.
  const int64_t kLim = int64_t(1) << 30;
  for (int d = 0; d < 3; ++d) {
    const int64_t plo = p.pad_lo[d] < 0 ? -p.pad_lo[d] : p.pad_lo[d];
    const int64_t phi = p.pad_hi[d] < 0 ? -p.pad_hi[d] : p.pad_hi[d];
    if (p.in[d] >= kLim || p.out[d] >= kLim || p.win[d] >= kLim || p.stride[d] >= kLim || p.lhs_dil[d] >= kLim ||
        p.rhs_dil[d] >= kLim || plo >= kLim || phi >= kLim) {
      return false;
    }
    const int64_t a = p.in[d] * p.lhs_dil[d] + plo + phi + p.win[d] * p.rhs_dil[d] + p.out[d] * p.stride[d] +
                      8 * (p.stride[d] + p.lhs_dil[d]);  // all terms < 2^60: no overflow
    if (a >= kLim) return false;
  }
  return SpatialCount(p.in) * p.c[0] < kLim && SpatialCount(p.out) * p.k[0] < kLim;
}

// Multiply-adds of the forward: output elements x window taps x input channels per group.
inline int64_t ConvMacs(const ConvParams& p) {
  return YElements(p) * SpatialCount(p.win) * (p.c[0] / p.groups[0]);
}

// The tensor-core kernels read 16-byte channel vectors: channel counts are multiples of this many elements.
inline int64_t ImplicitGemmAlign(DType in) { return 16 / DTypeBytes(in); }
// Input channels as the kernels see them: c rounded up to the alignment (the staging zero-pads x and w).
inline int64_t ImplicitGemmPaddedC(const ConvParams& p, DType in) {
  const int64_t a = ImplicitGemmAlign(in);
  return (p.c[0] + a - 1) / a * a;
}

// Output channels as the padded-k variants' kernels see them: k rounded up to the alignment (their staging zero-pads
// the filter and dy, and crops y). Equal to k wherever the family's gate below holds.
inline int64_t ImplicitGemmPaddedK(const ConvParams& p, DType in) {
  const int64_t a = ImplicitGemmAlign(in);
  return (p.k[0] + a - 1) / a * a;
}

// Tensor cores (implicit GEMM): channels-last, groups == batch_groups == 1, no lhs dilation, padding >= 0, 16-bit or
// f32 operands with the result in the operand type, k a multiple of 8 (16-bit) or 4 (f32) so every output row is
// 16-byte aligned (c is zero-padded to that multiple), 32-bit GEMM extents.
inline std::string ImplicitGemmError(const ConvParams& p, DType in, DType out) {
  if (p.layout[0] != kChannelsLast) return "the tensor-core kernels take channels-last layouts";
  if (p.groups[0] != 1 || p.batch_groups[0] != 1) return "the tensor-core kernels take no feature or batch groups";
  if (in == DType::kF64 || out != in) {
    return "the tensor-core kernels take bfloat16, float16 or float32 operands with the result in that dtype";
  }
  const int64_t align = ImplicitGemmAlign(in);
  if (p.c[0] < 1 || p.k[0] < align || p.k[0] % align != 0) {
    return "the tensor-core kernels need k a multiple of " + std::to_string(align) + " for this dtype";
  }
  const int64_t cp = ImplicitGemmPaddedC(p, in);
  for (int d = 0; d < 3; ++d) {
    if (p.lhs_dil[d] != 1) return "the tensor-core kernels take no lhs dilation";
    if (p.pad_lo[d] < 0 || p.pad_hi[d] < 0) return "the tensor-core kernels take no negative padding";
    if (p.in[d] < 1 || p.win[d] < 1 || p.out[d] < 1) return "empty spatial extent";
  }
  if (p.n[0] < 1) return "empty batch";
  const int64_t kMax = (int64_t(1) << 31) - 1;
  const int64_t m_fwd = p.n[0] * SpatialCount(p.out), m_dgrad = p.n[0] * SpatialCount(p.in);
  const int64_t k_fwd = SpatialCount(p.win) * cp, k_dgrad = SpatialCount(p.win) * p.k[0];
  if (m_fwd > kMax || m_dgrad > kMax || k_fwd > kMax || k_dgrad > kMax || XElements(p) / p.c[0] * cp > kMax ||
      YElements(p) > kMax) {
    return "GEMM extents past 32 bits";
  }
  return {};
}
inline bool ImplicitGemmApplies(const ConvParams& p, DType in, DType out) { return ImplicitGemmError(p, in, out).empty(); }

}  // namespace jaxconv
