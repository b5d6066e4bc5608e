// The few-channel family's fixed-order sum of a filter gradient's partial filters (reduce.h).
#include "kernels/small/reduce.h"

#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

// dst[e] = sum_{c < chunks} src[c * count + e]: block = ex elements x (256 / ex) chunk lanes; each lane adds its
// chunks in batches of 8 (a fixed pairwise order), then a fixed tree over the lanes.
template <class A, class TO>
__global__ void __launch_bounds__(kThreads) ScReduceKernel(const A* __restrict__ src, int64_t chunks, int64_t count,
                                                           int ex, TO* __restrict__ dst) {
  __shared__ A sh[kThreads];
  const int tid = threadIdx.x;
  const int xq = tid % ex, y = tid / ex, lanes = kThreads / ex;
  for (int64_t blk = blockIdx.x; blk * ex < count; blk += gridDim.x) {
    const int64_t e = blk * ex + xq;
    A v = A(0);
    if (e < count) {
      // 8 chunks' loads in flight per lane: one at a time left the sum latency-bound on thousands of chunks.
      for (int64_t c0 = y; c0 < chunks; c0 += 8 * lanes) {
        A u[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) u[i] = c0 + i * lanes < chunks ? src[(c0 + i * lanes) * count + e] : A(0);
        v += ((u[0] + u[1]) + (u[2] + u[3])) + ((u[4] + u[5]) + (u[6] + u[7]));
      }
    }
    __syncthreads();
    sh[tid] = v;
    __syncthreads();
    for (int st = lanes / 2; st >= 1; st >>= 1) {
      if (y < st) sh[tid] += sh[tid + st * ex];
      __syncthreads();
    }
    if (y == 0 && e < count) dst[e] = FromAcc<TO>(sh[tid]);
  }
}

// The same sums for few chunks (<= 128): one warp per element, lane l adding chunks l, l + 32, l + 64, l + 96 (loads
// issued together), then a fixed xor butterfly; no shared memory or barriers: faster than the block tree on a few
// hundred elements of tens of chunks (msd's 4 -> 4 filter gradient).
constexpr int64_t kWarpReduceChunks = 128, kWarpReduceElems = 1024;
static_assert(kWarpReduceChunks <= 4 * 32, "four chunks per lane");
template <class A, class TO>
__global__ void __launch_bounds__(kThreads) ScReduceWarpKernel(const A* __restrict__ src, int64_t chunks,
                                                               int64_t count, TO* __restrict__ dst) {
  const int lane = threadIdx.x & 31;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (e >= count) return;  // whole warps
  A v[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) v[u] = lane + 32 * u < chunks ? src[(lane + 32 * u) * count + e] : A(0);
  const A t = WarpSum((v[0] + v[1]) + (v[2] + v[3]));
  if (lane == 0) dst[e] = FromAcc<TO>(t);
}

}  // namespace

cudaError_t ReduceChunks(DType in, DType out, const void* partials, int64_t chunks, int64_t welems, void* dw,
                         cudaStream_t s) {
  int ex = 1;
  const int64_t target = 2 * kPlanSms;
  while (ex < 32 && (CeilDiv(welems, ex) > target || chunks < kThreads / ex / 4)) ex *= 2;
  const unsigned grid = GridX(CeilDiv(welems, ex));
#define JAXCONV_BODY(T, TO)                                                                              \
  using A_ = typename AccOf<T>::type;                                                                   \
  if (chunks <= kWarpReduceChunks && welems <= kWarpReduceElems) { /* few partial sums: a warp each */  \
    ScReduceWarpKernel<A_, TO><<<GridX(CeilDiv(welems, kThreads / 32)), kThreads, 0, s>>>(               \
        static_cast<const A_*>(partials), chunks, welems, static_cast<TO*>(dw));                        \
    return cudaGetLastError();                                                                          \
  }                                                                                                     \
  ScReduceKernel<A_, TO><<<grid, kThreads, 0, s>>>(static_cast<const A_*>(partials), chunks, welems, ex, \
                                                    static_cast<TO*>(dw));                              \
  return cudaGetLastError()
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace small_channel
}  // namespace cuda
}  // namespace jaxconv
