// Small-channel convolution (algorithm 4): channels-last, groups == batch_groups == 1, 1 <= c <= 16,
// 1 <= k <= 64, win taps * c * k <= 12288 (SmallChannelApplies). Built for few channels and large spatial extents,
// where the direct kernel's 64-wide channel tiles leave almost every thread idle.
//
// fwd and dgrad are one gather kernel, "dst[n, t, co] = sum_{f, ci} src[n, q(t, f), ci] * wt[f, ci, co]" with
// q = t*alpha + beta + f*gamma per dim, valid iff q >= 0, q % delta == 0, q / delta < lim (as depthwise.cu):
//   fwd:   t = o, src = x (ci < c), dst = y (co < k), alpha = stride, beta = -pad_lo, gamma = rhs_dil,
//          delta = lhs_dil, lim = in, wt[f, ci, co] = w[f, ci, co]
//   dgrad: t = i, src = dy (ci < k), dst = dx (co < c), alpha = lhs_dil, beta = pad_lo, gamma = -rhs_dil,
//          delta = stride, lim = out, wt[f, kk, c] = w[f, c, kk]
// The filter is staged once per block in shared memory as Acc, output channels padded to CO (a compile-time
// bucket 1/4/16/64, zero-filled). A thread owns P consecutive destination pixels along the last spatial dim and
// all CO channels in registers (acc[P][CO]); warps cover consecutive pixels, so source reads are coalesced and
// weight reads are shared-memory broadcasts; for CO = 64 four consecutive threads split the channels (16 each,
// P = 4 pixels). Fused bias + activation epilogue (fwd). Unit stride along H and W with few channels takes the
// stencil kernel instead (shared-memory tile with halo, register reuse along H; see "stencil fast path"). The
// forward with k % 8 == 0 and 3/5 W taps at W stride 1 or 3/7 at stride 2 (first layers, the 1 -> 16 tutorial
// layer) takes the row-segment kernel before both (no shared memory; see "row-segment kernel"). 4 -> 4 at delta 1
// takes the pixel kernel before the stencil (no staging; see "pixel kernels"; 16-bit 3x3 windows on tensor cores).
//
// wgrad: dw[f, ci, kk] = sum_{n, o} x[n, i(o, f), ci] * dy[n, o, kk]. The (tap, k) space is cut into slices of
// TF taps x KB output channels (all c, padded to CB); a block owns one slice and one chunk of consecutive
// positions; each thread strides over the chunk's positions keeping TF*CB*KB (<= 64) partial sums in registers,
// then the block reduces them in a fixed order (warp shuffles, then the 8 warps in order) and writes the slice of
// its chunk's partial vector to scratch[chunk][welems]. A second kernel adds the chunks per element in a fixed
// tree order. No atomics: bitwise deterministic. chunks * slices ~ 4 x SMs blocks. Unit stride, at most 2
// spatial dims, C and K of 1 or multiples of 4, non-f64 take the tiled wgrad instead (spatial tiles staged in
// shared memory, no per-tap index arithmetic; see "tiled filter gradient"); 4 -> 4 without lhs dilation takes the
// pixel filter gradient before both (16-bit data with at most 4 x 4 taps per window plane at unit row stride: on
// tensor cores).
#include <algorithm>

#include "kernels/shared/common.cuh"
#include "kernels/shared/mma.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kSmemMax = 96 * 1024;  // opt-in (sm_80: 163 KiB, sm_86/89: 99 KiB, sm_90: 227 KiB)

struct ScArgs {
  int64_t n, sN, dN;  // batch; batch strides of source and destination
  int64_t gw, total;  // pixel groups along the last dim; n * tsp0 * tsp1 * gw
  // Per-image coordinates and offsets are 32-bit (SmallChannelApplies bounds them).
  int tsp[3], taps[3];
  int alpha[3], beta[3], gamma[3], delta[3], lim[3];
  int sS[3], dS[3];    // source / destination spatial strides (channel stride 1)
  int wF, wCi, wCo;    // w element offset of (f, ci, co)
  int cin, cout, ntaps, unit, act, has_bias;
};

// Non-negative q: q / d when q % d == 0 and the quotient is < lim, else -1.
__device__ __forceinline__ int TapIndex(int q, int d, int lim) {
  if (q < 0) return -1;
  if (d != 1) {
    const int t = static_cast<int>(static_cast<unsigned>(q) / static_cast<unsigned>(d));
    if (t * d != q) return -1;
    q = t;
  }
  return q < lim ? q : -1;
}

// N consecutive values from 16-byte aligned shared memory (16-byte vectors when N allows).
template <int N> __device__ __forceinline__ void LdN(const float* p, float* o) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 v = reinterpret_cast<const float4*>(p)[i];
      o[4 * i] = v.x; o[4 * i + 1] = v.y; o[4 * i + 2] = v.z; o[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = p[i];
  }
}
template <int N> __device__ __forceinline__ void LdN(const double* p, double* o) {
  if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const double2 v = reinterpret_cast<const double2*>(p)[i];
      o[2 * i] = v.x; o[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = p[i];
  }
}
// CS > 1 splits the CO channels over CS consecutive threads (CO / CS each, weights of the chunk reused over the
// P pixels: 16 channels x 4 pixels per thread for CO = 64 gives 64 FMAs per 4 + 4 loads).
template <class T, class TO, int CO, int P, int CS>
__global__ void __launch_bounds__(kThreads, (CO >= 64 || sizeof(T) == 8) ? 1 : 2) ScGatherKernel(const ScArgs g, const T* __restrict__ src,
                                                           const T* __restrict__ w, const TO* __restrict__ bias,
                                                           TO* __restrict__ dst) {
  using Acc = typename AccOf<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* wt = reinterpret_cast<Acc*>(smem_raw);
  const int cin = g.cin;
  {
    const int wn = g.ntaps * cin * CO;
    const int nt = static_cast<int>(blockDim.x);
    for (int e0 = static_cast<int>(threadIdx.x); e0 < wn; e0 += 8 * nt) {  // 8 loads in flight per thread
      Acc v[8];
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        const int e = e0 + b * nt;
        const int co = e % CO, r = e / CO;
        const int ci = r % cin, f = r / cin;
        v[b] = (e < wn && co < g.cout) ? ToAcc(w[static_cast<int64_t>(f) * g.wF + ci * g.wCi + co * g.wCo]) : Acc(0);
      }
#pragma unroll
      for (int b = 0; b < 8; ++b)
        if (e0 + b * nt < wn) wt[e0 + b * nt] = v[b];
    }
  }
  __syncthreads();
  constexpr int COT = CO / CS;  // channels per thread
  const int step2 = g.alpha[2] * g.sS[2];  // source offset between consecutive pixels of a group
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < g.total; e += step) {
    int64_t rem = e;
    int gq, t1, t0, cc = 0;
    if constexpr (CS > 1) { const int64_t q_ = rem / CS; cc = static_cast<int>(rem - q_ * CS); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.gw); gq = static_cast<int>(rem - q_ * g.gw); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.tsp[1]); t1 = static_cast<int>(rem - q_ * g.tsp[1]); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.tsp[0]); t0 = static_cast<int>(rem - q_ * g.tsp[0]); rem = q_; }
    const int64_t n = rem;
    const int t2 = gq * P;
    Acc acc[P][COT];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int co = 0; co < COT; ++co) acc[p][co] = Acc(0);
    const T* sbase = src + n * g.sN;
    int f = 0;
    for (int f0 = 0; f0 < g.taps[0]; ++f0) {
      const int q0 = TapIndex(t0 * g.alpha[0] + g.beta[0] + f0 * g.gamma[0], g.delta[0], g.lim[0]);
      if (q0 < 0) { f += g.taps[1] * g.taps[2]; continue; }
      for (int f1 = 0; f1 < g.taps[1]; ++f1) {
        const int q1 = TapIndex(t1 * g.alpha[1] + g.beta[1] + f1 * g.gamma[1], g.delta[1], g.lim[1]);
        if (q1 < 0) { f += g.taps[2]; continue; }
        const T* rowp = sbase + (q0 * g.sS[0] + q1 * g.sS[1]);
        for (int f2 = 0; f2 < g.taps[2]; ++f2, ++f) {
          const Acc* wrow = wt + f * cin * CO + cc * COT;
          const int qb = t2 * g.alpha[2] + g.beta[2] + f2 * g.gamma[2];
          if (g.unit && qb >= 0 && qb + (P - 1) * g.alpha[2] < g.lim[2]) {
            // interior: all P source pixels valid, one check for the group
            const T* xp = rowp + qb * g.sS[2];
#pragma unroll 2
            for (int ci = 0; ci < cin; ++ci) {
              if constexpr (COT <= 16) {
                Acc wv[COT];
                LdN<COT>(wrow + ci * CO, wv);  // 16-byte aligned: every offset is a multiple of COT
#pragma unroll
                for (int p = 0; p < P; ++p) {
                  const Acc v = ToAcc(xp[p * step2 + ci]);
#pragma unroll
                  for (int co = 0; co < COT; ++co) acc[p][co] = fma(v, wv[co], acc[p][co]);
                }
              } else {
#pragma unroll
                for (int p = 0; p < P; ++p) {
                  const Acc v = ToAcc(xp[p * step2 + ci]);
#pragma unroll
                  for (int co = 0; co < COT; ++co) acc[p][co] = fma(v, wrow[ci * CO + co], acc[p][co]);
                }
              }
            }
          } else {
#pragma unroll
            for (int p = 0; p < P; ++p) {
              const int q2 = TapIndex(qb + p * g.alpha[2], g.delta[2], g.lim[2]);
              if (q2 >= 0) {
                const T* xp = rowp + q2 * g.sS[2];
#pragma unroll 2
                for (int ci = 0; ci < cin; ++ci) {
                  const Acc v = ToAcc(xp[ci]);
#pragma unroll
                  for (int co = 0; co < COT; ++co) acc[p][co] = fma(v, wrow[ci * CO + co], acc[p][co]);
                }
              }
            }
          }
        }
      }
    }
    TO* dbase = dst + n * g.dN + (t0 * g.dS[0] + t1 * g.dS[1]);
    WithActivation(g.act, [&](auto act_c) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (t2 + p >= g.tsp[2]) break;
        TO* dp = dbase + (t2 + p) * g.dS[2];
#pragma unroll
        for (int co = 0; co < COT; ++co) {
          const int cg = cc * COT + co;
          if (cg < g.cout) {
            Acc v = acc[p][co];
            if (g.has_bias) v += ToAcc(bias[cg]);
            dp[cg] = FromAcc<TO>(Activate(v, decltype(act_c)::value));
          }
        }
      }
    });
  }
}

