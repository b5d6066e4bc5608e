// small.pixel_wgrad: the 4 -> 4 filter gradient on FMAs (float32 data, and 16-bit data outside the tensor-core
// kernel's plan: pixel_wgrad.cuh).
// Filter gradient (ScPixelWgradKernel, no lhs dilation): dw[f, ci, co] = sum_{n, o} x[n, o*s - pad + f*d, ci] *
// dy[n, o, co]. A block owns one slice (one window row (f0, f1) and kPxTaps consecutive taps along the last dim:
// 3 x 16 = 48 sums per thread), one tile of 256 output columns (thread = column) and one chunk of output rows of
// one (image, out0) plane; a thread walks its column down the chunk with pointer steps, loading dy's 4 channels
// and the slice's x pixels straight from global memory for 48 FMAs per row, the loads of 4 rows (2 for float32)
// issued before their FMAs (faster than one row at a time). A tap whose x column lies outside the row reads a
// clamped column and its sums are zeroed after the walk (the column is fixed per thread), so the walk has no per-load
// checks. The block's sums are reduced in a fixed order (a halving butterfly within each warp, then the 8 warps in
// order) into scratch[tile][welems]; the family's reduction adds the tiles (bitwise deterministic). The tiled filter
// gradient staged x and dy element by element for each of its 128-column tiles and 3 slices.
#include <cstdint>
#include <string>

#include "kernels/small/pixel_wgrad.cuh"
#include "kernels/small/reduce.h"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

