// small.pixel_mma: the 4 -> 4 forward and data gradient of 16-bit data with an undilated 3x3 window along H and W
// at unit column stride (pixel.cuh: PixelK3), on tensor cores instead of FMAs (ScPixelMmaKernel). One mma.sync
// m16n8k16 per window row gives 32 destination pixels x 4 channels. Row m of A is the 4 source pixels from
// 2m + base on (K = 4 k2 + ci: 32 contiguous bytes), column n = 4p + co of B the filter of destination pixel 2m + p,
// tap f2 = k2 - p (G2 > 0) or 2 - (k2 - p) (G2 < 0), zero where k2 - p is not a tap. In this layout a lane's
// fragments all belong to pixel lane / 2 of a 16-pixel group and channel pair lane % 2: its A words are 4-byte loads
// straight from global memory (a warp reads 128 contiguous bytes per load), its B words 4 filter values, and its
// accumulators one 4-byte (16-bit) store of that pixel's channels 2 (lane % 2), + 1. No shared memory and no
// barrier. A zero of B times an inf or NaN neighbour is NaN where lax's sum is finite, so a warp with a non-finite
// output recomputes its outputs with FMAs over the real taps only (rare: only non-finite data gets there).
// Products of 16-bit values are exact in f32 and the accumulators are f32, as in the FMA kernel.
// A warp takes NC = 4 chunks (128 columns) of R = 2 destination rows and loads each of their R + 2 source rows once
// (unit row stride and gamma1 = G2: the forward and data gradient of an undilated 3x3), else R = 1 (any rows).
// Of the shapes tried (NC = 2 or 4, R = 1, 2 or 4, and a kernel staging a warp's three source rows in shared memory
// as overlapping pixel pairs, ldmatrix.x2 plus two 4-byte reads per M tile of 16 pixels, half of K and N zero),
// NC = 4 and R = 2 were the fastest on msd's 4 -> 4 layer at 512^2 and 1024^2.
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/shared/mma.cuh"
#include "kernels/small/pixel.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

constexpr int kMmaChunks = 4;  // 32-pixel MMAs per warp and window row
constexpr int kMmaRows = 2;    // destination rows per warp in the row sweep

template <class T, class TO, int G2, int NC, int R>
__global__ void __launch_bounds__(kPxThreads, 2) ScPixelMmaKernel(const ScArgs g, const T* __restrict__ src,
                                                                  const T* __restrict__ w,
                                                                  const TO* __restrict__ bias,
                                                                  TO* __restrict__ dst) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t1 = (static_cast<int>(blockIdx.y) * kPxRows + warp) * R;  // the warp's first destination row
  if (t1 >= g.tsp[1]) return;  // no barrier follows
  const int64_t n = blockIdx.z / g.tsp[0];
  const int t0 = static_cast<int>(blockIdx.z - n * g.tsp[0]);
  const int s0 = static_cast<int>(blockIdx.x) * 32 * NC;  // the warp's first destination pixel
  const int px = lane >> 1, half = lane & 1;               // pixel within 16, channel pair
  const int qb = s0 + g.beta[2] + (G2 < 0 ? -2 : 0) + px;   // source pixel of a[0], chunk 0
  constexpr int kOff[4] = {0, 16, 2, 18};                   // a[i]'s source pixel past qb (+32 per chunk)
  unsigned cv = 0;  // bit 4c + i: a[i] of chunk c lies inside the source row (the same for every row)
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      cv |= static_cast<unsigned>(static_cast<unsigned>(qb + 32 * c + kOff[i]) < static_cast<unsigned>(g.lim[2]))
            << (4 * c + i);
  // Lane (gq, tq)'s B words: b0 holds K rows 2tq, 2tq + 1 (k2 = tq / 2), b1 K rows + 8 (k2 + 2), of column gq.
  const int gq = lane >> 2, tq = lane & 3, bp = gq >> 2, bco = gq & 3, bci = 2 * (tq & 1);
  const uint16_t* wb = reinterpret_cast<const uint16_t*>(w);
  auto wbits = [&](int r, int k2, int ci) -> uint32_t {
    const int d = k2 - bp;
    if (d < 0 || d > 2) return 0u;
    const int f2 = G2 > 0 ? d : 2 - d;
    return __ldg(wb + static_cast<int64_t>(r * 3 + f2) * g.wF + ci * g.wCi + bco * g.wCo);
  };
  const T* sb = src + n * g.sN;
  float acc[R][NC][4];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][c][e] = 0.f;
  // Source row u of the sweep feeds destination row j through window row f1 = k1 (G2 > 0) or 2 - k1, k1 = u - j.
  constexpr int U = R == 1 ? 3 : R + 2;
  for (int f0 = 0; f0 < g.taps[0]; ++f0) {
    const int q0 = TapIndex(t0 * g.alpha[0] + g.beta[0] + f0 * g.gamma[0], 1, g.lim[0]);
    if (q0 < 0) continue;
    // Every source row's loads (A), and the filter's (B), before the first MMA.
    bool rv[U];
    uint32_t a[U][NC][4], b[3][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int q1 = R == 1 ? t1 * g.alpha[1] + g.beta[1] + u * g.gamma[1] : t1 + g.beta[1] + (G2 < 0 ? u - 2 : u);
      rv[u] = static_cast<unsigned>(q1) < static_cast<unsigned>(g.lim[1]);  // uniform over the warp
      const uint32_t* rp = reinterpret_cast<const uint32_t*>(
                               sb + (static_cast<int64_t>(q0) * g.sS[0] + static_cast<int64_t>(q1) * g.sS[1])) +
                           2 * static_cast<int64_t>(qb) + half;
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          a[u][c][i] = rv[u] && ((cv >> (4 * c + i)) & 1u) ? __ldg(rp + 2 * (32 * c + kOff[i])) : 0u;
    }
#pragma unroll
    for (int f1 = 0; f1 < 3; ++f1) {
      const int r = f0 * 3 + f1;
      b[f1][0] = wbits(r, tq >> 1, bci) | wbits(r, tq >> 1, bci + 1) << 16;
      b[f1][1] = wbits(r, 2 + (tq >> 1), bci) | wbits(r, 2 + (tq >> 1), bci + 1) << 16;
    }
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int f1 = 0; f1 < 3; ++f1) {
        const int u = R == 1 ? f1 : j + (G2 > 0 ? f1 : 2 - f1);
        if (!rv[u]) continue;
#pragma unroll
        for (int c = 0; c < NC; ++c)
          Mma16816<std::is_same_v<T, __nv_bfloat16>>(acc[j][c], a[u][c], b[f1][0], b[f1][1]);
      }
  }
  bool finite = true;
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) finite = finite && fabsf(acc[j][c][e]) < INFINITY;  // false for inf and NaN
  if (!__all_sync(0xffffffffu, finite)) {
    // The warp's outputs again, over the taps that exist only (the lane's pixels and channel pair, as above).
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int t2 = s0 + 32 * c + 16 * h + px;
          float v0 = 0.f, v1 = 0.f;
          ForEachWindowRow3(g, t0, t1 + j, [&](int r, int off) {
#pragma unroll
            for (int f2 = 0; f2 < 3; ++f2) {
              const int q = t2 + g.beta[2] + f2 * G2;
              if (static_cast<unsigned>(q) >= static_cast<unsigned>(g.lim[2])) continue;
              float xv[4];
              LdGlobalAcc<T, float, 4>(sb + off + 4 * static_cast<int64_t>(q), xv);
              const T* wf = w + static_cast<int64_t>(r * 3 + f2) * g.wF + 2 * half * g.wCo;
#pragma unroll
              for (int ci = 0; ci < 4; ++ci) {
                v0 = fmaf(xv[ci], ToAcc(wf[ci * g.wCi]), v0);
                v1 = fmaf(xv[ci], ToAcc(wf[ci * g.wCi + g.wCo]), v1);
              }
            }
          });
          acc[j][c][2 * h] = v0, acc[j][c][2 * h + 1] = v1;
        }
  }
  const float b0 = g.has_bias ? ToAcc(bias[2 * half]) : 0.f, b1 = g.has_bias ? ToAcc(bias[2 * half + 1]) : 0.f;
  WithActivation(g.act, [&](auto act_c) {
    constexpr int kAct = decltype(act_c)::value;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (t1 + j >= g.tsp[1]) break;
      TO* drow = dst + n * g.dN + (t0 * g.dS[0] + (t1 + j) * g.dS[1]) + 2 * half;
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int t2 = s0 + 32 * c + 16 * h + px;
          if (t2 < g.tsp[2]) {
            StorePair(drow + 4 * t2, Activate(acc[j][c][2 * h] + b0, kAct),
                      Activate(acc[j][c][2 * h + 1] + b1, kAct));
          }
        }
    }
  });
}

