// small.rowseg: the forward with a warp-uniform filter (first layers, the tutorial's 1 -> 16): k % 8 == 0, a
// (W taps, W stride) of (3, 1), (5, 1), (3, 2) or (7, 2), no W-dilation and no lhs dilation along W, f32/16-bit
// data; any H and D geometry.
// A thread computes P (8, 4 or 2) consecutive output pixels of one row, 8 output channels each (acc[P][8]). Per
// window row and input channel it loads the row segment its P pixels read, (P - 1) * S + T values (stride S,
// T taps along W, no W-dilation), once, and reuses it over the T taps: per (row, channel) P*S + T - S source loads and T
// filter vectors feed T * P * 8 FMAs. The 32 lanes of a warp take consecutive pixel groups (possibly spanning
// rows: narrow images keep every lane busy) and the same 8 channels, so every filter vector is one
// warp-uniform read of the block's copy of the filter in shared memory. fwd only (the filter's output channel is
// its contiguous dim), k % 8 == 0.
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

constexpr int kRsThreads = 128;
constexpr int kRsKg = 8;  // output channels per thread
// Whether the epilogue goes through shared memory: float32 outputs at P <= 2 pixels per thread (the small grids).
constexpr bool RsStagesOutput(int p, int out_bytes) { return p <= 2 && out_bytes == 4; }
template <class TO> constexpr bool RsStagesOutput(int p) { return RsStagesOutput(p, static_cast<int>(sizeof(TO))); }

