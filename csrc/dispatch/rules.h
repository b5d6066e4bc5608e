// Conditions shared by several variants of a family (the problems a family's kernels are written for) and auto's
// cost rules (which applicable variant auto prefers). Plain C++ on ConvParams: the registry, the variants' predicates
// and the Python layer (through the extension) all read these, with and without CUDA.
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

// ---- auto's cost rules: why auto passes over a variant that applies ("" to take it) ----

// Long 1-D windows keep the tiled long1d kernel; shorter ones go to the families after it.
inline std::string PreferLongWindow(const Problem& pr) {
  return pr.p.win[2] >= 64 ? std::string() : "auto takes long1d for windows of 64 taps or more";
}

// Tensor cores beat the few-channel kernels once there are 32+ outputs per pixel (or 16 -> 16 and wider), except on
// tiny first layers (<= 2^21 multiply-adds) whose channels the tensor-core route pads: its staging launches cost more
// than the few-channel family's one kernel. Where neither the few-channel nor the depthwise family is written for the
// problem, the tensor cores are preferred at any width.
inline std::string PreferTensorCores(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (!SmallChannelApplies(p) && !DepthwiseApplies(p)) return {};
  const bool unrolled = p.c[0] * DTypeBytes(pr.in) < 16 && SpatialCount(p.win) >= 2;
  const bool tiny_first_layer = SmallChannelApplies(p) && ConvMacs(p) <= (int64_t(1) << 21) && !unrolled;
  const bool wide = p.k[0] >= 32 || (p.k[0] >= 16 && p.c[0] >= 16);
  if (!wide) return "auto takes the few-channel or depthwise kernels below 32 output channels";
  if (tiny_first_layer) return "auto takes the few-channel kernels for tiny first layers";
  return {};
}

// The padded-k Hopper kernels against XLA's convolution, where k is off the alignment: measured on random problems,
// they win on windows over 32+ input channels up to 2^31 multiply-adds (the staging's pad and crop are small beside
// the GEMM there) and on 16-bit filter gradients of dilated filters, where XLA's convolution is slow at any size.
// On 1x1 windows, fewer input channels and larger problems XLA matches or beats them, and under 8 output channels
// (none measured) most of each padded tile would be empty.
inline std::string PreferPaddedK(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (p.k[0] < 8) return "auto leaves fewer than 8 output channels to XLA";
  const bool dilated = p.rhs_dil[0] > 1 || p.rhs_dil[1] > 1 || p.rhs_dil[2] > 1;
  if (pr.op == Op::kWgrad && DTypeBytes(pr.in) == 2 && dilated) return {};
  if (p.c[0] >= 32 && SpatialCount(p.win) > 1 && ConvMacs(p) <= (int64_t(1) << 31)) return {};
  return "auto leaves odd k to XLA on 1x1 windows, under 32 input channels and past 2^31 multiply-adds";
}

}  // namespace jaxconv