template <class T, class TO, int CO, int P, int CS>
cudaError_t LaunchGather(const ScArgs& g0, const void* src, const void* w, const void* bias, void* dst,
                         cudaStream_t s, bool* launched) {
  *launched = false;
  ScArgs g = g0;
  const int64_t bytes = static_cast<int64_t>(g.ntaps) * g.cin * CO * static_cast<int64_t>(sizeof(typename AccOf<T>::type));
  if (bytes > kSmemMax) return cudaSuccess;  // caller falls back to the direct kernel
  auto kern = ScGatherKernel<T, TO, CO, P, CS>;
  if (AllowDynamicSmem(kern, static_cast<size_t>(bytes)) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it, fall back
    return cudaSuccess;
  }
  g.gw = CeilDiv(g.tsp[2], P);
  g.total = g.n * g.tsp[0] * g.tsp[1] * g.gw * CS;
  *launched = true;
  if (g.total <= 0) return cudaSuccess;
  // small problems: 64-thread blocks spread the work over 4x more multiprocessors (latency bound there), unless
  // the per-block filter staging (wn / threads loads per thread) would take over
  const int64_t wn = static_cast<int64_t>(g.ntaps) * g.cin * CO;
  const int threads = (g.total < 2 * kPlanSms * kThreads && wn <= 32 * 64) ? 64 : kThreads;
  kern<<<GridX(CeilDiv(g.total, threads)), threads, bytes, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                                                static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

template <class T, class TO>
cudaError_t GatherByCo(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst, cudaStream_t s,
                       bool* launched) {
  if (g.cout <= 1) return LaunchGather<T, TO, 1, 4, 1>(g, src, w, bias, dst, s, launched);
  if (g.cout <= 4) return LaunchGather<T, TO, 4, 4, 1>(g, src, w, bias, dst, s, launched);
  if (g.cout <= 16) return LaunchGather<T, TO, 16, 2, 1>(g, src, w, bias, dst, s, launched);
  return LaunchGather<T, TO, 64, 4, 4>(g, src, w, bias, dst, s, launched);
}

cudaError_t RunGather(const ScArgs& g, DType in, DType out, const void* src, const void* w, const void* bias, void* dst,
                      cudaStream_t s, bool* launched) {
#define JAXCONV_BODY(T, TO) return GatherByCo<T, TO>(g, src, w, bias, dst, s, launched)
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

// ---- row-segment kernel: forward with a warp-uniform filter (first layers, the tutorial's 1 -> 16) ----
// A thread computes P (8, 4 or 2) consecutive output pixels of one row, 8 output channels each (acc[P][8]). Per
// window row and input channel it loads the row segment its P pixels read, (P - 1) * S + T values (stride S,
// T taps along W, no W-dilation), once, and reuses it over the T taps: per (row, channel) P*S + T - S source loads and T
// filter vectors feed T * P * 8 FMAs. The 32 lanes of a warp take consecutive pixel groups (possibly spanning
// rows: narrow images keep every lane busy) and the same 8 channels, so every filter vector is one
// warp-uniform read of the block's copy of the filter in shared memory. fwd only (the filter's output channel is
// its contiguous dim), k % 8 == 0.
constexpr int kRsThreads = 128;
constexpr int kRsKg = 8;  // output channels per thread
// Whether the epilogue goes through shared memory: float32 outputs at P <= 2 pixels per thread (the small grids).
template <class TO> constexpr bool RsStagesOutput(int p) { return p <= 2 && sizeof(TO) == 4; }

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
  // broadcasts: from global memory the taps' filter vectors had been a third of the tutorial's stalls (ncu, run 144).
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
    // row, the tutorial's warps waited on each row's loads in turn: ncu, DEVICE_RUNS 139), then per row its TW
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
    // whole 32-byte sectors, where each lane's own pixels had put one 16-byte store in each of 32 lines (tutorial f32:
    // 8.1 -> 6.0 µs, run 187; 16-bit outputs, one store per pixel already, were 2 % slower staged).
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
// bound (run 70's profile of the 28x28 tutorial at 4 pixels: 6 warps per SM, 9.5 cycles per instruction). 8 only
// for rows of 16+ pixels (narrow rows would idle most of a thread's pixels).

template <class T, class TO, int TW, int S>
cudaError_t LaunchRowSeg(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst,
                         cudaStream_t s) {
  const int64_t rows = g.n * g.tsp[0] * g.tsp[1], groups = g.cout / kRsKg;
  auto warps_of = [&](int pp) { return CeilDiv(rows * CeilDiv(g.tsp[2], pp), 32) * groups; };
  const int pp = g.tsp[2] >= 16 && warps_of(8) >= kBusyWarps ? 8 : warps_of(4) >= kBusyWarps ? 4 : 2;
  const int ncg = static_cast<int>(CeilDiv(g.tsp[2], pp));
  const int64_t warps = warps_of(pp);
  if (warps <= 0) return cudaSuccess;
  // Every block stages the filter: at most the blocks resident at once, each looping over the warps' work.
  // The filter (<= 48 KiB) and, for the staged epilogue, the block's outputs.
  const size_t smem = static_cast<size_t>(g.ntaps) * static_cast<size_t>(g.wF) * sizeof(float) +
                      (RsStagesOutput<TO>(pp) ? size_t{kRsThreads} * pp * kRsKg * sizeof(TO) : 0);
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

// Taken for the forward with k % 8 == 0, a (W taps, W stride) of (3, 1), (5, 1), (3, 2) or (7, 2), no W-dilation
// and no lhs dilation along W, f32/16-bit data; any H and D geometry.
cudaError_t RunRowSeg(const ScArgs& g, DType in, DType out, const void* src, const void* w, const void* bias, void* dst,
                      cudaStream_t s, bool* launched) {
  *launched = false;
  if (in == DType::kF64 || g.cout % kRsKg != 0 || g.wCo != 1 || g.sS[2] != g.cin || g.dS[2] != g.cout) {
    return cudaSuccess;
  }
  if (g.gamma[2] != 1 || g.delta[2] != 1 || !Aligned16(w) || !Aligned16(dst)) return cudaSuccess;
  const int tw = g.taps[2], st = g.alpha[2];
  if (!((st == 1 && (tw == 3 || tw == 5)) || (st == 2 && (tw == 3 || tw == 7)))) return cudaSuccess;
  *launched = true;
  return WithF32AccTypes(in, out, [&](auto t, auto to) -> cudaError_t {
    using T = decltype(t);
    using TO = decltype(to);
    if (st == 1 && tw == 3) return LaunchRowSeg<T, TO, 3, 1>(g, src, w, bias, dst, s);
    if (st == 1) return LaunchRowSeg<T, TO, 5, 1>(g, src, w, bias, dst, s);
    if (tw == 3) return LaunchRowSeg<T, TO, 3, 2>(g, src, w, bias, dst, s);
    return LaunchRowSeg<T, TO, 7, 2>(g, src, w, bias, dst, s);
  });
}

// ---- stencil fast path: fwd and dgrad with alpha == delta == 1 along dims 1 and 2 (unit stride, no lhs
// dilation; dgrad of such a conv is the same gather with gamma = -rhs_dil) ----
// A block computes a tile of TH = 8R rows x TW = 32P columns of one (n, t0) plane, all cout channels. For each
// valid tap f0 of dim 0 (general, TapIndex) it stages the source tile plus halo (sr = TH + span1 rows,
// sc = TW + span2 cols, span = (taps - 1) * |gamma|) in shared memory as Acc, zeros outside the source, so the
// compute loop has no bounds checks. Lane l owns columns l + 32j (j < P): consecutive lanes read consecutive
// shared words (no bank conflicts). Warp ty owns R output rows spaced g1 = |gamma1| apart, so staged row ii of
// the warp feeds its output row r through tap u = ii - r: each staged value is read once per thread per
// column tap and reused by up to taps1 output rows (R + taps1 - 1 row reads for R rows, not R * taps1).
// Filter in shared memory, broadcast reads, CO outputs per read input value.
// Staging reads aligned 16-byte chunks (kStageB in flight per thread; element-wise only at row ends); cin == 1
// stores them as is into rows shifted by the row's misalignment (shs[row]), cin > 1 scatters the elements to
// their padded (column, channel) slots.
// Taken when H-dilation is 1/2/4/8, there are >= 8 output rows and columns, (cin, cout) fits a bucket of
// StencilByCh and the staged tile fits kStencilSmemMax (RunStencil, LaunchStencil); else the gather kernel.
constexpr int64_t kStencilSmemMax = 110 * 1024;  // 2 blocks per SM on sm_90; larger tiles use the gather kernel
// Staging: 16-byte chunks in flight per thread; 6 x 256 covers a 1->1 bf16 tile (64 + 16 rows x 18 chunks) in
// one round trip within the 80-register budget of 3 blocks per SM (sm_80 spills at 6 and 4: 3 there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kStageB = 3;
#else
constexpr int kStageB = 6;
#endif

struct StArgs {
  int64_t n, sN, dN, tiles;  // tiles = n * tsp0 * th * tw
  int tsp[3], taps[3];
  int alpha0, beta0, gamma0, delta0, lim0;  // dim 0, general
  int m1, m2;       // source row / col of staged row / col 0, relative to the tile's first output row / col
  int g1, gamma1, g2, gamma2;  // g1 = |gamma1| in {1, 2, 4, 8}; g2 = |gamma2|
  int lim1, lim2;
  int sS0, sS1, dS0, dS1;  // channels-last: the pixel stride along dim 2 is the channel count
  int sr, sc, pitch;       // staged rows, cols; Acc elements per staged row
  int th, tw;              // tiles along dims 1 and 2
  int wF, wCi, wCo;
  int cin, cout, ntaps, act, has_bias;
};

// Acc elements per staged pixel: 16 channels padded to 80 bytes so that 16-byte reads of 8 consecutive lanes
// fall in distinct bank groups.
template <int CI> constexpr int StPitch() { return CI == 16 ? 20 : CI; }

template <int N> __device__ __forceinline__ void StN(float* p, const float* v) {
  static_assert(N % 4 == 0, "16-byte stores");
#pragma unroll
  for (int i = 0; i < N / 4; ++i) reinterpret_cast<float4*>(p)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}
template <int N> __device__ __forceinline__ void StN(double* p, const double* v) {
  static_assert(N % 2 == 0, "16-byte stores");
#pragma unroll
  for (int i = 0; i < N / 2; ++i) reinterpret_cast<double2*>(p)[i] = make_double2(v[2 * i], v[2 * i + 1]);
}

// The 16 bytes of u as 16 / sizeof(T) values of T, converted (element 0 in the low bytes of u.x).
__device__ __forceinline__ void Unpack16(uint4 u, float* o, float) {
  o[0] = __uint_as_float(u.x); o[1] = __uint_as_float(u.y); o[2] = __uint_as_float(u.z); o[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void Unpack16(uint4 u, double* o, double) {
  o[0] = __hiloint2double(static_cast<int>(u.y), static_cast<int>(u.x));
  o[1] = __hiloint2double(static_cast<int>(u.w), static_cast<int>(u.z));
}
__device__ __forceinline__ void Unpack16(uint4 u, float* o, __nv_bfloat16) {
  const unsigned wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) { o[2 * i] = __uint_as_float(wd[i] << 16); o[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u); }
}
__device__ __forceinline__ void Unpack16(uint4 u, float* o, __half) {
  const unsigned wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(wd[i] & 0xffffu)));
    o[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(wd[i] >> 16)));
  }
}