template <class T, class TO, int P, int TW, int S>
__global__ void __launch_bounds__(kRsThreads) ScRowSegKernel(const ScArgs g, int64_t groups, int ncg, int64_t warps,
                                                              const T* __restrict__ src, const T* __restrict__ w,
                                                              const TO* __restrict__ bias, TO* __restrict__ dst) {
  using Acc = float;
  constexpr int KG = kRsKg;
  constexpr int SEG = (P - 1) * S + TW;
  // Window rows per batch: 5 (4 for 7-tap windows) at 2 pixels per thread, where the grid is too small to hide each
  // row's loads; larger P (larger grids) keep one row at a time and their registers (batches of rows spilled there).
  constexpr int RB = P > 2 ? 1 : SEG <= 6 ? 5 : 4;
  constexpr int OV = KG * sizeof(TO) >= 16 ? 16 / static_cast<int>(sizeof(TO)) : KG;  // outputs per store
  constexpr bool kStageOut = RsStagesOutput<TO>(P);
  // The whole filter as Acc in shared memory (<= 12288 elements: SmallChannelApplies), read as warp-uniform
  // broadcasts: from global memory the taps' filter vectors had been a third of the tutorial's stalls.
  extern __shared__ __align__(16) float wsm[];
  for (int e = threadIdx.x; e < g.ntaps * g.wF; e += kRsThreads) wsm[e] = ToAcc(w[e]);
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t pix_groups = g.n * g.tsp[0] * g.tsp[1] * ncg;
  const int64_t wstep = static_cast<int64_t>(gridDim.x) * (kRsThreads / 32);
  for (int64_t wi = static_cast<int64_t>(blockIdx.x) * (kRsThreads / 32) + threadIdx.x / 32; wi < warps; wi += wstep) {
    const int64_t pb = DivNN(wi, groups);
    const int kg = static_cast<int>(wi - pb * groups);
    int64_t rem = pb * 32 + lane, q;
    const bool lane_ok = rem < pix_groups;  // lanes past the last pixel group compute its pixels, store nothing
    if (!kStageOut && !lane_ok) continue;
    if (!lane_ok) rem = pix_groups - 1;
    q = DivNN(rem, ncg);
    const int t2 = static_cast<int>(rem - q * ncg) * P;
    rem = q;
    q = DivNN(rem, g.tsp[1]);
    const int t1 = static_cast<int>(rem - q * g.tsp[1]);
    rem = q;
    q = DivNN(rem, g.tsp[0]);
    const int t0 = static_cast<int>(rem - q * g.tsp[0]);
    const int64_t n = q;
    Acc acc[P][KG];
#pragma unroll
    for (int j = 0; j < P; ++j)
#pragma unroll
      for (int k = 0; k < KG; ++k) acc[j][k] = 0.f;
    const int c0 = t2 * S + g.beta[2];  // first source column of the segment
    const T* sbase = src + n * g.sN;
    const float* wk = wsm + kg * KG;
    // Window rows in batches of RB: the batch's segments are loaded first, one round trip for RB rows (row by
    // row, the tutorial's warps waited on each row's loads in turn), then per row its TW
    // filter vectors (warp-uniform) and the FMAs. A row outside the source is a zero segment, as columns are.
    for (int f0 = 0; f0 < g.taps[0]; ++f0) {
      const int q0 = TapIndex(t0 * g.alpha[0] + g.beta[0] + f0 * g.gamma[0], g.delta[0], g.lim[0]);
      if (q0 < 0) continue;
      const T* plane = sbase + q0 * g.sS[0];
      for (int f1b = 0; f1b < g.taps[1]; f1b += RB) {
#pragma unroll 1
        for (int ci = 0; ci < g.cin; ++ci) {
          Acc seg[RB][SEG];
#pragma unroll
          for (int rr = 0; rr < RB; ++rr) {
            const int f1 = f1b + rr;
            const int q1 =
                f1 < g.taps[1] ? TapIndex(t1 * g.alpha[1] + g.beta[1] + f1 * g.gamma[1], g.delta[1], g.lim[1]) : -1;
            const T* rowp = plane + max(q1, 0) * g.sS[1] + ci;
#pragma unroll
            for (int m = 0; m < SEG; ++m) {
              const int col = c0 + m;
              seg[rr][m] = (q1 >= 0 && col >= 0 && col < g.lim[2]) ? ToAcc(rowp[col * g.sS[2]]) : 0.f;
            }
          }
#pragma unroll
          for (int rr = 0; rr < RB; ++rr) {
            if (f1b + rr >= g.taps[1]) break;  // uniform over the warp
            const float* wrow = wk + (f0 * g.taps[1] + f1b + rr) * TW * g.wF + ci * g.wCi;
#pragma unroll
            for (int f2 = 0; f2 < TW; ++f2) {
              Acc wv[KG];
              LdN<KG>(wrow + f2 * g.wF, wv);  // 16-byte aligned: k % 8 == 0
#pragma unroll
              for (int j = 0; j < P; ++j)
#pragma unroll
                for (int k = 0; k < KG; ++k) acc[j][k] = fma(seg[rr][j * S + f2], wv[k], acc[j][k]);
            }
          }
        }
      }
    }
    TO* dbase = dst + n * g.dN + (t0 * g.dS[0] + t1 * g.dS[1]) + kg * KG;
    Acc bv[KG];
#pragma unroll
    for (int k = 0; k < KG; ++k) bv[k] = g.has_bias ? ToAcc(bias[kg * KG + k]) : 0.f;
    // Float32 outputs at P <= 2 (kStageOut) go through the warp's shared memory ([lane][j][k], 16-byte chunks),
    // then chunk c = 32 r + lane is written for lane c / (P * NV)'s pixel: 32 lanes cover 16 pixels' KG channels,
    // whole 32-byte sectors, where each lane's own pixels had put one 16-byte store in each of 32 lines (16-bit
    // outputs, one store per pixel already, were slower staged).
    constexpr int NV = KG / OV;
    uint4* ost = reinterpret_cast<uint4*>(wsm + g.ntaps * g.wF) + (threadIdx.x / 32) * 32 * P * NV;
    WithActivation(g.act, [&](auto act_c) {
#pragma unroll
      for (int j = 0; j < P; ++j) {
        if (!kStageOut && t2 + j >= g.tsp[2]) break;
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          Acc part[OV];
#pragma unroll
          for (int e = 0; e < OV; ++e) part[e] = Activate(acc[j][v * OV + e] + bv[v * OV + e], decltype(act_c)::value);
          if constexpr (kStageOut) {
            unsigned wd[4];
            PackWords<TO>(part, wd);
            ost[(lane * P + j) * NV + v] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
          } else {
            StGlobal<TO, Acc, OV>(dbase + (t2 + j) * g.dS[2] + v * OV, part);
          }
        }
      }
    });
    if constexpr (kStageOut) {
      __syncwarp();
      const int64_t pix = (dbase - dst) + static_cast<int64_t>(t2) * g.dS[2];
      const int nvalid = lane_ok ? min(P, g.tsp[2] - t2) : 0;
#pragma unroll
      for (int r = 0; r < P * NV; ++r) {
        const int c = 32 * r + lane, owner = c / (P * NV), j = (c / NV) % P, v = c % NV;
        const int64_t opix = __shfl_sync(0xffffffffu, pix, owner);
        const int onv = __shfl_sync(0xffffffffu, nvalid, owner);
        if (j < onv) *reinterpret_cast<uint4*>(dst + opix + static_cast<int64_t>(j) * g.dS[2] + v * OV) = ost[c];
      }
      __syncwarp();  // the next work item's stores into ost wait for these reads
    }
  }
}

