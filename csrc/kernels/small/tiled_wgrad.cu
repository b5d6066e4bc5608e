// small.tiled_wgrad: the filter gradient over spatial tiles (unit stride, no lhs dilation, at most 2 spatial dims, c
// and k of 1 or multiples of 4, float accumulation):
// dw[f0, f1, ci, co] = sum_{n, o0, o1} x[n, o0 - p0 + f0 d0, o1 - p1 + f1 d1, ci] * dy[n, o0, o1, co].
// A block owns one tile of TH x kTw output pixels and one slice (<= TwMaxTaps taps x CB input x KB output
// channels); it stages the dy tile and the x tile with its halo in shared memory as float (zero outside x), so
// the inner loop is a shared load and CB*KB FMAs per tap with no index checks. Thread j owns output column j
// (all TH rows), reduces its partial sums with the block in a fixed order and writes them to scratch[tile]; the
// family's reduction then adds the tiles per element in a fixed order (bitwise deterministic, no atomics). The
// generic gather filter gradient (small.chunked_wgrad) spends ~30 instructions of index arithmetic per FMA on these
// problems.
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/small/reduce.h"
#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

constexpr int kTw = 128;              // output columns per tile (= threads per block)
constexpr int kTileAcc = 36;          // partial sums per thread (taps x CB x KB of a slice; see TwMaxTaps)
constexpr int64_t kTileSmem = 40 * 1024;

struct TwArgs {
  int64_t n, tiles, blocks, welems;
  int oh, ow, ih, iw, kh, kw, d0, d1, p0, p1, c, k;
  int th, rtiles, ctiles, xh, xw;     // rows per tile, tile counts, staged x extent
  int nslices, ntg, taps_per, ncb, nkb;  // slices = tap groups x ci blocks x co blocks
  int64_t xN, xH, dN, dH;             // element strides (channels-last: W stride = c or k)
};

// Taps per slice: kTileAcc / (CB * KB), but 3 for 4 x 4 channel blocks (48 sums): a 3x3 window in 3 slices, not 5
// (each slice stages its own copy of the x and dy tiles).
__host__ __device__ constexpr int TwMaxTaps(int cb, int kb) { return cb * kb == 16 ? 3 : kTileAcc / (cb * kb); }

// Floats of the staged x tile, rounded up to 4 so the dy tile after it stays 16-byte aligned (a 9 x 131 x tile had
// put the float4 dy loads off alignment).
__host__ __device__ constexpr int TwXFloats(int xh, int xw, int cb) { return (xh * xw * cb + 3) & ~3; }

template <class T, int CB, int KB>
__global__ void __launch_bounds__(kTw) TwWgradKernel(const TwArgs g, const T* __restrict__ x,
                                                     const T* __restrict__ dy, float* __restrict__ scratch) {
  constexpr int NT = TwMaxTaps(CB, KB);
  extern __shared__ __align__(16) float sm[];
  __shared__ float red[kTw / 32][NT * CB * KB];
  float* xs = sm;                                   // [xh][xw][CB]
  float* ds = sm + TwXFloats(g.xh, g.xw, CB);       // [th][kTw][KB], 16-byte aligned for KB = 4 loads
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int64_t blk = blockIdx.x; blk < g.blocks; blk += gridDim.x) {
    int64_t rem = blk;
    const int slice = static_cast<int>(rem % g.nslices); rem /= g.nslices;
    const int64_t tile = rem;
    const int ctile = static_cast<int>(rem % g.ctiles); rem /= g.ctiles;
    const int rtile = static_cast<int>(rem % g.rtiles); rem /= g.rtiles;
    const int64_t n = rem;
    int sr = slice;
    const int kb = sr % g.nkb; sr /= g.nkb;
    const int cb = sr % g.ncb; sr /= g.ncb;
    const int tg = sr;
    const int r0 = rtile * g.th, c0 = ctile * kTw;
    const int t_begin = tg * g.taps_per;
    const int nt = min(g.taps_per, g.kh * g.kw - t_begin);
    __syncthreads();  // the previous block's readers are done with xs / ds / red
    // Stage x rows r0 - p0 .. + xh, cols c0 - p1 .. + xw, channels cb*CB ..; dy rows r0.., cols c0.., k kb*KB...
    // One warp per row, lanes along the row (no divisions but by the compile-time CB / KB), 4 loads in flight.
    const T* xn = x + n * g.xN + cb * CB;
    for (int row = warp; row < g.xh; row += kTw / 32) {
      const int ih = r0 - g.p0 + row;
      float* dst = xs + row * g.xw * CB;
      if (ih < 0 || ih >= g.ih) {
        for (int q = lane; q < g.xw * CB; q += 32) dst[q] = 0.f;
        continue;
      }
      const T* src = xn + ih * g.xH;
#pragma unroll 4
      for (int q = lane; q < g.xw * CB; q += 32) {
        const int iw = c0 - g.p1 + q / CB;
        dst[q] = (iw >= 0 && iw < g.iw) ? ToAcc(src[static_cast<int64_t>(iw) * g.c + q % CB]) : 0.f;
      }
    }
    const T* dn = dy + n * g.dN + kb * KB;
    for (int row = warp; row < g.th; row += kTw / 32) {
      const int oh = r0 + row;
      float* dst = ds + row * kTw * KB;
      if (oh >= g.oh) {
        for (int q = lane; q < kTw * KB; q += 32) dst[q] = 0.f;
        continue;
      }
      const T* src = dn + oh * g.dH;
#pragma unroll 4
      for (int q = lane; q < kTw * KB; q += 32) {
        const int ow = c0 + q / KB;
        dst[q] = ow < g.ow ? ToAcc(src[static_cast<int64_t>(ow) * g.k + q % KB]) : 0.f;
      }
    }
    __syncthreads();
    float acc[NT][CB][KB];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int a = 0; a < CB; ++a)