__device__ __forceinline__ unsigned long long Bits(double v) { return static_cast<unsigned long long>(__double_as_longlong(v)); }
__device__ __forceinline__ unsigned Bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned Bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned Bits(__half v) { return __half_as_ushort(v); }

// The 16-byte chunk rowp[eb, eb + 16 / sizeof(T)) element by element, zero bits (+0) where !rv or the element is
// outside [0, rowlen): a row's edges, where the vector load would leave the row or the buffer.
template <class T>
__device__ __forceinline__ uint4 LoadEdge16(const T* rowp, int eb, int rowlen, bool rv) {
  unsigned wd[4];
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = eb + 2 * i;
      const unsigned lo = (rv && e >= 0 && e < rowlen) ? Bits(rowp[e]) : 0u;
      const unsigned hi = (rv && e + 1 >= 0 && e + 1 < rowlen) ? Bits(rowp[e + 1]) : 0u;
      wd[i] = lo | (hi << 16);
    }
  } else if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = eb + i;
      wd[i] = (rv && e >= 0 && e < rowlen) ? Bits(rowp[e]) : 0u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = eb + i;
      const unsigned long long b = (rv && e >= 0 && e < rowlen) ? Bits(rowp[e]) : 0ull;
      wd[2 * i] = static_cast<unsigned>(b);
      wd[2 * i + 1] = static_cast<unsigned>(b >> 32);
    }
  }
  return make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

template <class T, class TO, int CI, int CO, int R, int P>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 8 ? 1 : 3) ScStencilKernel(const StArgs g, const T* __restrict__ src,
                                                              const T* __restrict__ w, const TO* __restrict__ bias,
                                                              TO* __restrict__ dst) {
  using Acc = typename AccOf<T>::type;
  constexpr int CP = StPitch<CI>(), TH = 8 * R, TW = 32 * P, CC = CI * CO;
  constexpr int V = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte global load
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* wt = reinterpret_cast<Acc*>(smem_raw);  // [ntaps][CI][CO], zero-padded
  const int wn = g.ntaps * CC;
  Acc* tile = wt + ((wn + 3) & ~3);  // 16-byte aligned
  int* shs = reinterpret_cast<int*>(tile + g.sr * g.pitch);  // cin == 1: per staged row, column 0's position
  const int tid = threadIdx.x, lane = tid & 31, ty = tid >> 5;
  const int cin = g.cin;
  for (int e = tid; e < wn; e += kThreads) {
    const int co = e % CO, r = e / CO;
    const int ci = r % CI, f = r / CI;
    wt[e] = (co < g.cout && ci < cin) ? ToAcc(w[static_cast<int64_t>(f) * g.wF + ci * g.wCi + co * g.wCo]) : Acc(0);
  }
  if (CI > 1 && cin < CI) {  // padded channels: zero once, staging never writes them
    for (int pix = tid; pix < g.sr * g.sc; pix += kThreads)
      for (int ch = cin; ch < CI; ++ch) tile[(pix / g.sc) * g.pitch + (pix % g.sc) * CP + ch] = Acc(0);
  }
  const int g1 = g.g1, taps1 = g.taps[1], taps2 = g.taps[2];
  const int base_s = (ty / g1) * (R * g1) + (ty % g1);  // g1 divides 8: 8/g1 groups of g1 warps cover R*g1 rows
  const int rowlen = g.lim2 * cin;  // valid source elements per row
  for (int64_t tidx = blockIdx.x; tidx < g.tiles; tidx += gridDim.x) {
    int64_t rem = tidx;
    int tx, tyt, t0;
    { const int64_t q_ = DivNN(rem, g.tw); tx = static_cast<int>(rem - q_ * g.tw); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.th); tyt = static_cast<int>(rem - q_ * g.th); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.tsp[0]); t0 = static_cast<int>(rem - q_ * g.tsp[0]); rem = q_; }
    const int64_t n = rem;
    const int r0 = tyt * TH, c0 = tx * TW;
    const int a = (c0 + g.m2) * cin;  // source element (relative to a row's start) of staged column 0
    Acc acc[R][P][CO];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < P; ++j)
#pragma unroll
        for (int co = 0; co < CO; ++co) acc[r][j][co] = Acc(0);
    for (int f0 = 0; f0 < g.taps[0]; ++f0) {
      const int q0 = TapIndex(t0 * g.alpha0 + g.beta0 + f0 * g.gamma0, g.delta0, g.lim0);
      if (q0 < 0) continue;  // uniform over the block
      const T* plane = src + n * g.sN + q0 * g.sS0;
      __syncthreads();  // the previous stage's reads are done (and the filter is visible)
      {
        // Staged row s holds source elements [a, a + seg) of source row r0 + m1 + s (zero outside the source),
        // read as aligned 16-byte chunks: chunk k of the row covers [a - sh + kV, a - sh + (k + 1)V), sh = the
        // row's misalignment. cin == 1: the chunk goes to the row as is, shifted by sh (shs[s]); cin > 1: each
        // element to its (column, channel) slot.
        const int seg = g.sc * cin;
        const int nchm = (seg + 2 * V - 2) / V;  // chunks per row covering seg elements at any alignment
        const int tot = g.sr * nchm;
        // rowp = the source row (row 0 of the plane when invalid); eb = the chunk's first element relative to it
        auto locate = [&](int idx, int& s, int& k, bool& rv, const T*& rowp, int& sh, int& eb) {
          s = idx / nchm;
          k = idx - s * nchm;
          const int q1 = r0 + g.m1 + s;
          rv = static_cast<unsigned>(q1) < static_cast<unsigned>(g.lim1);
          rowp = plane + (rv ? q1 : 0) * g.sS1;
          const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(rowp) / sizeof(T)) & (V - 1));
          sh = (a + mis) & (V - 1);
          eb = a - sh + k * V;
        };
        for (int base = tid; base < tot; base += kStageB * kThreads) {
          uint4 raw[kStageB];  // packed source bits: 4 registers per chunk whatever T
          unsigned edge = 0;   // chunks that straddle a row end: loaded element-wise after the batch
#pragma unroll
          for (int b = 0; b < kStageB; ++b) {
            const int idx = base + b * kThreads;
            raw[b] = make_uint4(0u, 0u, 0u, 0u);
            if (idx < tot) {
              int s, k, sh, eb;
              bool rv;
              const T* rowp;
              locate(idx, s, k, rv, rowp, sh, eb);
              if (rv && eb >= 0 && eb + V <= rowlen) {
                raw[b] = __ldg(reinterpret_cast<const uint4*>(rowp + eb));
              } else if (rv) {
                edge |= 1u << b;
              }
            }
          }
#pragma unroll
          for (int b = 0; b < kStageB; ++b) {
            const int idx = base + b * kThreads;
            if (idx < tot) {
              int s, k, sh, eb;
              bool rv;
              const T* rowp;
              locate(idx, s, k, rv, rowp, sh, eb);
              if (edge & (1u << b)) raw[b] = LoadEdge16(rowp, eb, rowlen, rv);
              Acc v[V];
              Unpack16(raw[b], v, T());
              if constexpr (CI == 1) {
                if (k == 0) shs[s] = sh;
                StN<V>(tile + s * g.pitch + k * V, v);
              } else {
                Acc* srow = tile + s * g.pitch;
#pragma unroll
                for (int i = 0; i < V; ++i) {
                  const int rel = eb - a + i;  // element offset from staged column 0
                  if (rel >= 0 && rel < seg) {
                    const int col = cin == CI ? rel / CI : rel / cin;
                    srow[col * CP + (rel - col * cin)] = v[i];
                  }
                }
              }
            }
          }
        }
      }
      __syncthreads();
      const Acc* wf0 = wt + f0 * taps1 * taps2 * CC;
      for (int ii = 0; ii < R + taps1 - 1; ++ii) {
        const int srow = base_s + ii * g1;
        const Acc* xrow = tile + srow * g.pitch + lane * CP + (CI == 1 ? shs[srow] : 0);
        for (int f2 = 0; f2 < taps2; ++f2) {
          const int cofs = (g.gamma2 > 0 ? f2 : taps2 - 1 - f2) * g.g2;
          Acc xv[P][CI];
#pragma unroll
          for (int j = 0; j < P; ++j) LdN<CI>(xrow + (32 * j + cofs) * CP, xv[j]);
          const Acc* wrow = wf0 + f2 * CC;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int u = ii - r;
            if (static_cast<unsigned>(u) < static_cast<unsigned>(taps1)) {  // uniform over the warp
              const int f1 = g.gamma1 > 0 ? u : taps1 - 1 - u;
              Acc wv[CC];
              LdN<CC>(wrow + f1 * taps2 * CC, wv);
#pragma unroll
              for (int j = 0; j < P; ++j)
#pragma unroll
                for (int ci = 0; ci < CI; ++ci)
#pragma unroll
                  for (int co = 0; co < CO; ++co) acc[r][j][co] = fma(xv[j][ci], wv[ci * CO + co], acc[r][j][co]);
            }
          }
        }
      }
    }
    TO* dplane = dst + n * g.dN + t0 * g.dS0;
    WithActivation(g.act, [&](auto act_c) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int t1 = r0 + base_s + r * g1;
        if (t1 >= g.tsp[1]) continue;
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const int t2 = c0 + lane + 32 * j;
          if (t2 >= g.tsp[2]) continue;
          TO* dp = dplane + (t1 * g.dS1 + t2 * g.cout);
#pragma unroll
          for (int co = 0; co < CO; ++co) {
            if (co < g.cout) {
              Acc v = acc[r][j][co];
              if (g.has_bias) v += ToAcc(bias[co]);
              dp[co] = FromAcc<TO>(Activate(v, decltype(act_c)::value));
            }
          }
        }
      }
    });
  }
}

