// The few-channel family (small.*): what its techniques share. The family's kernels are written for channels-last
// problems with groups == batch_groups == 1, 1 <= c <= 16, 1 <= k <= 64, taps * c * k <= 12288 and 32-bit
// per-image coordinates (SmallChannelApplies, dispatch/rules.h): few channels and large spatial extents, where the
// direct kernel's 64-wide channel tiles leave almost every thread idle.
//
// fwd and dgrad are one gather, "dst[n, t, co] = sum_{f, ci} src[n, q(t, f), ci] * wt[f, ci, co]" with
// q = t*alpha + beta + f*gamma per dim, valid iff q >= 0, q % delta == 0, q / delta < lim (ScArgs):
//   fwd:   t = o, src = x (ci < c), dst = y (co < k), alpha = stride, beta = -pad_lo, gamma = rhs_dil,
//          delta = lhs_dil, lim = in, wt[f, ci, co] = w[f, ci, co]
//   dgrad: t = i, src = dy (ci < k), dst = dx (co < c), alpha = lhs_dil, beta = pad_lo, gamma = -rhs_dil,
//          delta = stride, lim = out, wt[f, kk, c] = w[f, c, kk]
// The filter gradients write one partial filter per chunk of their work to the workspace; the family's fixed-order
// reduction (reduce.h) adds them (bitwise deterministic, no atomics).
#pragma once

#include <cstdint>
#include <string>

#include "core/types.h"
#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {

inline constexpr int kThreads = 256;
// The pixel kernels' blocks (pixel, pixel_mma, pixel_wgrad): 8 warps, one destination row each.
inline constexpr int kPxThreads = 256;
inline constexpr int kPxRows = kPxThreads / 32;

struct ScArgs {
  int64_t n, sN, dN;  // batch; batch strides of source and destination
  int64_t gw, total;  // pixel groups along the last dim; n * tsp0 * tsp1 * gw
  // Per-image coordinates and offsets are 32-bit (SmallChannelApplies bounds them).
  int tsp[3], taps[3];
  int alpha[3], beta[3], gamma[3], delta[3], lim[3];
  int sS[3], dS[3];    // source / destination spatial strides (channel stride 1)
  int wF, wCi, wCo;    // w element offset of (f, ci, co)
  int cin, cout, ntaps, unit, act, has_bias;
};

// The gather of the forward (t = o) or the data gradient (t = i) of pr, as above.
inline ScArgs MakeScArgs(const Problem& pr) {
  const ConvParams& p = pr.p;
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  ScArgs g{};
  g.n = p.n[0];
  g.ntaps = static_cast<int>(SpatialCount(p.win));
  g.wF = static_cast<int>(p.c[0] * p.k[0]);
  if (pr.op == Op::kFwd) {
    for (int d = 0; d < 3; ++d) {
      g.tsp[d] = static_cast<int>(p.out[d]);
      g.taps[d] = static_cast<int>(p.win[d]);
      g.alpha[d] = static_cast<int>(p.stride[d]);
      g.beta[d] = static_cast<int>(-p.pad_lo[d]);
      g.gamma[d] = static_cast<int>(p.rhs_dil[d]);
      g.delta[d] = static_cast<int>(p.lhs_dil[d]);
      g.lim[d] = static_cast<int>(p.in[d]);
      g.sS[d] = static_cast<int>(xs.s[2 + d]);
      g.dS[d] = static_cast<int>(ys.s[2 + d]);
    }
    g.unit = p.lhs_dil[2] == 1;
    g.sN = xs.s[0];
    g.dN = ys.s[0];
    g.cin = static_cast<int>(p.c[0]);
    g.cout = static_cast<int>(p.k[0]);
    g.wCi = static_cast<int>(p.k[0]);
    g.wCo = 1;
    g.act = static_cast<int>(p.activation[0]);
    g.has_bias = static_cast<int>(p.has_bias[0]);
  } else {
    for (int d = 0; d < 3; ++d) {
      g.tsp[d] = static_cast<int>(p.in[d]);
      g.taps[d] = static_cast<int>(p.win[d]);
      g.alpha[d] = static_cast<int>(p.lhs_dil[d]);
      g.beta[d] = static_cast<int>(p.pad_lo[d]);
      g.gamma[d] = static_cast<int>(-p.rhs_dil[d]);
      g.delta[d] = static_cast<int>(p.stride[d]);
      g.lim[d] = static_cast<int>(p.out[d]);
      g.sS[d] = static_cast<int>(ys.s[2 + d]);
      g.dS[d] = static_cast<int>(xs.s[2 + d]);
    }
    g.unit = p.stride[2] == 1;
    g.sN = ys.s[0];
    g.dN = xs.s[0];
    g.cin = static_cast<int>(p.k[0]);
    g.cout = static_cast<int>(p.c[0]);
    g.wCi = 1;                          // source channel kk
    g.wCo = static_cast<int>(p.k[0]);   // destination channel c
    g.act = kActNone;
    g.has_bias = 0;
  }
  return g;
}

// The family gate: "" where the family's kernels are written for the problem.
inline std::string FamilyError(const Problem& pr) {
  return SmallChannelApplies(pr.p) ? std::string()
                                   : "it takes channels-last, no groups, c <= 16, k <= 64, taps * c * k <= 12288 "
                                     "and 32-bit per-image coordinates";
}

// The operand of the gather (fwd: x, dgrad: dy), its bias (fwd only) and its destination.
struct GatherBuffers {
  const void* src;
  const void* w;
  const void* bias;
  void* dst;
};
inline GatherBuffers GatherBuffersOf(const Problem& pr, const Buffers& b) {
  return {b.a, b.b, pr.op == Op::kFwd ? b.bias : nullptr, b.out};
}

// Bytes of `chunks` partial filters of the problem's accumulator type: a filter gradient's workspace.
inline size_t PartialBytes(const Problem& pr, int64_t chunks) {
  return static_cast<size_t>(chunks) * static_cast<size_t>(WElements(pr.p)) * AccBytes(pr.in);
}

// Non-negative q: q / d when q % d == 0 and the quotient is < lim, else -1.
__device__ __forceinline__ int TapIndex(int q, int d, int lim) {
  if (q < 0) return -1;
  if (d != 1) {
    const int t = static_cast<int>(static_cast<unsigned>(q) / static_cast<unsigned>(d));
    if (t * d != q) return -1;
    q = t;
  }
  return q < lim ? q : -1;
}

// N consecutive values from 16-byte aligned shared memory (16-byte vectors when N allows).
template <int N> __device__ __forceinline__ void LdN(const float* p, float* o) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      o[4 * i] = v.x; o[4 * i + 1] = v.y; o[4 * i + 2] = v.z; o[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = p[i];
  }
}
template <int N> __device__ __forceinline__ void LdN(const double* p, double* o) {
  if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const double2 v = reinterpret_cast<const double2*>(p)[i];
      o[2 * i] = v.x; o[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = p[i];
  }
}

// f(IntC<th>) for the register stencils' destination rows per warp (plane_stencil, reduce_stencil): 2 or 4.
template <class F>
cudaError_t WithRows(int th, F&& f) {
  return th == 2 ? f(IntC<2>{}) : f(IntC<4>{});
}

}  // namespace small_channel
}  // namespace cuda
}  // namespace jaxconv