template <class T, class TO, int G2, int NC, int R>
cudaError_t LaunchPixelMma(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst,
                           cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(CeilDiv(g.tsp[2], 32 * NC)),
                  static_cast<unsigned>(CeilDiv(g.tsp[1], kPxRows * R)), static_cast<unsigned>(g.n * g.tsp[0]));
  ScPixelMmaKernel<T, TO, G2, NC, R><<<grid, kPxThreads, 0, s>>>(g, static_cast<const T*>(src),
                                                                 static_cast<const T*>(w),
                                                                 static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_pixel_mma {

std::string Applies(const Problem& pr) {
  using namespace cuda::small_channel;
  if (std::string e = FamilyError(pr); !e.empty()) return e;
  if (!Is16Bit(pr.in)) return "it takes 16-bit operands";
  const ScArgs g = MakeScArgs(pr);
  if (std::string e = PixelError(g, pr.in, pr.out); !e.empty()) return e;
  if (!PixelK3(g)) return "it takes 3x3 windows at unit column stride and no column dilation";
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  const GatherBuffers o = GatherBuffersOf(pr, b);
  // Pixels of 4 channels: 4-byte channel pairs of 8-byte vectors.
  if (!cuda::Aligned16(o.src) || !cuda::Aligned16(o.dst)) return cudaErrorMisalignedAddress;
  const ScArgs g = MakeScArgs(pr);
  if (g.n * g.tsp[0] * g.tsp[1] * g.tsp[2] <= 0) return cudaSuccess;
  // The row sweep where destination rows share source rows (unit row stride, undilated rows).
  const bool sweep = g.alpha[1] == 1 && g.gamma[1] == g.gamma[2];
  return cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto to) -> cudaError_t {
    using T = decltype(t);
    using TO = decltype(to);
    if constexpr (sizeof(T) == 2) {
      if (sweep) {
        return g.gamma[2] > 0 ? LaunchPixelMma<T, TO, 1, kMmaChunks, kMmaRows>(g, o.src, o.w, o.bias, o.dst, s)
                              : LaunchPixelMma<T, TO, -1, kMmaChunks, kMmaRows>(g, o.src, o.w, o.bias, o.dst, s);
      }
      return g.gamma[2] > 0 ? LaunchPixelMma<T, TO, 1, kMmaChunks, 1>(g, o.src, o.w, o.bias, o.dst, s)
                            : LaunchPixelMma<T, TO, -1, kMmaChunks, 1>(g, o.src, o.w, o.bias, o.dst, s);
    } else {
      return cudaErrorInvalidValue;  // 16-bit only (Applies)
    }
  });
}

}  // namespace variants::small_pixel_mma
}  // namespace jaxconv