template <class T, class TO, int CI, int CO, int R, int P>
cudaError_t LaunchStencil(const StArgs& g0, const void* src, const void* w, const void* bias, void* dst,
                          cudaStream_t s, bool* launched) {
  using Acc = typename AccOf<T>::type;
  constexpr int64_t CP = StPitch<CI>(), TH = 8 * R, TW = 32 * P, V = 16 / sizeof(T);
  *launched = false;
  StArgs g = g0;
  const int64_t sr = TH + static_cast<int64_t>(g.taps[1] - 1) * g.g1;
  const int64_t sc = TW + static_cast<int64_t>(g.taps[2] - 1) * g.g2;
  const int64_t pitch = CI == 1 ? ((sc + 2 * V - 2) / V * V + 3) / 4 * 4 : sc * CP;
  const int64_t wn = (static_cast<int64_t>(g.ntaps) * CI * CO + 3) / 4 * 4;
  const int64_t bytes = (wn + sr * pitch) * static_cast<int64_t>(sizeof(Acc)) + (CI == 1 ? sr * 4 : 0);
  if (bytes > kStencilSmemMax) return cudaSuccess;  // caller uses the gather kernel
  // the kernel's 32-bit staging arithmetic: staged source columns times channels, rows
  const int64_t kLim = int64_t(1) << 30;
  const int64_t m2a = g.m2 < 0 ? -static_cast<int64_t>(g.m2) : g.m2, m1a = g.m1 < 0 ? -static_cast<int64_t>(g.m1) : g.m1;
  if ((m2a + g.tsp[2] + TW + sc + 2 * V) * g.cin >= kLim || m1a + g.tsp[1] + TH + sr >= kLim) return cudaSuccess;
  auto kern = ScStencilKernel<T, TO, CI, CO, R, P>;
  if (AllowDynamicSmem(kern, static_cast<size_t>(bytes)) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it, fall back
    return cudaSuccess;
  }
  g.sr = static_cast<int>(sr);
  g.sc = static_cast<int>(sc);
  g.pitch = static_cast<int>(pitch);
  g.th = static_cast<int>(CeilDiv(g.tsp[1], TH));
  g.tw = static_cast<int>(CeilDiv(g.tsp[2], TW));
  g.tiles = g.n * g.tsp[0] * g.th * g.tw;
  *launched = true;
  if (g.tiles <= 0) return cudaSuccess;
  kern<<<GridX(g.tiles), kThreads, bytes, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                               static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

// Fewer than two of the stencil's 8R x 32P pixel tiles per SM: small grids take a smaller tile, twice the blocks.
inline bool FewStencilTiles(const StArgs& g, int r, int p) {
  return g.n * g.tsp[0] * CeilDiv(g.tsp[1], 8 * r) * CeilDiv(g.tsp[2], 32 * p) < 2 * kPlanSms;
}

// Channel buckets (CI, CO) and per-thread work R rows x P columns x CO channels (R * P * CO <= 32 accumulators).
template <class T, class TO>
cudaError_t StencilByCh(const StArgs& g, const void* src, const void* w, const void* bias, void* dst, cudaStream_t s,
                        bool* launched) {
  *launched = false;
  if (g.cin == 1) {
    if (g.cout == 1) {
      // fewer than 2 tiles of 64 x 128 per SM (1024 x 1024 is 128): 64 x 64 tiles, twice the blocks in flight
      if (FewStencilTiles(g, 8, 4)) return LaunchStencil<T, TO, 1, 1, 8, 2>(g, src, w, bias, dst, s, launched);
      return LaunchStencil<T, TO, 1, 1, 8, 4>(g, src, w, bias, dst, s, launched);
    }
    if (g.cout <= 4) return LaunchStencil<T, TO, 1, 4, 4, 2>(g, src, w, bias, dst, s, launched);
    if (g.cout <= 16) return LaunchStencil<T, TO, 1, 16, 2, 1>(g, src, w, bias, dst, s, launched);
  } else if (g.cin <= 4) {
    if (g.cout == 1) return LaunchStencil<T, TO, 4, 1, 4, 2>(g, src, w, bias, dst, s, launched);
    if (g.cout <= 4) {
      // fewer than 2 tiles of 32 x 64 per SM: 16 x 64 tiles, twice the blocks in flight (run 140, msd's 4 -> 4 at
      // 512², 128 tiles, before the pixel kernel took 4 -> 4: 14.1 -> 11.3 µs bf16, 16.2 -> 11.5 f32; 8 x 64 and
      // 16 x 32 tiles took 13-14)
      if (FewStencilTiles(g, 4, 2)) return LaunchStencil<T, TO, 4, 4, 2, 2>(g, src, w, bias, dst, s, launched);
      return LaunchStencil<T, TO, 4, 4, 4, 2>(g, src, w, bias, dst, s, launched);
    }
  } else if (g.cin <= 16 && g.cout == 1) {
    return LaunchStencil<T, TO, 16, 1, 4, 1>(g, src, w, bias, dst, s, launched);
  }
  return cudaSuccess;
}

// The stencil kernel when the problem fits it (sets *launched), else nothing.
cudaError_t RunStencil(const ScArgs& a, DType in, DType out, const void* src, const void* w, const void* bias, void* dst,
                       cudaStream_t s, bool* launched) {
  *launched = false;
  if (a.alpha[1] != 1 || a.alpha[2] != 1 || a.delta[1] != 1 || a.delta[2] != 1) return cudaSuccess;
  const int g1 = a.gamma[1] < 0 ? -a.gamma[1] : a.gamma[1];
  if (g1 != 1 && g1 != 2 && g1 != 4 && g1 != 8) return cudaSuccess;
  if (a.tsp[1] < 8 || a.tsp[2] < 8) return cudaSuccess;  // 1-D, short or narrow images: tiles would idle most threads
  if (a.sS[2] != a.cin || a.dS[2] != a.cout) return cudaSuccess;  // channels-last pixels (always)
  StArgs g{};
  g.n = a.n;
  g.sN = a.sN;
  g.dN = a.dN;
  for (int d = 0; d < 3; ++d) {
    g.tsp[d] = a.tsp[d];
    g.taps[d] = a.taps[d];
  }
  g.alpha0 = a.alpha[0];
  g.beta0 = a.beta[0];
  g.gamma0 = a.gamma[0];
  g.delta0 = a.delta[0];
  g.lim0 = a.lim[0];
  g.m1 = a.beta[1] + std::min(0, (a.taps[1] - 1) * a.gamma[1]);
  g.m2 = a.beta[2] + std::min(0, (a.taps[2] - 1) * a.gamma[2]);
  g.g1 = g1;
  g.gamma1 = a.gamma[1];
  g.g2 = a.gamma[2] < 0 ? -a.gamma[2] : a.gamma[2];
  g.gamma2 = a.gamma[2];
  g.lim1 = a.lim[1];
  g.lim2 = a.lim[2];
  g.sS0 = a.sS[0];
  g.sS1 = a.sS[1];
  g.dS0 = a.dS[0];
  g.dS1 = a.dS[1];
  g.wF = a.wF;
  g.wCi = a.wCi;
  g.wCo = a.wCo;
  g.cin = a.cin;
  g.cout = a.cout;
  g.ntaps = a.ntaps;
  g.act = a.act;
  g.has_bias = a.has_bias;
#define JAXCONV_BODY(T, TO) return StencilByCh<T, TO>(g, src, w, bias, dst, s, launched)
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

// ---- wgrad ----
struct ScWgArgs {
  int64_t xN, dN;  // batch strides of x and dy
  int64_t rtotal, per_chunk, chunks, welems;
  int osp[3], in[3], taps[3], stride[3], pad[3], ldil[3], rdil[3];  // 32-bit (SmallChannelApplies bounds them)
  int xS[3], dS[3];
  int c, k, ntaps, tf, ktiles, nslices, unit;
};

// Block b: slice = b % nslices (ktile = slice % ktiles, tap slice = slice / ktiles), chunk = b / nslices.
template <class T, int CB, int KB, int TF>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 8 ? 1 : 2) ScWgradKernel(const ScWgArgs g, const T* __restrict__ x,
                                                          const T* __restrict__ dy,
                                                          typename AccOf<T>::type* __restrict__ scratch) {
  using Acc = typename AccOf<T>::type;
  constexpr int E = TF * CB * KB;
  __shared__ Acc red[kThreads / 32][E];
  const int tid = threadIdx.x;
  const int64_t blocks = g.chunks * g.nslices;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t chunk = b / g.nslices;  // once per block
    const int slice = static_cast<int>(b - chunk * g.nslices);
    const int kt = slice % g.ktiles, ts = slice / g.ktiles;
    const int k0 = kt * KB, fstart = ts * TF;
    const int nt = min(TF, g.ntaps - fstart);
    const int s12 = g.taps[1] * g.taps[2];
    const int s0 = fstart / s12, s1 = (fstart % s12) / g.taps[2], s2 = fstart % g.taps[2];
    Acc acc[TF][CB][KB];
#pragma unroll
    for (int j = 0; j < TF; ++j)
#pragma unroll
      for (int ci = 0; ci < CB; ++ci)
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) acc[j][ci][kk] = Acc(0);
    const int64_t r_begin = chunk * g.per_chunk;
    const int64_t r_end = min(g.rtotal, r_begin + g.per_chunk);
    if (r_begin + tid < r_end) {
      int64_t rem = r_begin + tid;
      int o2, o1, o0;
      { const int64_t q_ = DivNN(rem, g.osp[2]); o2 = static_cast<int>(rem - q_ * g.osp[2]); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.osp[1]); o1 = static_cast<int>(rem - q_ * g.osp[1]); rem = q_; }
      { const int64_t q_ = DivNN(rem, g.osp[0]); o0 = static_cast<int>(rem - q_ * g.osp[0]); rem = q_; }
      int64_t n = rem;
      for (int64_t r = r_begin + tid; r < r_end; r += kThreads) {
        const T* dyp = dy + n * g.dN + (o0 * g.dS[0] + o1 * g.dS[1] + o2 * g.dS[2] + k0);
        Acc dv[KB];
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) dv[kk] = (k0 + kk < g.k) ? ToAcc(dyp[kk]) : Acc(0);
        const int b0 = o0 * g.stride[0] - g.pad[0], b1 = o1 * g.stride[1] - g.pad[1],
                  b2 = o2 * g.stride[2] - g.pad[2];
        const T* xn = x + n * g.xN;
        int g0 = s0, g1 = s1, g2 = s2;
#pragma unroll
        for (int j = 0; j < TF; ++j) {
          if (j < nt) {
            int p0 = b0 + g0 * g.rdil[0], p1 = b1 + g1 * g.rdil[1], p2 = b2 + g2 * g.rdil[2];
            bool ok;
            if (g.unit) {
              ok = static_cast<unsigned>(p0) < static_cast<unsigned>(g.in[0]) &&
                   static_cast<unsigned>(p1) < static_cast<unsigned>(g.in[1]) &&
                   static_cast<unsigned>(p2) < static_cast<unsigned>(g.in[2]);
            } else {
              p0 = TapIndex(p0, g.ldil[0], g.in[0]);
              p1 = TapIndex(p1, g.ldil[1], g.in[1]);
              p2 = TapIndex(p2, g.ldil[2], g.in[2]);
              ok = p0 >= 0 && p1 >= 0 && p2 >= 0;
            }
            if (ok) {
              const T* xp = xn + (p0 * g.xS[0] + p1 * g.xS[1] + p2 * g.xS[2]);
#pragma unroll
              for (int ci = 0; ci < CB; ++ci) {
                if (ci < g.c) {
                  const Acc xv = ToAcc(xp[ci]);
#pragma unroll
                  for (int kk = 0; kk < KB; ++kk) acc[j][ci][kk] = fma(xv, dv[kk], acc[j][ci][kk]);
                }
              }
            }
            if (++g2 == g.taps[2]) {
              g2 = 0;
              if (++g1 == g.taps[1]) { g1 = 0; ++g0; }
            }
          }
        }
        // advance (n, o0, o1, o2) by kThreads positions (mixed-radix carry; a division only on a wrap)
        o2 += kThreads;
        if (o2 >= g.osp[2]) {
          int cq = static_cast<int>(static_cast<unsigned>(o2) / static_cast<unsigned>(g.osp[2]));
          o2 -= cq * g.osp[2];
          o1 += cq;
          if (o1 >= g.osp[1]) {
            cq = static_cast<int>(static_cast<unsigned>(o1) / static_cast<unsigned>(g.osp[1]));
            o1 -= cq * g.osp[1];
            o0 += cq;
            if (o0 >= g.osp[0]) {
              cq = static_cast<int>(static_cast<unsigned>(o0) / static_cast<unsigned>(g.osp[0]));
              o0 -= cq * g.osp[0];
              n += cq;
            }
          }
        }
      }
    }
    // fixed-order block reduction: a shuffle-down tree per warp, then the warps in order
    const int lane = tid & 31, warp = tid >> 5;
    __syncthreads();  // red is reused across grid-stride iterations