// Pixels per thread: the most of 8, 4, 2 that gives at least kBusyWarps warps, else 2: small grids are latency
// bound (too few warps per SM to hide a thread's chain at 4 pixels). 8 only for rows of 16+ pixels (narrow rows would
// idle most of a thread's pixels).
int64_t RowSegWarps(const ScArgs& g, int pp) {
  return CeilDiv(g.n * g.tsp[0] * g.tsp[1] * CeilDiv(g.tsp[2], pp), 32) * (g.cout / kRsKg);
}
int RowSegPixels(const ScArgs& g) {
  return g.tsp[2] >= 16 && RowSegWarps(g, 8) >= kBusyWarps ? 8 : RowSegWarps(g, 4) >= kBusyWarps ? 4 : 2;
}

// Shared memory at pp pixels per thread: the filter (<= 48 KiB) and, for the staged epilogue, the block's outputs.
size_t RowSegSmem(const ScArgs& g, int pp, int out_bytes) {
  return static_cast<size_t>(g.ntaps) * static_cast<size_t>(g.wF) * sizeof(float) +
         (RsStagesOutput(pp, out_bytes) ? size_t{kRsThreads} * pp * kRsKg * out_bytes : 0);
}

template <class T, class TO, int TW, int S>
cudaError_t LaunchRowSeg(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst,
                         cudaStream_t s) {
  const int64_t groups = g.cout / kRsKg;
  const int pp = RowSegPixels(g);
  const int ncg = static_cast<int>(CeilDiv(g.tsp[2], pp));
  const int64_t warps = RowSegWarps(g, pp);
  if (warps <= 0) return cudaSuccess;
  // Every block stages the filter: at most the blocks resident at once, each looping over the warps' work.
  const size_t smem = RowSegSmem(g, pp, static_cast<int>(sizeof(TO)));
  auto run = [&](auto kern) {
    if (const cudaError_t e = AllowDynamicSmem(kern, smem); e != cudaSuccess) return e;
    int64_t resident = 0;
    if (const cudaError_t e = ResidentBlocks(kern, kRsThreads, smem, 1, &resident); e != cudaSuccess) return e;
    const unsigned blocks = GridX(std::min(CeilDiv(warps, kRsThreads / 32), resident));
    kern<<<blocks, kRsThreads, smem, s>>>(g, groups, ncg, warps, static_cast<const T*>(src), static_cast<const T*>(w),
                                          static_cast<const TO*>(bias), static_cast<TO*>(dst));
    return cudaGetLastError();
  };
  if (pp == 8) return run(ScRowSegKernel<T, TO, 8, TW, S>);
  if (pp == 4) return run(ScRowSegKernel<T, TO, 4, TW, S>);
  return run(ScRowSegKernel<T, TO, 2, TW, S>);
}

// The plan's conditions on the problem ("" when the kernel takes it).
std::string RowSegError(const Problem& pr) {
  const ScArgs g = MakeScArgs(pr);
  if (g.cout % kRsKg != 0) return "it takes k a multiple of 8";
  // channels-last pixels and filter rows (always, under the family's gate)
  if (g.wCo != 1 || g.sS[2] != g.cin || g.dS[2] != g.cout) return "it takes channels-last pixels";
  if (g.gamma[2] != 1 || g.delta[2] != 1) return "it takes no dilation along W";
  const int tw = g.taps[2], st = g.alpha[2];
  if (!((st == 1 && (tw == 3 || tw == 5)) || (st == 2 && (tw == 3 || tw == 7)))) {
    return "it takes 3 or 5 W taps at W stride 1, 3 or 7 at W stride 2";
  }
  const size_t smem = RowSegSmem(g, RowSegPixels(g), DTypeBytes(pr.out));
  if (smem > 48 * 1024 && static_cast<int64_t>(smem) > pr.dev.smem_optin) {
    return "its staged filter takes more shared memory than a block has";
  }
  return {};
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_rowseg {

std::string Applies(const Problem& pr) {
  if (std::string e = cuda::small_channel::FamilyError(pr); !e.empty()) return e;
  if (!cuda::IsF32AccPair(pr.in, pr.out)) return "it takes 16-bit or float32 operands";
  return cuda::small_channel::RowSegError(pr);
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  // 16-byte filter vectors and output stores.
  if (!cuda::Aligned16(b.b) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
  const ScArgs g = MakeScArgs(pr);
  const int tw = g.taps[2], st = g.alpha[2];
  return cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto to) -> cudaError_t {
    using T = decltype(t);
    using TO = decltype(to);
    if (st == 1 && tw == 3) return LaunchRowSeg<T, TO, 3, 1>(g, b.a, b.b, b.bias, b.out, s);
    if (st == 1) return LaunchRowSeg<T, TO, 5, 1>(g, b.a, b.b, b.bias, b.out, s);
    if (tw == 3) return LaunchRowSeg<T, TO, 3, 2>(g, b.a, b.b, b.bias, b.out, s);
    return LaunchRowSeg<T, TO, 7, 2>(g, b.a, b.b, b.bias, b.out, s);
  });
}

}  // namespace variants::small_rowseg
}  // namespace jaxconv