#pragma unroll
        for (int b = 0; b < KB; ++b) acc[t][a][b] = 0.f;
    // Only real output pixels contribute (a staged zero dy must not meet a staged x value: inf * 0).
    const int rows = min(g.th, g.oh - r0);
    int toff[NT];  // shared-memory offset (in CB units) of each tap of the slice
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int f = min(t_begin + t, g.kh * g.kw - 1), f0 = f / g.kw, f1 = f - f0 * g.kw;
      toff[t] = f0 * g.d0 * g.xw + f1 * g.d1;
    }
    if (c0 + tid < g.ow) {
      for (int r = 0; r < rows; ++r) {
        float dv[KB];
        LdN<KB>(ds + (r * kTw + tid) * KB, dv);  // 16-byte aligned for KB = 4
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < nt) {
            float xv[CB];
            LdN<CB>(xs + (r * g.xw + tid + toff[t]) * CB, xv);
#pragma unroll
            for (int a = 0; a < CB; ++a)
#pragma unroll
              for (int b = 0; b < KB; ++b) acc[t][a][b] = fmaf(xv[a], dv[b], acc[t][a][b]);
          }
        }
      }
    }
    // Fixed-order block reduction: butterfly within warps, then the 4 warps in order.
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;  // uniform over the block
#pragma unroll
      for (int a = 0; a < CB; ++a)
#pragma unroll
        for (int b = 0; b < KB; ++b) {
          const float v = WarpSum(acc[t][a][b]);
          if (lane == 0) red[warp][(t * CB + a) * KB + b] = v;
        }
    }
    __syncthreads();
    for (int e = tid; e < nt * CB * KB; e += kTw) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kTw / 32; ++w) v += red[w][e];
      const int t = e / (CB * KB), a = (e / KB) % CB, b = e % KB;
      const int f = t_begin + t;
      // dw element (f0, f1, ci, co), channels-last filter (KH, KW, C, K)
      const int64_t de = (static_cast<int64_t>(f) * g.c + cb * CB + a) * g.k + kb * KB + b;
      scratch[tile * g.welems + de] = v;
    }
  }
}

// The tile plan for ConvParams p with CB x KB channel blocks ("" where the tiled kernel takes it).
std::string MakeTwArgs(const ConvParams& p, int cbw, int kbw, TwArgs* out) {
  TwArgs g{};
  if (p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) {
    return "it takes channels-last layouts without groups";
  }
  if (p.in[0] != 1 || p.win[0] != 1 || p.out[0] != 1) return "it takes at most 2 spatial dims";
  for (int d = 1; d < 3; ++d) {
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1) return "it takes unit strides and no lhs dilation";
  }
  if (p.c[0] % cbw != 0 || p.k[0] % kbw != 0) return "it takes c and k of 1 or multiples of 4";
  g.n = p.n[0];
  g.ih = static_cast<int>(p.in[1]); g.iw = static_cast<int>(p.in[2]);
  g.oh = static_cast<int>(p.out[1]); g.ow = static_cast<int>(p.out[2]);
  g.kh = static_cast<int>(p.win[1]); g.kw = static_cast<int>(p.win[2]);
  g.d0 = static_cast<int>(p.rhs_dil[1]); g.d1 = static_cast<int>(p.rhs_dil[2]);
  g.p0 = static_cast<int>(p.pad_lo[1]); g.p1 = static_cast<int>(p.pad_lo[2]);
  g.c = static_cast<int>(p.c[0]); g.k = static_cast<int>(p.k[0]);
  if (g.n <= 0 || g.oh <= 0 || g.ow <= 0 || g.kh <= 0 || g.kw <= 0) return "it takes nonempty batches and outputs";
  const int64_t span_h = int64_t(g.kh - 1) * g.d0, span_w = int64_t(g.kw - 1) * g.d1;
  if (span_h > 64 || span_w > 64) return "it takes window spans up to 64";  // the halo would dwarf the tile
  g.xw = kTw + static_cast<int>(span_w);
  // Rows per tile: up to 32 as the shared memory allows, fewer (down to 8) while the tiles would not give
  // ~4 blocks per SM.
  g.th = 32;
  auto bytes = [&](int th) { return (TwXFloats(th + static_cast<int>(span_h), g.xw, cbw) + int64_t(th) * kTw * kbw) * 4; };
  while (g.th > 1 && bytes(g.th) > kTileSmem) g.th /= 2;
  if (bytes(g.th) > kTileSmem) return "its tiles take more than 40 KiB of shared memory";
  while (g.th > 8 && g.n * CeilDiv(g.oh, g.th) * CeilDiv(g.ow, kTw) < 4 * kPlanSms) g.th /= 2;
  g.xh = g.th + static_cast<int>(span_h);
  g.rtiles = static_cast<int>(CeilDiv(g.oh, g.th));
  g.ctiles = static_cast<int>(CeilDiv(g.ow, kTw));
  g.tiles = g.n * g.rtiles * g.ctiles;
  const int taps = g.kh * g.kw;
  g.taps_per = std::min(taps, TwMaxTaps(cbw, kbw));
  g.ntg = static_cast<int>(CeilDiv(taps, g.taps_per));
  g.ncb = g.c / cbw;
  g.nkb = g.k / kbw;
  g.nslices = g.ntg * g.ncb * g.nkb;
  g.blocks = g.tiles * g.nslices;
  g.welems = WElements(p);
  // Scratch holds one partial vector per tile: keep it under 256 MiB.
  if (g.tiles * g.welems * 4 > (int64_t(1) << 28)) return "its partial filters would take more than 256 MiB";
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  g.xN = xs.s[0]; g.xH = xs.s[3];
  g.dN = ys.s[0]; g.dH = ys.s[3];
  *out = g;
  return {};
}