#pragma unroll
    for (int j = 0; j < TF; ++j)
#pragma unroll
      for (int ci = 0; ci < CB; ++ci)
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) {
          Acc v = acc[j][ci][kk];
#pragma unroll
          for (int off = 16; off >= 1; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
          if (lane == 0) red[warp][(j * CB + ci) * KB + kk] = v;
        }
    __syncthreads();
    for (int e = tid; e < E; e += kThreads) {
      const int kk = e % KB, ci = (e / KB) % CB, j = e / (KB * CB);
      if (j < nt && ci < g.c && k0 + kk < g.k) {
        Acc sum = red[0][e];
#pragma unroll
        for (int wp = 1; wp < kThreads / 32; ++wp) sum += red[wp][e];
        const int64_t idx = (static_cast<int64_t>(fstart + j) * g.c + ci) * g.k + k0 + kk;
        scratch[chunk * g.welems + idx] = sum;
      }
    }
  }
}

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
      // 8 chunks' loads in flight per lane: one at a time, msd 1->1 4096²'s 4608 chunks of 9 elements (18 per lane)
      // took 7.6-7.9 µs, 3.2-3.5 with 8 (run 192).
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
// issued together), then a fixed xor butterfly; no shared memory or barriers. On msd's 4->4 filter gradient (144
// elements, 43-86 chunks) 1.28 µs bf16 / 1.42 f32 against the block tree's 1.70 / 2.02 (run 185).
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

struct WgCfg { int cb, kb, tf; };
WgCfg PickWgCfg(const ConvParams& p) {
  const int64_t c = p.c[0], k = p.k[0];
  WgCfg r;
  r.cb = c == 1 ? 1 : c <= 4 ? 4 : 16;
  if (r.cb == 16) r.kb = k == 1 ? 1 : 4;
  else r.kb = k == 1 ? 1 : k <= 4 ? 4 : 16;
  r.tf = 64 / (r.cb * r.kb);
  if (r.tf > 32) r.tf = 32;  // 3x3, 5x5 in one slice
  if (r.tf < 1) r.tf = 1;
  return r;
}

ScWgArgs MakeWgArgs(const ConvParams& p) {
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  const WgCfg cfg = PickWgCfg(p);
  ScWgArgs g{};
  g.rtotal = p.n[0];
  int64_t ntaps = 1;
  g.unit = 1;
  for (int d = 0; d < 3; ++d) {
    g.osp[d] = p.out[d];
    g.in[d] = p.in[d];
    g.taps[d] = p.win[d];
    g.stride[d] = p.stride[d];
    g.pad[d] = p.pad_lo[d];
    g.ldil[d] = p.lhs_dil[d];
    g.rdil[d] = p.rhs_dil[d];
    g.xS[d] = xs.s[2 + d];
    g.dS[d] = ys.s[2 + d];
    g.rtotal *= p.out[d];
    ntaps *= p.win[d];
    if (p.lhs_dil[d] != 1) g.unit = 0;
  }
  g.xN = xs.s[0];
  g.dN = ys.s[0];
  g.c = static_cast<int>(p.c[0]);
  g.k = static_cast<int>(p.k[0]);
  g.ntaps = static_cast<int>(ntaps);
  g.tf = cfg.tf;
  g.ktiles = static_cast<int>(CeilDiv(p.k[0], cfg.kb));
  g.nslices = static_cast<int>(CeilDiv(ntaps, cfg.tf)) * g.ktiles;
  g.welems = WElements(p);
  // chunks: ~4 blocks per SM in all, at least 2048 positions (8 per thread) per chunk
  const int64_t want = CeilDiv(4 * kPlanSms, g.nslices);
  int64_t chunks = std::min<int64_t>(want, CeilDiv(g.rtotal, 2048));
  if (chunks < 1) chunks = 1;
  g.per_chunk = CeilDiv(g.rtotal, chunks);
  if (g.per_chunk < 1) g.per_chunk = 1;
  g.chunks = CeilDiv(g.rtotal, g.per_chunk);
  if (g.chunks < 1) g.chunks = 1;
  return g;
}

template <class T, int CB, int KB, int TF>
cudaError_t LaunchWg(const ScWgArgs& g, const void* x, const void* dy, void* scratch, cudaStream_t s) {
  const int64_t blocks = g.chunks * g.nslices;
  ScWgradKernel<T, CB, KB, TF><<<GridX(blocks), kThreads, 0, s>>>(
      g, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<typename AccOf<T>::type*>(scratch));
  return cudaGetLastError();
}

template <class T>
cudaError_t WgByCfg(const ScWgArgs& g, const WgCfg& c, const void* x, const void* dy, void* scratch, cudaStream_t s) {
  if (c.cb == 1 && c.kb == 1) return LaunchWg<T, 1, 1, 32>(g, x, dy, scratch, s);
  if (c.cb == 1 && c.kb == 4) return LaunchWg<T, 1, 4, 16>(g, x, dy, scratch, s);
  if (c.cb == 1) return LaunchWg<T, 1, 16, 4>(g, x, dy, scratch, s);
  if (c.cb == 4 && c.kb == 1) return LaunchWg<T, 4, 1, 16>(g, x, dy, scratch, s);
  if (c.cb == 4 && c.kb == 4) return LaunchWg<T, 4, 4, 4>(g, x, dy, scratch, s);
  if (c.cb == 4) return LaunchWg<T, 4, 16, 1>(g, x, dy, scratch, s);
  if (c.kb == 1) return LaunchWg<T, 16, 1, 4>(g, x, dy, scratch, s);
  return LaunchWg<T, 16, 4, 1>(g, x, dy, scratch, s);
}

// ---- tiled filter gradient (unit stride, no lhs dilation, at most 2 spatial dims, float accumulation) ----
// dw[f0, f1, ci, co] = sum_{n, o0, o1} x[n, o0 - p0 + f0 d0, o1 - p1 + f1 d1, ci] * dy[n, o0, o1, co].
// A block owns one tile of TH x kTw output pixels and one slice (<= kSlice taps x CB input x KB output
// channels); it stages the dy tile and the x tile with its halo in shared memory as float (zero outside x), so
// the inner loop is a shared load and CB*KB FMAs per tap with no index checks. Thread j owns output column j
// (all TH rows), reduces its partial sums with the block in a fixed order and writes them to scratch[tile];
// ScReduceKernel then adds the tiles per element in a fixed order (bitwise deterministic, no atomics). The
// generic gather wgrad spends ~30 instructions of index arithmetic per FMA on these problems (45 µs for a
// 1024² 3x3 single-channel filter gradient on the H100, 2026-11-22).
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

// Floats of the staged x tile, rounded up to 4 so the dy tile after it stays 16-byte aligned (found on the H100:
// a 9 x 131 x tile put the float4 dy loads off alignment).
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

// The tile plan for ConvParams p with CB x KB channel blocks; false if the tiled path does not apply.
bool MakeTwArgs(const ConvParams& p, int cbw, int kbw, TwArgs* out) {
  TwArgs g{};
  if (p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) return false;
  if (p.in[0] != 1 || p.win[0] != 1 || p.out[0] != 1) return false;  // at most 2 spatial dims
  for (int d = 1; d < 3; ++d) {
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1) return false;
  }
  if (p.c[0] % cbw != 0 || p.k[0] % kbw != 0) return false;
  g.n = p.n[0];
  g.ih = static_cast<int>(p.in[1]); g.iw = static_cast<int>(p.in[2]);
  g.oh = static_cast<int>(p.out[1]); g.ow = static_cast<int>(p.out[2]);
  g.kh = static_cast<int>(p.win[1]); g.kw = static_cast<int>(p.win[2]);
  g.d0 = static_cast<int>(p.rhs_dil[1]); g.d1 = static_cast<int>(p.rhs_dil[2]);
  g.p0 = static_cast<int>(p.pad_lo[1]); g.p1 = static_cast<int>(p.pad_lo[2]);
  g.c = static_cast<int>(p.c[0]); g.k = static_cast<int>(p.k[0]);
  if (g.n <= 0 || g.oh <= 0 || g.ow <= 0 || g.kh <= 0 || g.kw <= 0) return false;
  const int64_t span_h = int64_t(g.kh - 1) * g.d0, span_w = int64_t(g.kw - 1) * g.d1;
  if (span_h > 64 || span_w > 64) return false;  // the halo would dwarf the tile
  g.xw = kTw + static_cast<int>(span_w);
  // Rows per tile: up to 32 as the shared memory allows, fewer (down to 8) while the tiles would not give
  // ~4 blocks per SM.
  g.th = 32;
  auto bytes = [&](int th) { return (TwXFloats(th + static_cast<int>(span_h), g.xw, cbw) + int64_t(th) * kTw * kbw) * 4; };
  while (g.th > 1 && bytes(g.th) > kTileSmem) g.th /= 2;
  if (bytes(g.th) > kTileSmem) return false;
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
  if (g.tiles * g.welems * 4 > (int64_t(1) << 28)) return false;
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  g.xN = xs.s[0]; g.xH = xs.s[3];
  g.dN = ys.s[0]; g.dH = ys.s[3];
  *out = g;
  return true;
}

