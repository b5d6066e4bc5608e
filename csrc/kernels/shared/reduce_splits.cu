// The fixed-order sum of split-K partial sums (shared by every variant that splits a reduction): deterministic,
// no atomics. Declared in kernels/shared/kernels.h.
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// kEpi: then y[e] = act(sum + bias[e % k]) (bias may be null), the epilogue of a forward split over its reduction.
template <class TA, class TO, bool kEpi = false>
__global__ void __launch_bounds__(kThreads) ReduceSplitsKernel(const TA* __restrict__ src, int64_t splits,
                                                               int64_t count, TO* __restrict__ dst,
                                                               const TO* __restrict__ bias = nullptr, int64_t k = 1,
                                                               int act = kActNone) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += step) {
    TA v = src[e];
    int64_t s = 1;
    // 8 loads in flight, added in split order: one load at a time leaves the sum latency-bound.
    for (; s + 8 <= splits; s += 8) {
      TA t[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) t[i] = src[(s + i) * count + e];
#pragma unroll
      for (int i = 0; i < 8; ++i) v += t[i];
    }
    for (; s < splits; ++s) v += src[s * count + e];
    if constexpr (kEpi) {
      if (bias != nullptr) v += ToAcc(bias[e % k]);
      v = Activate(v, act);
    }
    dst[e] = FromAcc<TO>(v);
  }
}

}  // namespace

cudaError_t ReduceSplits(DType in, DType out, const void* scratch, int64_t splits, int64_t count, void* dst,
                         cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  const unsigned grid = GridX(CeilDiv(count, kThreads) > 65536 ? 65536 : CeilDiv(count, kThreads));
#define JAXCONV_BODY(T, TO)                                                                                 \
  ReduceSplitsKernel<typename AccOf<T>::type, TO><<<grid, kThreads, 0, s>>>(                               \
      static_cast<const typename AccOf<T>::type*>(scratch), splits, count, static_cast<TO*>(dst));         \
  return cudaGetLastError()
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

cudaError_t ReduceSplitsBiasAct(const float* scratch, int64_t splits, int64_t count, int64_t k, const float* bias,
                                int64_t act, float* dst, cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  const unsigned grid = GridX(CeilDiv(count, kThreads) > 65536 ? 65536 : CeilDiv(count, kThreads));
  ReduceSplitsKernel<float, float, true><<<grid, kThreads, 0, s>>>(scratch, splits, count, dst, bias, k,
                                                                    static_cast<int>(act));
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace jaxconv
