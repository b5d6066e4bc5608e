// small.pixel_wgrad_mma: the 4 -> 4 filter gradient of 16-bit data on tensor cores (ScPixelWgradMmaKernel; window rows
// and columns <= 4 taps, unit row stride: pixel_wgrad.cuh's plan with g.mma). For one source row i of one image plane
// and window plane f0, 16 output columns o2 make one m16n8k16 per pair of output channels: D[(t, ci)][(f1, co)] +=
// sum_o2 x[i, o2 * s2 - pad2 + t * d2, ci] * dy[o1, o2, co], o1 = i + pad1 - f1 * d1: M = 4 column taps x 4 input
// channels, N = 4 window rows x 2 output channels (co = 2p + m in MMA m), K = the 16 columns. Any order of K serves if
// A and B share it: lane (g, c) holds columns c + 4j, so each load instruction of a warp reads 4 consecutive pixels.
// With g = 2q + p, the lane's A rows are tap q, channels 2p and 2p + 1 (one 4-byte load per pixel: channel pair p,
// split by two byte permutes), and its B column is window row q, channel pair p (likewise). A lane's accumulators are
// then dw[f0, c, q, 2p + h, 2e + m] (d[2h + e] of MMA m). The sums over a row take 8 loads, 8 permutes and 2 MMAs per
// warp and 16 columns, against 48 FMAs per thread and column in ScPixelWgradKernel. Lanes past the taps (q >= taps, c
// >= taps) compute waste. An output column past the row zeroes both operands; a source column in the padding zeroes A,
// and a missing dy row zeroes B, which turns an inf or NaN of the other operand into NaN where the sum over the real
// products has none: a warp with a non-finite sum recomputes its sums with FMAs over the real products (only non-finite
// data gets there). A block of 16 warps owns 128 columns (8 strips) and one chunk of source rows (2 halves), reduces
// its warps in a fixed order and writes its partial vector as ScPixelWgradKernel does. Strips inside the row and rows
// whose dy rows exist load at immediate offsets from one pointer per row: with per-load checks and 64-bit address
// arithmetic for each load the kernel executed nearly twice the warp instructions. 8-row batches of loads before their
// MMAs were faster than 4.
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/shared/mma.cuh"
#include "kernels/small/pixel_wgrad.cuh"
#include "kernels/small/reduce.h"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

constexpr int kWgMmaBatch = 8;  // source rows whose loads are issued before their MMAs