template <class T, int CB, int KB>
cudaError_t LaunchTw(const TwArgs& g, const void* x, const void* dy, void* scratch, cudaStream_t s) {
  const size_t smem = (static_cast<size_t>(TwXFloats(g.xh, g.xw, CB)) + static_cast<size_t>(g.th) * kTw * KB) * sizeof(float);
  TwWgradKernel<T, CB, KB><<<GridX(g.blocks), kTw, smem, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(dy),
                                                               static_cast<float*>(scratch));
  return cudaGetLastError();
}

// The tiled wgrad's plan: channel blocks of 1 or 4 input and output channels, float partial sums (not f64);
// false where it does not apply (the gather wgrad runs instead).
bool TiledWgradPlan(const ConvParams& p, DType in, TwArgs* g, int* cbw, int* kbw) {
  if (in == DType::kF64) return false;
  *cbw = p.c[0] == 1 ? 1 : (p.c[0] % 4 == 0 ? 4 : 0);
  *kbw = p.k[0] == 1 ? 1 : (p.k[0] % 4 == 0 ? 4 : 0);
  return *cbw != 0 && *kbw != 0 && MakeTwArgs(p, *cbw, *kbw, g);
}

template <class T>
cudaError_t RunTw(const TwArgs& g, int cbw, int kbw, const void* x, const void* dy, void* scratch, cudaStream_t s) {
  if (cbw == 1 && kbw == 1) return LaunchTw<T, 1, 1>(g, x, dy, scratch, s);
  if (cbw == 4 && kbw == 1) return LaunchTw<T, 4, 1>(g, x, dy, scratch, s);
  if (cbw == 1 && kbw == 4) return LaunchTw<T, 1, 4>(g, x, dy, scratch, s);
  return LaunchTw<T, 4, 4>(g, x, dy, scratch, s);
}

// ---- pixel kernels: 4 input and 4 output channels (msd's 4 -> 4 layer) ----
// Forward and data gradient (ScPixelKernel, delta = 1 along every dim): a thread owns P pixels of one row, 32 apart
// (lane + 32 j), and their 4 destination channels; a block's 8 warps own 8 consecutive rows of one 32P-pixel column
// segment (grid: segments x row tiles x images * tsp0, one division per block), so the rows of the window they share
// are read through L1 once. Per tap a pixel's 4 source channels are one 8- or 16-byte load straight from global memory
// (the lanes read consecutive pixels) and the tap's 4 x 4 filter block is a warp-uniform shared-memory read. Nothing is
// staged per tile and no barrier follows the filter's: the stencil kernel's staged tile (two barriers per tile,
// scattered shared stores) kept its 2 warps per scheduler waiting (ncu, DEVICE_RUNS 139). 3x3 windows at unit column
// stride and column dilation +-1 (the forward and the data gradient of an undilated 3x3) are unrolled with the column
// offsets as constants, and a segment whose window columns all lie inside the source row loads without checks.
constexpr int kPxThreads = 256;
constexpr int kPxRows = kPxThreads / 32;
constexpr int64_t kPxSmemMax = 48 * 1024;
// Shared memory of the FMA pixel kernel: the filter as f32, 4 x 4 per tap.
inline int64_t PixelSmem(const ScArgs& g) { return static_cast<int64_t>(g.ntaps) * 16 * sizeof(float); }

// f(r, off) for each window row r = 3 f0 + f1 of a window 3 rows tall (any taps along dim 0) whose source row lies
// inside the source; off = the row's element offset in the image. The skip is uniform over a warp (one row t1).
template <class F>
__device__ __forceinline__ void ForEachWindowRow3(const ScArgs& g, int t0, int t1, F&& f) {
  for (int f0 = 0; f0 < g.taps[0]; ++f0) {
    const int q0 = TapIndex(t0 * g.alpha[0] + g.beta[0] + f0 * g.gamma[0], 1, g.lim[0]);
    if (q0 < 0) continue;
#pragma unroll
    for (int f1 = 0; f1 < 3; ++f1) {
      const int q1 = t1 * g.alpha[1] + g.beta[1] + f1 * g.gamma[1];
      if (static_cast<unsigned>(q1) >= static_cast<unsigned>(g.lim[1])) continue;
      f(f0 * 3 + f1, q0 * g.sS[0] + q1 * g.sS[1]);
    }
  }
}

// K = 3, G2 = +-1: the 3x3 window with alpha2 = 1, gamma2 = G2; K = 0: any window (G2 unused).
template <class T, class TO, int P, int K, int G2>
__global__ void __launch_bounds__(kPxThreads, 4) ScPixelKernel(const ScArgs g, const T* __restrict__ src,
                                                               const T* __restrict__ w, const TO* __restrict__ bias,
                                                               TO* __restrict__ dst) {
  extern __shared__ __align__(16) float pwt[];  // [ntaps][ci][co], 4 x 4 per tap
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < g.ntaps * 16; e += kPxThreads) {
    const int co = e & 3, ci = (e >> 2) & 3, f = e >> 4;
    pwt[e] = ToAcc(w[static_cast<int64_t>(f) * g.wF + ci * g.wCi + co * g.wCo]);
  }
  __syncthreads();
  const int t1 = static_cast<int>(blockIdx.y) * kPxRows + warp;
  if (t1 >= g.tsp[1]) return;  // no barrier follows
  const int64_t n = blockIdx.z / g.tsp[0];
  const int t0 = static_cast<int>(blockIdx.z - n * g.tsp[0]);
  const int s0 = static_cast<int>(blockIdx.x) * 32 * P;  // the segment's first destination pixel
  const int c0 = s0 + lane;
  float acc[P][4];
#pragma unroll
  for (int j = 0; j < P; ++j)
#pragma unroll
    for (int co = 0; co < 4; ++co) acc[j][co] = 0.f;
  auto fma16 = [&](const float (&xv)[4], const float* wq, float (&a)[4]) {
    float wv[16];
    LdN<16>(wq, wv);
#pragma unroll
    for (int ci = 0; ci < 4; ++ci)
#pragma unroll
      for (int co = 0; co < 4; ++co) a[co] = fmaf(xv[ci], wv[4 * ci + co], a[co]);
  };
  const T* sb = src + n * g.sN;
  if constexpr (K == 3) {
    const int qb = c0 + g.beta[2];  // source column of tap 0, pixel 0
    const int lo = s0 + g.beta[2] + (G2 < 0 ? -2 : 0), hi = s0 + 32 * P - 1 + g.beta[2] + (G2 > 0 ? 2 : 0);
    auto body = [&](auto inner_c) {
      constexpr bool kInner = decltype(inner_c)::value;
      unsigned cv = 0;  // bit 3j + f2: column of (pixel j, tap f2) inside the row
#pragma unroll
      for (int j = 0; j < P; ++j)
#pragma unroll
        for (int f2 = 0; f2 < 3; ++f2)
          cv |= static_cast<unsigned>(static_cast<unsigned>(qb + 32 * j + f2 * G2) < static_cast<unsigned>(g.lim[2]))
                << (3 * j + f2);
      ForEachWindowRow3(g, t0, t1, [&](int r, int off) {
        const T* rp = sb + off + 4 * static_cast<int64_t>(qb);
        const float* wf = pwt + r * 48;
#pragma unroll
        for (int f2 = 0; f2 < 3; ++f2) {
#pragma unroll
          for (int j = 0; j < P; ++j) {
            float xv[4] = {0.f, 0.f, 0.f, 0.f};
            if (kInner || ((cv >> (3 * j + f2)) & 1u)) LdGlobalAcc<T, float, 4>(rp + 4 * (32 * j + f2 * G2), xv);
            fma16(xv, wf + 16 * f2, acc[j]);
          }
        }
      });
    };
    if (lo >= 0 && hi < g.lim[2]) body(std::true_type{});
    else body(std::false_type{});
  } else {
    for (int f0 = 0; f0 < g.taps[0]; ++f0) {
      const int q0 = TapIndex(t0 * g.alpha[0] + g.beta[0] + f0 * g.gamma[0], 1, g.lim[0]);
      if (q0 < 0) continue;
      for (int f1 = 0; f1 < g.taps[1]; ++f1) {
        const int q1 = t1 * g.alpha[1] + g.beta[1] + f1 * g.gamma[1];
        if (static_cast<unsigned>(q1) >= static_cast<unsigned>(g.lim[1])) continue;  // uniform over the warp
        const T* rowp = sb + (q0 * g.sS[0] + q1 * g.sS[1]);
        const float* wf = pwt + (f0 * g.taps[1] + f1) * g.taps[2] * 16;
        for (int f2 = 0; f2 < g.taps[2]; ++f2) {
          const int qb = c0 * g.alpha[2] + g.beta[2] + f2 * g.gamma[2];
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const int q2 = qb + 32 * j * g.alpha[2];
            float xv[4] = {0.f, 0.f, 0.f, 0.f};
            if (static_cast<unsigned>(q2) < static_cast<unsigned>(g.lim[2])) {
              LdGlobalAcc<T, float, 4>(rowp + 4 * q2, xv);
            }
            fma16(xv, wf + 16 * f2, acc[j]);
          }
        }
      }
    }
  }
  TO* drow = dst + n * g.dN + (t0 * g.dS[0] + t1 * g.dS[1]);
  WithActivation(g.act, [&](auto act_c) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int t2 = c0 + 32 * j;
      if (t2 >= g.tsp[2]) break;
      float v[4];
#pragma unroll
      for (int co = 0; co < 4; ++co) {
        v[co] = acc[j][co] + (g.has_bias ? ToAcc(bias[co]) : 0.f);
        v[co] = Activate(v[co], decltype(act_c)::value);
      }
      StGlobal<TO, float, 4>(drow + 4 * t2, v);
    }
  });
}