template <class T, int CB, int KB>
cudaError_t LaunchTw(const TwArgs& g, const void* x, const void* dy, void* scratch, cudaStream_t s) {
  const size_t smem = (static_cast<size_t>(TwXFloats(g.xh, g.xw, CB)) + static_cast<size_t>(g.th) * kTw * KB) * sizeof(float);
  TwWgradKernel<T, CB, KB><<<GridX(g.blocks), kTw, smem, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(dy),
                                                               static_cast<float*>(scratch));
  return cudaGetLastError();
}

// The tiled filter gradient's plan: channel blocks of 1 or 4 input and output channels, float partial sums (not
// f64); "" where it applies.
std::string TiledWgradPlan(const ConvParams& p, DType in, TwArgs* g, int* cbw, int* kbw) {
  if (in == DType::kF64) return "it takes 16-bit or float32 operands";
  *cbw = p.c[0] == 1 ? 1 : (p.c[0] % 4 == 0 ? 4 : 0);
  *kbw = p.k[0] == 1 ? 1 : (p.k[0] % 4 == 0 ? 4 : 0);
  if (*cbw == 0 || *kbw == 0) return "it takes c and k of 1 or multiples of 4";
  return MakeTwArgs(p, *cbw, *kbw, g);
}

template <class T>
cudaError_t RunTw(const TwArgs& g, int cbw, int kbw, const void* x, const void* dy, void* scratch, cudaStream_t s) {
  if (cbw == 1 && kbw == 1) return LaunchTw<T, 1, 1>(g, x, dy, scratch, s);
  if (cbw == 4 && kbw == 1) return LaunchTw<T, 4, 1>(g, x, dy, scratch, s);
  if (cbw == 1 && kbw == 4) return LaunchTw<T, 1, 4>(g, x, dy, scratch, s);
  return LaunchTw<T, 4, 4>(g, x, dy, scratch, s);
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_tiled_wgrad {

std::string Applies(const Problem& pr) {
  using namespace cuda::small_channel;
  if (std::string e = FamilyError(pr); !e.empty()) return e;
  if (!cuda::IsF32AccPair(pr.in, pr.out)) return "it takes 16-bit or float32 operands";
  TwArgs g{};
  int cbw = 0, kbw = 0;
  return TiledWgradPlan(pr.p, pr.in, &g, &cbw, &kbw);
}

size_t Workspace(const Problem& pr) {
  using namespace cuda::small_channel;
  TwArgs g{};
  int cbw = 0, kbw = 0;
  TiledWgradPlan(pr.p, pr.in, &g, &cbw, &kbw);
  return PartialBytes(pr, g.tiles);
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  TwArgs g{};
  int cbw = 0, kbw = 0;
  if (!TiledWgradPlan(pr.p, pr.in, &g, &cbw, &kbw).empty()) return cudaErrorInvalidValue;
  if (b.ws == nullptr || b.ws_bytes < PartialBytes(pr, g.tiles)) return cudaErrorInvalidValue;
  cudaError_t e;
  switch (pr.in) {
    case DType::kBF16: e = RunTw<__nv_bfloat16>(g, cbw, kbw, b.a, b.b, b.ws, s); break;
    case DType::kF16: e = RunTw<__half>(g, cbw, kbw, b.a, b.b, b.ws, s); break;
    default: e = RunTw<float>(g, cbw, kbw, b.a, b.b, b.ws, s); break;
  }
  if (e != cudaSuccess) return e;
  return ReduceChunks(pr.in, pr.out, b.ws, g.tiles, WElements(pr.p), b.out, s);
}

}  // namespace variants::small_tiled_wgrad
}  // namespace jaxconv
