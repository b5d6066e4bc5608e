// depthwise.gather: the depthwise forward and data gradient for any layout, stride, dilation and padding (stencil.cuh's
// view): one thread per destination element gathers its window from global memory. The family's floor for the
// problems the staged kernels (vec.cu, tiled.cu) do not take: lhs dilation in the forward, strides in the data
// gradient, or source tiles past 48 KiB of shared memory.
#include <cstdint>
#include <string>

#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/depthwise/stencil.cuh"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ---- generic gather kernel: one thread per destination element ----
template <class T, class TO>
__global__ void __launch_bounds__(kThreads) DwGenericKernel(const DwArgs g, const T* __restrict__ src,
                                                            const T* __restrict__ w, const TO* __restrict__ bias,
                                                            TO* __restrict__ dst) {
  using Acc = typename AccOf<T>::type;
  const int64_t total = g.n * g.c * g.tsp[0] * g.tsp[1] * g.tsp[2];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    int64_t rem = e, c, t[3], n;
    if (g.cl) {
      { const int64_t q_ = DivNN(rem, g.c); c = rem - q_ * (g.c); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.tsp[2]); t[2] = rem - q_ * (g.tsp[2]); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.tsp[1]); t[1] = rem - q_ * (g.tsp[1]); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.tsp[0]); t[0] = rem - q_ * (g.tsp[0]); rem = q_; }
      n = rem;
    } else {
      { const int64_t q_ = DivNN(rem, g.tsp[2]); t[2] = rem - q_ * (g.tsp[2]); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.tsp[1]); t[1] = rem - q_ * (g.tsp[1]); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.tsp[0]); t[0] = rem - q_ * (g.tsp[0]); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.c); c = rem - q_ * (g.c); rem = q_; }
      n = rem;
    }
    Acc acc = Acc(0);
    const int64_t sbase = n * g.sN + c * g.sC;
    for (int64_t f0 = 0; f0 < g.taps[0]; ++f0) {
      int64_t q0 = t[0] * g.alpha[0] + g.beta[0] + f0 * g.gamma[0];
      if (q0 < 0) continue;
      { const int64_t d_ = DivNN(q0, g.delta[0]); if (d_ * g.delta[0] != q0) continue; q0 = d_; }
      if (q0 >= g.lim[0]) continue;
      for (int64_t f1 = 0; f1 < g.taps[1]; ++f1) {
        int64_t q1 = t[1] * g.alpha[1] + g.beta[1] + f1 * g.gamma[1];
        if (q1 < 0) continue;
        { const int64_t d_ = DivNN(q1, g.delta[1]); if (d_ * g.delta[1] != q1) continue; q1 = d_; }
        if (q1 >= g.lim[1]) continue;
        for (int64_t f2 = 0; f2 < g.taps[2]; ++f2) {
          int64_t q2 = t[2] * g.alpha[2] + g.beta[2] + f2 * g.gamma[2];
          if (q2 < 0) continue;
          { const int64_t d_ = DivNN(q2, g.delta[2]); if (d_ * g.delta[2] != q2) continue; q2 = d_; }
          if (q2 >= g.lim[2]) continue;
          acc = fma(ToAcc(src[sbase + q0 * g.sS[0] + q1 * g.sS[1] + q2 * g.sS[2]]),
                    ToAcc(w[c * g.wC + f0 * g.wF[0] + f1 * g.wF[1] + f2 * g.wF[2]]), acc);
        }
      }
    }
    if (g.has_bias) acc += ToAcc(bias[c]);
    acc = Activate(acc, g.act);
    dst[n * g.dN + c * g.dC + t[0] * g.dS[0] + t[1] * g.dS[1] + t[2] * g.dS[2]] = FromAcc<TO>(acc);
  }
}

cudaError_t RunGather(const DwArgs& g, DType in, DType out, const void* src, const void* w, const void* bias,
                      void* dst, cudaStream_t s) {
  const int64_t total = DwDstElements(g);
  if (total <= 0) return cudaSuccess;
#define JAXCONV_BODY(T, TO)                                                                                      \
  DwGenericKernel<T, TO><<<GridX(CeilDiv(total, kThreads)), kThreads, 0, s>>>(                                  \
      g, static_cast<const T*>(src), static_cast<const T*>(w), static_cast<const TO*>(bias), static_cast<TO*>(dst)); \
  return cudaGetLastError()
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace
}  // namespace cuda

namespace variants::depthwise_gather {

std::string Applies(const Problem& pr) {
  if (!DepthwiseApplies(pr.p)) return "it takes depthwise convolutions (groups == c == k, batch_groups == 1)";
  if (pr.op == Op::kWgrad) return "it has no wgrad kernel";
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const cuda::DwArgs g = cuda::MakeDwArgs(pr.p, pr.op);
  return cuda::RunGather(g, pr.in, pr.out, b.a, b.b, pr.op == Op::kFwd ? b.bias : nullptr, b.out, s);
}

}  // namespace variants::depthwise_gather
}  // namespace jaxconv
