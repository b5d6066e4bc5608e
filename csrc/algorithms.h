// The algorithm families' predicates and the choice among them: which problems each CUDA kernel family
// supports, as plain C++ on ConvParams so that the Python layer can check a forced `algorithm=` at trace time
// (the extension's algorithm_error) with the same code the CUDA dispatch runs. Built with and without CUDA.
#pragma once

#include <cstdint>
#include <string>

#include "conv_params.h"

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

// The element types of a call, as far as the predicates care: operand and result sizes in bytes (8 = f64,
// 4 = f32, 2 = bf16/f16).
struct ElemBytes {
  int in = 4;
  int out = 4;
};

// The tensor-core kernels read 16-byte channel vectors: channel counts are multiples of this many elements.
inline int64_t ImplicitGemmAlign(int in_bytes) { return 16 / in_bytes; }
// Input channels as the kernels see them: c rounded up to the alignment (implicit_gemm.cu zero-pads x and w).
inline int64_t ImplicitGemmPaddedC(const ConvParams& p, int in_bytes) {
  const int64_t a = ImplicitGemmAlign(in_bytes);
  return (p.c[0] + a - 1) / a * a;
}

// Tensor cores (implicit GEMM, igemm.h): channels-last, groups == batch_groups == 1, no lhs dilation, padding
// >= 0, 16-bit or f32 operands with the result in the operand type, k a multiple of 8 (16-bit) or 4 (f32) so
// every output row is 16-byte aligned (c is zero-padded to that multiple), 32-bit GEMM extents. Conditions of
// single kernels (the Hopper kernels' unit-stride data gradient, say) are checked again when the op runs; what
// no tensor-core kernel takes then runs on the direct kernels.
inline bool ImplicitGemmApplies(const ConvParams& p, ElemBytes eb) {
  if (p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) return false;
  if ((eb.in != 2 && eb.in != 4) || eb.out != eb.in) return false;
  const int64_t align = ImplicitGemmAlign(eb.in);
  if (p.c[0] < 1 || p.k[0] < align || p.k[0] % align != 0) return false;
  const int64_t cp = ImplicitGemmPaddedC(p, eb.in);
  for (int d = 0; d < 3; ++d) {
    if (p.lhs_dil[d] != 1 || p.pad_lo[d] < 0 || p.pad_hi[d] < 0) return false;
    if (p.in[d] < 1 || p.win[d] < 1 || p.out[d] < 1) return false;
  }
  if (p.n[0] < 1) return false;
  const int64_t kMax = (int64_t(1) << 31) - 1;
  const int64_t m_fwd = p.n[0] * SpatialCount(p.out), m_dgrad = p.n[0] * SpatialCount(p.in);
  const int64_t k_fwd = SpatialCount(p.win) * cp, k_dgrad = SpatialCount(p.win) * p.k[0];
  return m_fwd <= kMax && m_dgrad <= kMax && k_fwd <= kMax && k_dgrad <= kMax &&
         XElements(p) / p.c[0] * cp <= kMax && YElements(p) <= kMax;
}

// The algorithm to run for p.algorithm (kAlgoAuto picks by the predicates), or -1 with *why saying which
// conditions a forced algorithm misses.
inline int64_t ResolveAlgorithm(const ConvParams& p, ElemBytes eb, std::string* why) {
  switch (p.algorithm[0]) {
    case kAlgoAuto: {
      // Long 1-D windows keep the tiled long1d kernel; small channel counts (including c == k == 1, which
      // DepthwiseApplies also accepts) take small_channel; then depthwise; else direct.
      if (Long1DApplies(p) && p.win[2] >= 64) return kAlgoLong1D;
      // Tensor cores beat the small-channel kernels once there are 32+ outputs per pixel (first layers: 3 -> 64),
      // except on tiny problems (<= 2^21 MACs: a 32x32 3 -> 64 3x3 image) whose channels the tensor-core route
      // pads (c * element size >= 16 bytes, or one tap): its launches (padding, filter, GEMM) cost more than the
      // small family's one kernel (run 71). Windows it unrolls instead run the fused forward there (runs 114-115, 32x32
      // 3 -> 64: fwd 6.0 vs 6.9 µs bf16, 5.8 vs 8.0 f32; the small family's data gradient took 325 µs against 9.3).
      // 16 -> 16 too: msd's 512^2 3x3 forward ran 200 µs on the small family against 51 on the tensor cores
      // (bf16; f32 HIGHEST 245 against 188; run 135), its data and filter gradients 1.2-4.4x slower (run 136).
      const bool unrolled = p.c[0] * eb.in < 16 && SpatialCount(p.win) >= 2;
      const bool tiny_first_layer = SmallChannelApplies(p) && ConvMacs(p) <= (int64_t(1) << 21) && !unrolled;
      const bool wide = p.k[0] >= 32 || (p.k[0] >= 16 && p.c[0] >= 16);
      if (wide && ImplicitGemmApplies(p, eb) && !tiny_first_layer) return kAlgoImplicitGemm;
      if (SmallChannelApplies(p)) return kAlgoSmallChannel;
      if (DepthwiseApplies(p)) return kAlgoDepthwise;
      if (ImplicitGemmApplies(p, eb)) return kAlgoImplicitGemm;
      return kAlgoDirect;
    }
    case kAlgoDirect: return kAlgoDirect;
    case kAlgoDepthwise:
      if (DepthwiseApplies(p)) return kAlgoDepthwise;
      *why = "algorithm=depthwise requires groups == c == k and batch_groups == 1";
      return -1;
    case kAlgoLong1D:
      if (Long1DApplies(p)) return kAlgoLong1D;
      *why = "algorithm=long1d requires one spatial dim, stride, lhs and rhs dilation 1, groups == "
             "batch_groups == 1 and 1 <= c, k <= 8";
      return -1;
    case kAlgoSmallChannel:
      if (SmallChannelApplies(p)) return kAlgoSmallChannel;
      *why = "algorithm=small requires channels-last layout, groups == batch_groups == 1, 1 <= c <= 16, "
             "1 <= k <= 64 and window taps * c * k <= 12288";
      return -1;
    case kAlgoImplicitGemm:
    case kAlgoImplicitGemmSm80:
      if (ImplicitGemmApplies(p, eb)) return p.algorithm[0];
      *why = std::string("algorithm=") + (p.algorithm[0] == kAlgoImplicitGemm ? "implicit_gemm" : "implicit_gemm_sm80") +
             " requires channels-last layout, groups == batch_groups == 1, no lhs "
             "dilation, padding >= 0, bfloat16/float16/float32 operands with the result in that dtype, and k a "
             "multiple of 8 (16-bit) or 4 (float32)";
      return -1;
    default:
      *why = "unknown algorithm " + std::to_string(p.algorithm[0]);
      return -1;
  }
}

}  // namespace jaxconv
