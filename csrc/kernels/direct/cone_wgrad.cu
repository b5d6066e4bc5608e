// direct.cone_wgrad: the c -> 1 filter gradient (k == 1, channels-last 2-D, c % 4 == 0, 3x3, any stride, dilation
// and padding):
//   dw[r, s, ch] = sum_{n,y,x} x[n, y sh - ph + r dh, x sw - pw + s dw, ch] * dy[n, y, x]
// The GEMM-shaped direct filter gradient gives K = 1 a 16-row tile (15 rows idle) and gathers x element by element,
// an order of magnitude off the bandwidth floor. Here a thread owns 4 channels and a slot; a block's slots sweep the
// columns of each destination row of its split together (consecutive pixels: contiguous channel vectors), load dy
// once per pixel (one address per slot) and the pixel's 9 source vectors, and keep all 9 x 4 sums in registers; then
// a fixed-order sum over the slots, and ReduceSplits over the splits. Taps outside the image are skipped, never
// multiplied (an inf in x reaches only the taps that see it).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "dispatch/variant.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kCoThreads = 256, kCoVc = 4, kCoK = 3;

struct COneWgArgs {
  int rows;  // n * oh destination rows, split into contiguous ranges
  int ih, iw, oh, ow, c, vecs, vb, ns;
  int sh, sw, ph, pw, dh, dw;
  int64_t x_img;  // elements per image of x
};

template <class T>
__global__ void __launch_bounds__(kCoThreads) COneWgradKernel(const COneWgArgs g, int rows_per_split,
                                                              const T* __restrict__ x, const T* __restrict__ dy,
                                                              void* __restrict__ dw, int out_f32,
                                                              float* __restrict__ scratch) {
  constexpr int NA = kCoK * kCoK * kCoVc;
  extern __shared__ float co_red[];  // [ns][vb][NA]
  const int split = blockIdx.x, vt0 = blockIdx.y * g.vb;
  const int nv = min(g.vb, g.vecs - vt0);
  const int v = threadIdx.x % g.vb, slot = threadIdx.x / g.vb;
  const int c0 = (vt0 + v) * kCoVc;
  float acc[kCoK][kCoK][kCoVc];
#pragma unroll
  for (int r = 0; r < kCoK; ++r)
#pragma unroll
    for (int s = 0; s < kCoK; ++s)
#pragma unroll
      for (int i = 0; i < kCoVc; ++i) acc[r][s][i] = 0.f;
  if (v < nv && slot < g.ns) {
    const int row_end = min(g.rows, (split + 1) * rows_per_split);
    for (int row = split * rows_per_split; row < row_end; ++row) {
      const int n = row / g.oh, y = row - n * g.oh;
      const T* xn = x + n * g.x_img + c0;
      const T* dyr = dy + static_cast<int64_t>(row) * g.ow;
      const int q0 = y * g.sh - g.ph;
      for (int xo = slot; xo < g.ow; xo += g.ns) {
        const float d = ToAcc(dyr[xo]);
        const int p0 = xo * g.sw - g.pw;
#pragma unroll
        for (int r = 0; r < kCoK; ++r) {
          const int qr = q0 + r * g.dh;
          if (qr < 0 || qr >= g.ih) continue;
          const T* xr = xn + static_cast<int64_t>(qr) * g.iw * g.c;
#pragma unroll
          for (int s = 0; s < kCoK; ++s) {
            const int qc = p0 + s * g.dw;
            if (qc < 0 || qc >= g.iw) continue;
            float xv[kCoVc];
            LdGlobalAcc<T, float, kCoVc>(xr + static_cast<int64_t>(qc) * g.c, xv);
#pragma unroll
            for (int i = 0; i < kCoVc; ++i) acc[r][s][i] = fmaf(xv[i], d, acc[r][s][i]);
          }
        }
      }
    }
  }
  float* mine = co_red + (slot * g.vb + v) * NA;
#pragma unroll
  for (int r = 0; r < kCoK; ++r)
#pragma unroll
    for (int s = 0; s < kCoK; ++s)
#pragma unroll
      for (int i = 0; i < kCoVc; ++i) mine[(r * kCoK + s) * kCoVc + i] = acc[r][s][i];
  __syncthreads();
  const int per_slot = g.vb * NA;
  for (int idx = threadIdx.x; idx < per_slot; idx += blockDim.x) {
    const int vv = idx / NA, e = idx - vv * NA;  // e = tap * 4 + channel
    if (vv >= nv) continue;
    float sum = 0.f;
    for (int k = 0; k < g.ns; ++k) sum += co_red[k * per_slot + idx];
    const int64_t off = static_cast<int64_t>(e / kCoVc) * g.c + (vt0 + vv) * kCoVc + e % kCoVc;
    if (gridDim.x > 1) scratch[static_cast<int64_t>(split) * kCoK * kCoK * g.c + off] = sum;
    else if (out_f32) static_cast<float*>(dw)[off] = sum;
    else static_cast<T*>(dw)[off] = FromAcc<T>(sum);
  }
}