template <class T, class TO, int P, int K, int G2>
cudaError_t LaunchPixel(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(CeilDiv(g.tsp[2], 32 * P)), static_cast<unsigned>(CeilDiv(g.tsp[1], kPxRows)),
                  static_cast<unsigned>(g.n * g.tsp[0]));
  const size_t smem = static_cast<size_t>(PixelSmem(g));
  ScPixelKernel<T, TO, P, K, G2><<<grid, kPxThreads, smem, s>>>(g, static_cast<const T*>(src),
                                                                static_cast<const T*>(w),
                                                                static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

// 16-bit data, the unrolled 3x3 (K = 3 above): tensor cores instead of FMAs (ScPixelMmaKernel). One mma.sync
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
// H200, bf16 msd 4->4, fwd / dgrad busy us (runs 254-255, same builds): 512^2 4.82 / 4.88 with the previous kernel
// (a warp's three source rows staged in shared memory as overlapping pixel pairs, ldmatrix.x2 plus two 4-byte reads
// per M tile of 16 pixels, half of K and N zero), 4.72 / 4.91 at NC = 2 and R = 1, 3.49 / 3.50 at NC = 4, 3.33 /
// 3.37 at R = 2, 3.73 / 3.72 at NC = 2 and R = 4; 1024^2 14.0 / 14.2, 15.6 / 16.1, 10.8 / 11.0, 7.2 / 7.3, 7.8 / 7.8.
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

// The pixel kernel when g fits it (4 -> 4 channels, channels-last pixels, delta = 1, float accumulation, the
// filter in 48 KiB, 16-byte aligned buffers, a grid within CUDA's y and z limits), else nothing (*launched =
// false).
cudaError_t RunPixel(const ScArgs& g, DType in, DType out, const void* src, const void* w, const void* bias, void* dst,
                     cudaStream_t s, bool* launched) {
  *launched = false;
  if (g.cin != 4 || g.cout != 4 || !IsF32AccPair(in, out)) return cudaSuccess;
  for (int d = 0; d < 3; ++d) {
    if (g.delta[d] != 1) return cudaSuccess;
  }
  if (g.sS[2] != 4 || g.dS[2] != 4 || PixelSmem(g) > kPxSmemMax) {
    return cudaSuccess;
  }
  if (!Aligned16(src) || !Aligned16(dst)) return cudaSuccess;
  if (CeilDiv(g.tsp[1], kPxRows) > 65535 || g.n * g.tsp[0] > 65535) return cudaSuccess;
  *launched = true;
  if (g.n * g.tsp[0] * g.tsp[1] * g.tsp[2] <= 0) return cudaSuccess;
  // The unrolled 3x3: on tensor cores for 16-bit data, else at 2 pixels per thread (run 153, msd's 512² layer:
  // 5.5 µs; 4 pixels 6.5, the general loop 7.0); other windows 2 pixels per thread while that leaves the busy-warp
  // count, else 1.
  const bool k3 = g.taps[1] == 3 && g.taps[2] == 3 && g.alpha[2] == 1 && (g.gamma[2] == 1 || g.gamma[2] == -1);
  const bool two = g.n * g.tsp[0] * g.tsp[1] * CeilDiv(g.tsp[2], 64) >= kBusyWarps;
  return WithF32AccTypes(in, out, [&](auto t, auto to) {
    using T = decltype(t);
    using TO = decltype(to);
    if constexpr (sizeof(T) == 2) {
      if (k3) {
        // The row sweep where destination rows share source rows (unit row stride, undilated rows).
        const bool sweep = g.alpha[1] == 1 && g.gamma[1] == g.gamma[2];
        if (sweep) {
          return g.gamma[2] > 0 ? LaunchPixelMma<T, TO, 1, kMmaChunks, kMmaRows>(g, src, w, bias, dst, s)
                                : LaunchPixelMma<T, TO, -1, kMmaChunks, kMmaRows>(g, src, w, bias, dst, s);
        }
        return g.gamma[2] > 0 ? LaunchPixelMma<T, TO, 1, kMmaChunks, 1>(g, src, w, bias, dst, s)
                              : LaunchPixelMma<T, TO, -1, kMmaChunks, 1>(g, src, w, bias, dst, s);
      }
    } else if (k3) {
      return g.gamma[2] > 0 ? LaunchPixel<T, TO, 2, 3, 1>(g, src, w, bias, dst, s)
                            : LaunchPixel<T, TO, 2, 3, -1>(g, src, w, bias, dst, s);
    }
    return two ? LaunchPixel<T, TO, 2, 0, 0>(g, src, w, bias, dst, s)
               : LaunchPixel<T, TO, 1, 0, 0>(g, src, w, bias, dst, s);
  });
}

// Filter gradient (ScPixelWgradKernel, no lhs dilation): dw[f, ci, co] = sum_{n, o} x[n, o*s - pad + f*d, ci] *
// dy[n, o, co]. A block owns one slice (one window row (f0, f1) and kPxTaps consecutive taps along the last dim:
// 3 x 16 = 48 sums per thread), one tile of 256 output columns (thread = column) and one chunk of output rows of
// one (image, out0) plane; a thread walks its column down the chunk with pointer steps, loading dy's 4 channels
// and the slice's x pixels straight from global memory for 48 FMAs per row, the loads of 4 rows (2 for float32)
// issued before their FMAs (msd's 512² layer, bf16: 6.7 -> 6.1 µs, run 176; one row at a time before). A tap whose
// x column lies outside the row reads a clamped column and its sums are zeroed after the walk (the column is fixed
// per thread), so the walk has no per-load checks. The block's sums are reduced in a fixed order (a halving
// butterfly within each warp, then the 8 warps in order) into scratch[tile][welems]; ScReduceKernel adds the tiles
// (bitwise deterministic). The tiled filter gradient staged x and dy element by element for each of its 128-column
// tiles and 3 slices.
constexpr int kPxTaps = 3;

struct PxWgArgs {
  int64_t xN, dN, blocks, welems;
  int osp[3], in[3], taps[3], stride[3], pad[3], rdil[3];
  int xS0, xS1, dS0, dS1;  // channels-last: the pixel stride along the last dim is 4
  int planes, ctiles, per_chunk, rchunks, tgroups, nslices;  // planes = n * out0; rchunks = chunks per plane
  int mma;  // ScPixelWgradMmaKernel: nslices = taps0; chunks of source rows, per_chunk even; 128-column tiles
};

// Block b of the pixel filter gradients: slice (fastest), column tile, row chunk, plane; tile = its partial vector.
struct PxWgBlock {
  int slice, ctile, rc, plane;
  int64_t tile;
};
__device__ __forceinline__ PxWgBlock DecodeBlock(const PxWgArgs& g, int b) {
  PxWgBlock k;
  k.slice = b % g.nslices; b /= g.nslices;
  k.ctile = b % g.ctiles; b /= g.ctiles;
  k.rc = b % g.rchunks;
  k.plane = b / g.rchunks;
  k.tile = (static_cast<int64_t>(k.plane) * g.rchunks + k.rc) * g.ctiles + k.ctile;
  return k;
}

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

// Filter gradient of 16-bit data on tensor cores (ScPixelWgradMmaKernel; window rows and columns <= 4 taps, unit
// row stride). For one source row i of one image plane and window plane f0, 16 output columns o2 make one m16n8k16
// per pair of output channels: D[(t, ci)][(f1, co)] += sum_o2 x[i, o2 * s2 - pad2 + t * d2, ci] * dy[o1, o2, co],
// o1 = i + pad1 - f1 * d1: M = 4 column taps x 4 input channels, N = 4 window rows x 2 output channels (co = 2p + m
// in MMA m), K = the 16 columns. Any order of K serves if A and B share it: lane (g, c) holds columns c + 4j, so
// each load instruction of a warp reads 4 consecutive pixels. With g = 2q + p, the lane's A rows are tap q,
// channels 2p and 2p + 1 (one 4-byte load per pixel: channel pair p, split by two byte permutes), and its B column
// is window row q, channel pair p (likewise). A lane's accumulators are then dw[f0, c, q, 2p + h, 2e + m]
// (d[2h + e] of MMA m). The sums over a row take 8 loads, 8 permutes and 2 MMAs per warp and 16 columns, against
// 48 FMAs per thread and column in ScPixelWgradKernel. Lanes past the taps (q >= taps, c >= taps) compute waste.
// An output column past the row zeroes both operands; a source column in the padding zeroes A, and a missing dy
// row zeroes B, which turns an inf or NaN of the other operand into NaN where the sum over the real products has
// none: a warp with a non-finite sum recomputes its sums with FMAs over the real products (only non-finite data
// gets there). A block of 16 warps owns 128 columns (8 strips) and one chunk of source rows (2 halves), reduces
// its warps in a fixed order and writes its partial vector as ScPixelWgradKernel does. Strips inside the row and
// rows whose dy rows exist load at immediate offsets from one pointer per row: with per-load checks and 64-bit
// address arithmetic for each load (run 258) the kernel executed 2.4M warp instructions on msd's 512² layer (1.3M
// after, run 260). H200, bf16 msd 4->4, µs busy, kernel alone (runs 258-261): 512² 5.88 with ScPixelWgradKernel,
// 5.40 at first, 4.29 with the unchecked path and 4-row batches, 4.17-4.19 with 8-row batches; 1024² 15.2, 23.1
// (two waves of blocks), 9.9 and 9.2.
constexpr int kWgMmaWarps = 16;
constexpr int kWgMmaStrips = 8;  // 16-column strips per block; the other factor of the warps halves the rows
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

// The pixel filter gradient's plan for p (false where it does not apply): 4 -> 4 channels-last, no lhs dilation,
// float partial sums, at least 32 output columns. Row chunks such that slices x column tiles x chunks is about 1
// block per SM for 16-bit data, 2 for float32 (msd's 512² layer with its reduction, run 178: bf16 7.5 µs at 1, 8.1
// at 2, 9.7 at 3, 11.2 at 4; f32 8.2 at 1 and 2, 10.7 at 3; the reduction takes 1.7 µs for 1 and 2.0 for 2).
bool PixelWgradPlan(const ConvParams& p, DType in, PxWgArgs* out) {
  if (in == DType::kF64 || p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) return false;
  if (p.c[0] != 4 || p.k[0] != 4 || p.out[2] < 32) return false;
  if (p.in[0] < 1 || p.in[1] < 1 || p.in[2] < 1) return false;  // a clamped column must exist
  PxWgArgs g{};
  for (int d = 0; d < 3; ++d) {
    if (p.lhs_dil[d] != 1) return false;
    g.osp[d] = static_cast<int>(p.out[d]);
    g.in[d] = static_cast<int>(p.in[d]);
    g.taps[d] = static_cast<int>(p.win[d]);
    g.stride[d] = static_cast<int>(p.stride[d]);
    g.pad[d] = static_cast<int>(p.pad_lo[d]);
    g.rdil[d] = static_cast<int>(p.rhs_dil[d]);
  }
  const int64_t planes = p.n[0] * p.out[0];
  if (planes <= 0 || p.out[1] <= 0 || planes >= (int64_t(1) << 30)) return false;
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  g.xN = xs.s[0]; g.xS0 = static_cast<int>(xs.s[2]); g.xS1 = static_cast<int>(xs.s[3]);
  g.dN = ys.s[0]; g.dS0 = static_cast<int>(ys.s[2]); g.dS1 = static_cast<int>(ys.s[3]);
  g.welems = WElements(p);
  g.planes = static_cast<int>(planes);
  g.mma = (in == DType::kBF16 || in == DType::kF16) && p.win[1] <= 4 && p.win[2] <= 4 && p.stride[1] == 1;
  // 16-bit data: the tensor-core kernel, with at most one block of 16 warps per SM (a second wave of a few blocks
  // doubled its time on 1024², run 258), which also keeps the partial vectors few (the reduction's warp per element
  // takes up to 128).
  if (g.mma) {
    g.nslices = static_cast<int>(p.win[0]);
    g.ctiles = static_cast<int>(CeilDiv(p.out[2], kWgMmaStrips * 16));
    const int64_t want = std::max<int64_t>(1, kPlanSms / (static_cast<int64_t>(g.nslices) * g.ctiles * planes));
    g.per_chunk = static_cast<int>(2 * CeilDiv(CeilDiv(p.in[1], std::min<int64_t>(want, p.in[1])), 2));
    g.rchunks = static_cast<int>(CeilDiv(p.in[1], g.per_chunk));
    const int64_t tiles = planes * g.rchunks * g.ctiles;
    g.blocks = tiles * g.nslices;
    if (tiles * g.welems * 4 > (int64_t(1) << 28)) return false;  // scratch
    *out = g;
    return true;
  }
  g.tgroups = static_cast<int>(CeilDiv(p.win[2], kPxTaps));
  g.nslices = static_cast<int>(p.win[0] * p.win[1]) * g.tgroups;
  g.ctiles = static_cast<int>(CeilDiv(p.out[2], kPxThreads));
  const int64_t per_sm = in == DType::kF32 ? 2 : 1;
  const int64_t want = CeilDiv(per_sm * kPlanSms, static_cast<int64_t>(g.nslices) * g.ctiles * planes);
  g.per_chunk = static_cast<int>(CeilDiv(p.out[1], std::min<int64_t>(std::max<int64_t>(want, 1), p.out[1])));
  g.rchunks = static_cast<int>(CeilDiv(p.out[1], g.per_chunk));
  const int64_t tiles = planes * g.rchunks * g.ctiles;
  g.blocks = tiles * g.nslices;
  if (tiles * g.welems * 4 > (int64_t(1) << 28)) return false;  // scratch
  *out = g;
  return true;
}

// Partial vectors the pixel filter gradient writes (its scratch holds this many times welems floats).
int64_t PixelWgradTiles(const PxWgArgs& g) { return static_cast<int64_t>(g.planes) * g.rchunks * g.ctiles; }

// Launches the pixel filter gradient; *launched = false (nothing run) for buffers not 16-byte aligned.
cudaError_t RunPixelWgrad(const PxWgArgs& g, DType in, DType out, const void* x, const void* dy, void* scratch,
                          cudaStream_t s, bool* launched) {
  *launched = Aligned16(x) && Aligned16(dy);
  if (!*launched) return cudaSuccess;
  return WithF32AccTypes(in, out, [&](auto t, auto) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, float>) {
      if (g.mma) {
        ScPixelWgradMmaKernel<T><<<GridX(g.blocks), kWgMmaWarps * 32, 0, s>>>(
            g, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<float*>(scratch));
        return cudaGetLastError();
      }
    }
    ScPixelWgradKernel<T><<<GridX(g.blocks), kPxThreads, 0, s>>>(g, static_cast<const T*>(x),
                                                                  static_cast<const T*>(dy),
                                                                  static_cast<float*>(scratch));
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t SmallChannelFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s) {
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  ScArgs g{};
  g.n = p.n[0];
  g.unit = 1;
  for (int d = 0; d < 3; ++d) {
    g.tsp[d] = p.out[d];
    g.taps[d] = p.win[d];
    g.alpha[d] = p.stride[d];
    g.beta[d] = -p.pad_lo[d];
    g.gamma[d] = p.rhs_dil[d];
    g.delta[d] = p.lhs_dil[d];
    g.lim[d] = p.in[d];
    g.sS[d] = xs.s[2 + d];
    g.dS[d] = ys.s[2 + d];
  }
  g.unit = p.lhs_dil[2] == 1;
  g.sN = xs.s[0];
  g.dN = ys.s[0];
  g.cin = static_cast<int>(p.c[0]);
  g.cout = static_cast<int>(p.k[0]);
  g.ntaps = static_cast<int>(SpatialCount(p.win));
  g.wF = p.c[0] * p.k[0];
  g.wCi = p.k[0];
  g.wCo = 1;
  g.act = static_cast<int>(p.activation[0]);
  g.has_bias = static_cast<int>(p.has_bias[0]);
  bool launched = false;
  if (const cudaError_t e = PlaneStencilFwd(p, in, out, x, w, bias, y, s, &launched); e != cudaSuccess || launched) {
    return e;
  }
  if (const cudaError_t e = ReduceStencilFwd(p, in, out, x, w, bias, y, s, &launched); e != cudaSuccess || launched) {
    return e;
  }
  if (const cudaError_t e = RunRowSeg(g, in, out, x, w, bias, y, s, &launched); e != cudaSuccess || launched) return e;
  if (const cudaError_t e = RunPixel(g, in, out, x, w, bias, y, s, &launched); e != cudaSuccess || launched) return e;
  if (const cudaError_t e = RunStencil(g, in, out, x, w, bias, y, s, &launched); e != cudaSuccess || launched) return e;
  const cudaError_t e = RunGather(g, in, out, x, w, bias, y, s, &launched);
  if (e != cudaSuccess || launched) return e;
  return DirectFwd(p, in, out, x, w, bias, y, s);
}

cudaError_t SmallChannelDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                              cudaStream_t s) {
  const Strides5 xs = XStrides(p), ys = YStrides(p);
  ScArgs g{};
  g.n = p.n[0];
  for (int d = 0; d < 3; ++d) {
    g.tsp[d] = p.in[d];
    g.taps[d] = p.win[d];
    g.alpha[d] = p.lhs_dil[d];
    g.beta[d] = p.pad_lo[d];
    g.gamma[d] = -p.rhs_dil[d];
    g.delta[d] = p.stride[d];
    g.lim[d] = p.out[d];
    g.sS[d] = ys.s[2 + d];
    g.dS[d] = xs.s[2 + d];
  }
  g.unit = p.stride[2] == 1;
  g.sN = ys.s[0];
  g.dN = xs.s[0];
  g.cin = static_cast<int>(p.k[0]);
  g.cout = static_cast<int>(p.c[0]);
  g.ntaps = static_cast<int>(SpatialCount(p.win));
  g.wF = p.c[0] * p.k[0];
  g.wCi = 1;         // source channel kk
  g.wCo = p.k[0];    // destination channel c
  g.act = kActNone;
  g.has_bias = 0;
  bool launched = false;
  if (const cudaError_t e = PlaneStencilDgrad(p, in, out, dy, w, dx, s, &launched); e != cudaSuccess || launched) {
    return e;
  }
  if (const cudaError_t e = RunPixel(g, in, out, dy, w, nullptr, dx, s, &launched); e != cudaSuccess || launched) {
    return e;
  }
  if (const cudaError_t e = RunStencil(g, in, out, dy, w, nullptr, dx, s, &launched); e != cudaSuccess || launched) return e;
  const cudaError_t e = RunGather(g, in, out, dy, w, nullptr, dx, s, &launched);
  if (e != cudaSuccess || launched) return e;
  return DirectDgrad(p, in, out, dy, w, dx, s);
}

