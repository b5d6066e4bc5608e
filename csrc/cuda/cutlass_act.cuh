// The run-time activation of the CUTLASS 3 fused epilogues (LinCombPerColBiasEltAct<RuntimeAct, ...>) of the Hopper
// kernels (igemm_sm90.cu, gemm1x1_sm90.cu): an EVT compute node whose functor has `Arguments` receives them at run
// time, so one kernel serves every activation. The formulas are common.cuh's Activate (relu propagates NaN), as in
// every other kernel family. Include after the CUTLASS headers.
#pragma once

#include "cuda/common.cuh"

namespace jaxconv {
namespace cuda {

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