// Sum of v[L] over the warp, halving: at offset O a lane adds its partner's half of the live entries it keeps
// (upper half where lane & O), while L is even; an odd L is summed whole. Afterwards the lane holds, in v[0, L'),
// the warp's sums of entries [*base, *base + L'); lanes that differ only in the bits of whole-sum offsets hold
// the same values.
template <int L, int O>
__device__ __forceinline__ void WarpHalvingSum(float* v, int lane, int* base) {
  if constexpr (O >= 1) {
    if constexpr (L % 2 == 0) {
      constexpr int H = L / 2;
      const bool up = (lane & O) != 0;
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float send = up ? v[i] : v[i + H], keep = up ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      if (up) *base += H;
      WarpHalvingSum<H, O / 2>(v, lane, base);
    } else {
#pragma unroll
      for (int i = 0; i < L; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], O);
      WarpHalvingSum<L, O / 2>(v, lane, base);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kPxThreads, 2) ScPixelWgradKernel(const PxWgArgs g, const T* __restrict__ x,
                                                                    const T* __restrict__ dy,
                                                                    float* __restrict__ scratch) {
  constexpr int E = kPxTaps * 16;
  static_assert(E == 48, "the halving sum below leaves 3 sums per lane pair");
  __shared__ float red[kPxRows][E];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int b = blockIdx.x; b < g.blocks; b += gridDim.x) {  // blocks < 2^22 (PixelWgradPlan)
    const PxWgBlock k = DecodeBlock(g, b);
    const int slice = k.slice, ctile = k.ctile, rc = k.rc, plane = k.plane;
    const int64_t tile = k.tile;
    const int tg = slice % g.tgroups, f01 = slice / g.tgroups;
    const int f1 = f01 % g.taps[1], f0 = f01 / g.taps[1];
    const int fs = tg * kPxTaps;
    const int n = plane / g.osp[0], o0 = plane - n * g.osp[0];
    const int i0 = o0 * g.stride[0] - g.pad[0] + f0 * g.rdil[0];
    const int o2 = ctile * kPxThreads + tid;
    const int r_begin = rc * g.per_chunk, r_end = min(g.osp[1], r_begin + g.per_chunk);
    float acc[kPxTaps][4][4];
#pragma unroll
    for (int t = 0; t < kPxTaps; ++t)
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[t][a][c] = 0.f;
    if (o2 < g.osp[2] && static_cast<unsigned>(i0) < static_cast<unsigned>(g.in[0])) {
      bool v2[kPxTaps];
      int xo[kPxTaps];  // element offset of tap t's (clamped) column
#pragma unroll
      for (int t = 0; t < kPxTaps; ++t) {
        const int i2 = o2 * g.stride[2] - g.pad[2] + (fs + t) * g.rdil[2];
        v2[t] = fs + t < g.taps[2] && static_cast<unsigned>(i2) < static_cast<unsigned>(g.in[2]);
        xo[t] = 4 * (v2[t] ? i2 : 0);
      }
      // Output rows o1 whose source row i1 = o1 * s - sh lies in [0, in), sh <= o1 * s < in + sh, are an interval
      // (uniform over the block): the walk has no per-row check, and R rows' loads are issued before their FMAs.
      const int64_t sh = static_cast<int64_t>(g.pad[1]) - static_cast<int64_t>(f1) * g.rdil[1], st = g.stride[1];
      const int lo = static_cast<int>(std::max<int64_t>(sh <= 0 ? 0 : (sh + st - 1) / st, r_begin));
      const int hi = static_cast<int>(std::min<int64_t>(g.in[1] + sh <= 0 ? 0 : (g.in[1] + sh + st - 1) / st, r_end));
      constexpr int R = sizeof(T) == 4 ? 2 : 4;  // rows per batch (float32: 16 loaded floats per row)
      const T* pd = dy + n * g.dN + (o0 * g.dS0 + lo * g.dS1 + 4 * o2);
      const T* xr = x + n * g.xN + i0 * g.xS0 + (lo * st - sh) * g.xS1;
      const int64_t xstep = st * g.xS1;
      int o1 = lo;
      const auto rows = [&](auto rows_c) {
        constexpr int RC = decltype(rows_c)::value;
        float dv[RC][4], xv[RC][kPxTaps][4];
#pragma unroll
        for (int r = 0; r < RC; ++r) {
          LdGlobalAcc<T, float, 4>(pd + r * g.dS1, dv[r]);
#pragma unroll
          for (int t = 0; t < kPxTaps; ++t) LdGlobalAcc<T, float, 4>(xr + r * xstep + xo[t], xv[r][t]);
        }
#pragma unroll
        for (int r = 0; r < RC; ++r)
#pragma unroll
          for (int t = 0; t < kPxTaps; ++t)
#pragma unroll
            for (int ci = 0; ci < 4; ++ci)
#pragma unroll
              for (int c = 0; c < 4; ++c) acc[t][ci][c] = fmaf(xv[r][t][ci], dv[r][c], acc[t][ci][c]);
        o1 += RC;
        pd += RC * g.dS1;
        xr += RC * xstep;
      };
      while (o1 + R <= hi) rows(IntC<R>{});
      while (o1 < hi) rows(IntC<1>{});
#pragma unroll
      for (int t = 0; t < kPxTaps; ++t)
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[t][a][c] = v2[t] ? acc[t][a][c] : 0.f;
    }
    float* v = &acc[0][0][0];
    int base = 0;
    WarpHalvingSum<E, 16>(v, lane, &base);  // 48 -> 24 -> 12 -> 6 -> 3 entries, then lane pairs sum whole
    __syncthreads();  // the previous block's readers of red are done
    if ((lane & 1) == 0) {
#pragma unroll
      for (int i = 0; i < E / 16; ++i) red[warp][base + i] = v[i];
    }
    __syncthreads();
    if (tid < E) {
      const int t = tid / 16;
      if (fs + t < g.taps[2]) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kPxRows; ++w) s += red[w][tid];
        const int64_t f = (static_cast<int64_t>(f0) * g.taps[1] + f1) * g.taps[2] + fs + t;
        scratch[tile * g.welems + f * 16 + tid % 16] = s;
      }
    }
  }
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_pixel_wgrad {

std::string Applies(const Problem& pr) {
  using namespace cuda::small_channel;
  if (std::string e = FamilyError(pr); !e.empty()) return e;
  if (!cuda::IsF32AccPair(pr.in, pr.out)) return "it takes 16-bit or float32 operands";
  PxWgArgs g{};
  if (std::string e = PixelWgradPlan(pr.p, pr.in, &g); !e.empty()) return e;
  if (g.mma) return "16-bit data with at most 4 x 4 taps per window plane, unit row stride take its tensor-core kernel";
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
  // 8- or 16-byte pixel vectors.
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b)) return cudaErrorMisalignedAddress;
  PxWgArgs g{};
  if (!PixelWgradPlan(pr.p, pr.in, &g).empty()) return cudaErrorInvalidValue;
  const int64_t tiles = PixelWgradTiles(g);
  if (b.ws == nullptr || b.ws_bytes < PartialBytes(pr, tiles)) return cudaErrorInvalidValue;
  const cudaError_t e = cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto) {
    using T = decltype(t);
    ScPixelWgradKernel<T><<<cuda::GridX(g.blocks), kPxThreads, 0, s>>>(g, static_cast<const T*>(b.a),
                                                                        static_cast<const T*>(b.b),
                                                                        static_cast<float*>(b.ws));
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  return ReduceChunks(pr.in, pr.out, b.ws, tiles, WElements(pr.p), b.out, s);
}

}  // namespace variants::small_pixel_wgrad
}  // namespace jaxconv