int64_t SmallChannelWgradChunks(const ConvParams& p, DType in) {
  if (WElements(p) <= 0) return 0;
  if (PlaneStencilApplies(p, in)) return PlaneWgradBlocks(p);
  PxWgArgs px{};
  if (PixelWgradPlan(p, in, &px)) return PixelWgradTiles(px);
  TwArgs t{};
  int cbw = 0, kbw = 0;
  if (TiledWgradPlan(p, in, &t, &cbw, &kbw)) return t.tiles;
  return MakeWgArgs(p).chunks;
}

cudaError_t SmallChannelWgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw,
                              void* scratch, size_t scratch_bytes, cudaStream_t s) {
  const int64_t welems = WElements(p);
  if (welems <= 0) return cudaSuccess;
  const int64_t chunks = SmallChannelWgradChunks(p, in);
  const size_t need = static_cast<size_t>(chunks) * static_cast<size_t>(welems) * AccBytes(in);
  if (scratch == nullptr || scratch_bytes < need) return DirectWgrad(p, in, out, x, dy, dw, nullptr, 1, s);
  TwArgs t{};
  PxWgArgs px{};
  int cbw = 0, kbw = 0;
  cudaError_t e = cudaSuccess;
  if (PlaneStencilApplies(p, in)) {
    bool launched = false;
    e = PlaneStencilWgrad(p, in, x, dy, static_cast<float*>(scratch), s, &launched);
    // Not taken only for unaligned buffers; the scratch is sized for the plane's partials, so run unsplit.
    if (e == cudaSuccess && !launched) return DirectWgrad(p, in, out, x, dy, dw, nullptr, 1, s);
  } else if (PixelWgradPlan(p, in, &px)) {
    bool launched = false;
    e = RunPixelWgrad(px, in, out, x, dy, scratch, s, &launched);
    if (e == cudaSuccess && !launched) return DirectWgrad(p, in, out, x, dy, dw, nullptr, 1, s);  // as above
  } else if (TiledWgradPlan(p, in, &t, &cbw, &kbw)) {
    switch (in) {
      case DType::kBF16: e = RunTw<__nv_bfloat16>(t, cbw, kbw, x, dy, scratch, s); break;
      case DType::kF16: e = RunTw<__half>(t, cbw, kbw, x, dy, scratch, s); break;
      default: e = RunTw<float>(t, cbw, kbw, x, dy, scratch, s); break;
    }
  } else {
    const ScWgArgs g = MakeWgArgs(p);
    const WgCfg cfg = PickWgCfg(p);
    switch (in) {
      case DType::kF32: e = WgByCfg<float>(g, cfg, x, dy, scratch, s); break;
      case DType::kF64: e = WgByCfg<double>(g, cfg, x, dy, scratch, s); break;
      case DType::kBF16: e = WgByCfg<__nv_bfloat16>(g, cfg, x, dy, scratch, s); break;
      case DType::kF16: e = WgByCfg<__half>(g, cfg, x, dy, scratch, s); break;
    }
  }
  if (e != cudaSuccess) return e;
  int ex = 1;
  const int64_t target = 2 * kPlanSms;
  while (ex < 32 && (CeilDiv(welems, ex) > target || chunks < kThreads / ex / 4)) ex *= 2;
  const unsigned grid = GridX(CeilDiv(welems, ex));
#define JAXCONV_BODY(T, TO)                                                                              \
  using A_ = typename AccOf<T>::type;                                                                   \
  if (chunks <= kWarpReduceChunks && welems <= kWarpReduceElems) { /* few partial sums: a warp each */  \
    ScReduceWarpKernel<A_, TO><<<GridX(CeilDiv(welems, kThreads / 32)), kThreads, 0, s>>>(               \
        static_cast<const A_*>(scratch), chunks, welems, static_cast<TO*>(dw));                         \
    return cudaGetLastError();                                                                          \
  }                                                                                                     \
  ScReduceKernel<A_, TO><<<grid, kThreads, 0, s>>>(static_cast<const A_*>(scratch), chunks, welems, ex,  \
                                                    static_cast<TO*>(dw));                              \
  return cudaGetLastError()
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace cuda
}  // namespace jaxconv
