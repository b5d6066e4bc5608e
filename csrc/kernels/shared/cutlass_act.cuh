// Pieces of the CUTLASS 3 epilogues of the Hopper kernels (igemm_sm90.cu, gemm1x1_sm90.cu). Include after the
// CUTLASS headers.
//
// The run-time activation of the fused epilogues (LinCombPerColBiasEltAct<RuntimeAct, ...>): an EVT compute node
// whose functor has `Arguments` receives them at run time, so one kernel serves every activation. The formulas
// are common.cuh's Activate (relu propagates NaN), as in every other kernel family.
#pragma once

#include <type_traits>

#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {

// The TMA epilogues' store tile: the whole N width of the CTA tile, 64 rows (one ping-pong warpgroup's) or 128 (a
// cooperative tile's half). CUTLASS's automatic choice stores 32 columns at a time, which slows the 1x1 forwards,
// whose cost is mostly the output store.
template <class EpiSchedule, int TN>
using FullWidthEpiTile = cute::Shape<
    cute::Int<std::is_same_v<EpiSchedule, cutlass::epilogue::TmaWarpSpecializedCooperative> ? 128 : 64>,
    cute::Int<TN>>;

struct ActArgs {
  int act = kActNone;
};

template <class T>
struct RuntimeAct;

template <>
struct RuntimeAct<float> {
  using Arguments = ActArgs;
  CUTLASS_DEVICE float operator()(float v, Arguments const& a) const { return Activate(v, a.act); }
};

template <int N>
struct RuntimeAct<cutlass::Array<float, N>> {
  using Arguments = ActArgs;
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v, Arguments const& a) const {
    if (a.act == kActNone) return v;  // uniform branch: no per-element switch in the common case
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = Activate(v[i], a.act);
    return r;
  }
};

}  // namespace cuda
}  // namespace jaxconv