COneWgArgs MakeCOneArgs(const ConvParams& p) {
  COneWgArgs a{};
  a.rows = static_cast<int>(p.n[0] * p.out[1]);
  a.ih = static_cast<int>(p.in[1]), a.iw = static_cast<int>(p.in[2]);
  a.oh = static_cast<int>(p.out[1]), a.ow = static_cast<int>(p.out[2]);
  a.c = static_cast<int>(p.c[0]);
  a.vecs = a.c / kCoVc;
  a.vb = static_cast<int>(CeilDiv(a.vecs, CeilDiv(a.vecs, 64)));  // at most 64 vectors, channel tiles balanced
  a.ns = kCoThreads / a.vb;
  a.sh = static_cast<int>(p.stride[1]), a.sw = static_cast<int>(p.stride[2]);
  a.ph = static_cast<int>(p.pad_lo[1]), a.pw = static_cast<int>(p.pad_lo[2]);
  a.dh = static_cast<int>(p.rhs_dil[1]), a.dw = static_cast<int>(p.rhs_dil[2]);
  a.x_img = p.in[1] * p.in[2] * p.c[0];
  return a;
}

std::string COneWgradError(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (!IsF32AccPair(pr.in, pr.out)) return "it takes 16-bit or float32 operands";
  if (p.layout[0] != kChannelsLast) return "it takes channels-last layouts";
  if (p.k[0] != 1 || p.c[0] < kCoVc || p.c[0] % kCoVc != 0 || p.groups[0] != 1 || p.batch_groups[0] != 1) {
    return "it takes c -> 1 without groups, c a multiple of 4";
  }
  if (p.n[0] < 1 || p.in[0] != 1 || p.out[0] != 1 || p.win[0] != 1 || p.pad_lo[0] != 0) return "it takes 2-D problems";
  if (p.win[1] != kCoK || p.win[2] != kCoK) return "it takes 3x3 windows";
  // 32-bit coordinates: every tapped position and row index fits in int.
  for (int d = 1; d < 3; ++d) {
    if (p.lhs_dil[d] != 1 || p.in[d] < 1 || p.out[d] < 1 || p.in[d] > (1 << 24) || p.out[d] > (1 << 24)) {
      return "it takes no lhs dilation and extents up to 2^24";
    }
    if (p.stride[d] > (1 << 20) || p.rhs_dil[d] > (1 << 20) || p.pad_lo[d] < -(1 << 24) || p.pad_lo[d] > (1 << 24)) {
      return "strides, dilations or padding past its 32-bit coordinates";
    }
  }
  if (p.n[0] * p.out[1] > INT32_MAX || p.in[1] * p.in[2] * p.c[0] > INT32_MAX || CeilDiv(p.c[0] / kCoVc, 64) > 65535) {
    return "extents past its 32-bit coordinates";
  }
  return {};
}

// About four blocks per SM, at least one destination row each, partials within 512 MiB.
int64_t COneWgradSplits(const ConvParams& p) {
  const COneWgArgs a = MakeCOneArgs(p);
  const int64_t ctiles = CeilDiv(a.vecs, a.vb);
  int64_t splits = std::min<int64_t>(CeilDiv(4 * kPlanSms, ctiles), a.rows);
  splits = std::min<int64_t>(splits, 1024);
  splits = std::min<int64_t>(splits, (int64_t(1) << 27) / WElements(p));
  splits = std::max<int64_t>(1, splits);
  return CeilDiv(a.rows, CeilDiv(a.rows, splits));  // no empty split
}

cudaError_t COneWgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw, void* scratch,
                      int64_t splits, cudaStream_t s) {
  const COneWgArgs a = MakeCOneArgs(p);
  const int rows_per_split = static_cast<int>(CeilDiv(a.rows, splits));
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(CeilDiv(a.vecs, a.vb)));
  const unsigned threads = static_cast<unsigned>(a.vb * a.ns);
  const size_t smem = static_cast<size_t>(threads) * kCoK * kCoK * kCoVc * sizeof(float);
  const int out_f32 = out == DType::kF32;
  float* part = static_cast<float*>(scratch);
  cudaError_t e;
  if (in == DType::kF32) {
    COneWgradKernel<float><<<grid, threads, smem, s>>>(a, rows_per_split, static_cast<const float*>(x),
                                                       static_cast<const float*>(dy), dw, out_f32, part);
  } else if (in == DType::kBF16) {
    COneWgradKernel<__nv_bfloat16><<<grid, threads, smem, s>>>(a, rows_per_split,
                                                               static_cast<const __nv_bfloat16*>(x),
                                                               static_cast<const __nv_bfloat16*>(dy), dw, out_f32,
                                                               part);
  } else {
    COneWgradKernel<__half><<<grid, threads, smem, s>>>(a, rows_per_split, static_cast<const __half*>(x),
                                                        static_cast<const __half*>(dy), dw, out_f32, part);
  }
  if ((e = cudaGetLastError()) != cudaSuccess || splits == 1) return e;
  return ReduceSplits(in, out, scratch, splits, WElements(p), dw, s);
}

}  // namespace
}  // namespace cuda

namespace variants::direct_cone_wgrad {

std::string Applies(const Problem& pr) { return cuda::COneWgradError(pr); }

size_t Workspace(const Problem& pr) {
  const int64_t splits = cuda::COneWgradSplits(pr.p);
  return splits > 1 ? static_cast<size_t>(splits) * WElements(pr.p) * sizeof(float) : 0;
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const int64_t splits = cuda::COneWgradSplits(pr.p);
  if (!cuda::Aligned16(b.a) || (splits > 1 && (b.ws == nullptr || b.ws_bytes < Workspace(pr)))) {
    return cudaErrorInvalidValue;
  }
  return cuda::COneWgrad(pr.p, pr.in, pr.out, b.a, b.b, b.out, b.ws, splits, s);
}

}  // namespace variants::direct_cone_wgrad
}  // namespace jaxconv