template <class T>
__global__ void __launch_bounds__(kWgMmaWarps * 32, 1) ScPixelWgradMmaKernel(const PxWgArgs g,
                                                                              const T* __restrict__ x,
                                                                              const T* __restrict__ dy,
                                                                              float* __restrict__ scratch) {
  constexpr bool kBF16 = std::is_same_v<T, __nv_bfloat16>;
  __shared__ float red[kWgMmaWarps][8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gq = lane >> 2, c = lane & 3, q = gq >> 1, p = gq & 1;
  const int strip = warp % kWgMmaStrips, half = warp / kWgMmaStrips;
  const bool entries = q < g.taps[2] && c < g.taps[1];  // the lane's accumulators are real sums
  for (int b = blockIdx.x; b < g.blocks; b += gridDim.x) {
    const PxWgBlock k = DecodeBlock(g, b);
    const int f0 = k.slice, ctile = k.ctile, rc = k.rc, plane = k.plane;
    const int64_t tile = k.tile;
    const int n = plane / g.osp[0], o0 = plane - n * g.osp[0];
    const int i0 = o0 * g.stride[0] - g.pad[0] + f0 * g.rdil[0];
    const int hrows = g.per_chunk / 2;  // per_chunk is even
    const int rb = rc * g.per_chunk + half * hrows;
    const int re = static_cast<unsigned>(i0) < static_cast<unsigned>(g.in[0]) ? min(rb + hrows, g.in[1]) : rb;
    const int o2b = (ctile * kWgMmaStrips + strip) * 16;
    // Waste lanes (q past the taps) read tap 0's columns and window row 0's dy rows: their sums are never used.
    const int qx = q < g.taps[2] ? q : 0, sh = g.pad[1] - (q < g.taps[1] ? q : 0) * g.rdil[1];
    // Per column j: element offsets of the lane's x and dy words (channel pair p), -1 where the operand is zero.
    int xo[4], yo[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int o2 = o2b + c + 4 * j, xc = o2 * g.stride[2] - g.pad[2] + qx * g.rdil[2];
      const bool ov = o2 < g.osp[2];
      xo[j] = ov && static_cast<unsigned>(xc) < static_cast<unsigned>(g.in[2]) ? 4 * xc + 2 * p : -1;
      yo[j] = ov ? 4 * o2 + 2 * p : -1;
    }
    // Strips whose 16 columns and their taps all lie inside the row (unit column stride) and batches of rows whose
    // dy rows all lie inside the image load without checks, at immediate offsets (column j: 16 j elements on).
    const int xlast = o2b + 15 - g.pad[2] + (g.taps[2] - 1) * g.rdil[2];
    const bool inner = g.stride[2] == 1 && o2b + 16 <= g.osp[2] && o2b - g.pad[2] >= 0 && xlast < g.in[2];
    const int ilo = (g.taps[1] - 1) * g.rdil[1] - g.pad[1], ihi = min(re, g.osp[1] - g.pad[1]);
    const T* xp = x + n * g.xN + static_cast<int64_t>(i0) * g.xS0;
    const T* yp = dy + n * g.dN + static_cast<int64_t>(o0) * g.dS0;
    const T* xq = xp + (4 * (o2b + c - g.pad[2] + qx * g.rdil[2]) + 2 * p);
    const T* yq = yp + (static_cast<int64_t>(sh) * g.dS1 + 4 * (o2b + c) + 2 * p);
    float acc[2][4] = {};
    const auto mma = [&](const uint32_t (&xa)[4], const uint32_t (&yb)[4]) {
      const uint32_t a[4] = {__byte_perm(xa[0], xa[1], 0x5410), __byte_perm(xa[0], xa[1], 0x7632),
                             __byte_perm(xa[2], xa[3], 0x5410), __byte_perm(xa[2], xa[3], 0x7632)};
      Mma16816<kBF16>(acc[0], a, __byte_perm(yb[0], yb[1], 0x5410), __byte_perm(yb[2], yb[3], 0x5410));
      Mma16816<kBF16>(acc[1], a, __byte_perm(yb[0], yb[1], 0x7632), __byte_perm(yb[2], yb[3], 0x7632));
    };
    for (int i = rb; i < re; i += kWgMmaBatch) {
      uint32_t xa[kWgMmaBatch][4], yb[kWgMmaBatch][4];
      if (inner && i >= ilo && i + kWgMmaBatch <= ihi) {
#pragma unroll
        for (int r = 0; r < kWgMmaBatch; ++r) {
          const uint32_t* xr = reinterpret_cast<const uint32_t*>(xq + static_cast<int64_t>(i + r) * g.xS1);
          const uint32_t* yr = reinterpret_cast<const uint32_t*>(yq + static_cast<int64_t>(i + r) * g.dS1);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            xa[r][j] = __ldg(xr + 8 * j);
            yb[r][j] = __ldg(yr + 8 * j);
          }
        }
      } else {
#pragma unroll
        for (int r = 0; r < kWgMmaBatch; ++r) {
          const int ii = i + r, o1 = ii + sh;
          const bool xv = ii < re, yv = xv && static_cast<unsigned>(o1) < static_cast<unsigned>(g.osp[1]);
          const T* xr = xp + static_cast<int64_t>(ii) * g.xS1;
          const T* yr = yp + static_cast<int64_t>(o1) * g.dS1;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            xa[r][j] = xv && xo[j] >= 0 ? __ldg(reinterpret_cast<const uint32_t*>(xr + xo[j])) : 0u;
            yb[r][j] = yv && yo[j] >= 0 ? __ldg(reinterpret_cast<const uint32_t*>(yr + yo[j])) : 0u;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kWgMmaBatch; ++r) mma(xa[r], yb[r]);
    }
    bool finite = true;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) finite = finite && fabsf(acc[m][e]) < INFINITY;  // false for inf and NaN
    if (!__all_sync(0xffffffffu, finite || !entries) && entries) {
      // The lane's sums again over the real products only: window row c, tap q, channels 2p + h, all co.
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][e] = 0.f;
      const int shc = g.pad[1] - c * g.rdil[1];
      for (int i = rb; i < re; ++i) {
        const int o1 = i + shc;
        if (static_cast<unsigned>(o1) >= static_cast<unsigned>(g.osp[1])) continue;
        for (int k = 0; k < 16; ++k) {
          const int o2 = o2b + k, xc = o2 * g.stride[2] - g.pad[2] + q * g.rdil[2];
          if (o2 >= g.osp[2] || static_cast<unsigned>(xc) >= static_cast<unsigned>(g.in[2])) continue;
          const T* xe = xp + static_cast<int64_t>(i) * g.xS1 + 4 * xc + 2 * p;
          const float xv[2] = {ToAcc(xe[0]), ToAcc(xe[1])};
          float yv[4];
          LdGlobalAcc<T, float, 4>(yp + static_cast<int64_t>(o1) * g.dS1 + 4 * o2, yv);
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e)
#pragma unroll
              for (int m = 0; m < 2; ++m) acc[m][2 * h + e] = fmaf(xv[h], yv[2 * e + m], acc[m][2 * h + e]);
        }
      }
    }
    __syncthreads();  // the previous block's readers of red are done
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp][4 * m + e][lane] = acc[m][e];
    __syncthreads();
    // Warp i < 8 adds entry i (MMA m = i / 4, accumulator d[2h + e]) over the warps in order; its lanes' (q, p, c)
    // are the writers'.
    if (warp < 8 && entries) {
      const int m = warp >> 2, h = (warp >> 1) & 1, e = warp & 1;
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWgMmaWarps; ++w) s += red[w][warp][lane];
      const int64_t f = (static_cast<int64_t>(f0) * g.taps[1] + c) * g.taps[2] + q;
      scratch[tile * g.welems + f * 16 + (2 * p + h) * 4 + 2 * e + m] = s;
    }
  }
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_pixel_wgrad_mma {

std::string Applies(const Problem& pr) {
  using namespace cuda::small_channel;
  if (std::string e = FamilyError(pr); !e.empty()) return e;
  if (!Is16Bit(pr.in)) return "it takes 16-bit operands";
  PxWgArgs g{};
  if (std::string e = PixelWgradPlan(pr.p, pr.in, &g); !e.empty()) return e;
  if (!g.mma) return "it takes at most 4 x 4 taps per window plane and unit row stride";
  return {};
}

size_t Workspace(const Problem& pr) {
  using namespace cuda::small_channel;
  PxWgArgs g{};
  PixelWgradPlan(pr.p, pr.in, &g);
  return PartialBytes(pr, PixelWgradTiles(g));
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  // 4-byte channel pairs of 8-byte pixel vectors.
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b)) return cudaErrorMisalignedAddress;
  PxWgArgs g{};
  if (!PixelWgradPlan(pr.p, pr.in, &g).empty() || !g.mma) return cudaErrorInvalidValue;
  const int64_t tiles = PixelWgradTiles(g);
  if (b.ws == nullptr || b.ws_bytes < PartialBytes(pr, tiles)) return cudaErrorInvalidValue;
  const cudaError_t e = cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto) -> cudaError_t {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, float>) {
      ScPixelWgradMmaKernel<T><<<cuda::GridX(g.blocks), kWgMmaWarps * 32, 0, s>>>(
          g, static_cast<const T*>(b.a), static_cast<const T*>(b.b), static_cast<float*>(b.ws));
      return cudaGetLastError();
    } else {
      return cudaErrorInvalidValue;  // 16-bit only (Applies)
    }
  });
  if (e != cudaSuccess) return e;
  return ReduceChunks(pr.in, pr.out, b.ws, tiles, WElements(pr.p), b.out, s);
}

}  // namespace variants::small_pixel_wgrad_mma
}  // namespace jaxconv
