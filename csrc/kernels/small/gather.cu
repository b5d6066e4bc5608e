// small.gather: the family's general forward and data gradient (any strides, dilations and padding; small.cuh gives
// the gather both ops are). The filter is staged once per block in shared memory as Acc, output channels padded to CO
// (a compile-time bucket 1/4/16/64, zero-filled). A thread owns P consecutive destination pixels along the last
// spatial dim and all CO channels in registers (acc[P][CO]); warps cover consecutive pixels, so source reads are
// coalesced and weight reads are shared-memory broadcasts; for CO = 64 four consecutive threads split the channels
// (16 each, P = 4 pixels). Fused bias + activation epilogue (fwd).
#include <cstdint>
#include <string>

#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

constexpr int64_t kSmemMax = 96 * 1024;  // opt-in (sm_80: 163 KiB, sm_86/89: 99 KiB, sm_90: 227 KiB)

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

// The output channel bucket CO of the kernel for cout channels.
int GatherCo(int cout) { return cout <= 1 ? 1 : cout <= 4 ? 4 : cout <= 16 ? 16 : 64; }

// Shared memory of the staged filter, bytes.
int64_t GatherSmem(const ScArgs& g, DType in) {
  return static_cast<int64_t>(g.ntaps) * g.cin * GatherCo(g.cout) * static_cast<int64_t>(AccBytes(in));
}

template <class T, class TO, int CO, int P, int CS>
cudaError_t LaunchGather(const ScArgs& g0, const void* src, const void* w, const void* bias, void* dst,
                         cudaStream_t s) {
  ScArgs g = g0;
  const int64_t bytes = static_cast<int64_t>(g.ntaps) * g.cin * CO * static_cast<int64_t>(sizeof(typename AccOf<T>::type));
  auto kern = ScGatherKernel<T, TO, CO, P, CS>;
  if (const cudaError_t e = AllowDynamicSmem(kern, static_cast<size_t>(bytes)); e != cudaSuccess) return e;
  g.gw = CeilDiv(g.tsp[2], P);
  g.total = g.n * g.tsp[0] * g.tsp[1] * g.gw * CS;
  if (g.total <= 0) return cudaSuccess;
  // small problems: 64-thread blocks spread the work over 4x more multiprocessors (latency bound there), unless
  // the per-block filter staging (wn / threads loads per thread) would take over
  const int64_t wn = static_cast<int64_t>(g.ntaps) * g.cin * CO;
  const int threads = (g.total < 2 * kPlanSms * kThreads && wn <= 32 * 64) ? 64 : kThreads;
  kern<<<GridX(CeilDiv(g.total, threads)), threads, bytes, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                                                static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

// The CO bucket (GatherCo), P pixels per thread and CS threads per pixel of each.
template <class T, class TO>
cudaError_t GatherByCo(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst, cudaStream_t s) {
  switch (GatherCo(g.cout)) {
    case 1: return LaunchGather<T, TO, 1, 4, 1>(g, src, w, bias, dst, s);
    case 4: return LaunchGather<T, TO, 4, 4, 1>(g, src, w, bias, dst, s);
    case 16: return LaunchGather<T, TO, 16, 2, 1>(g, src, w, bias, dst, s);
    default: return LaunchGather<T, TO, 64, 4, 4>(g, src, w, bias, dst, s);
  }
}

cudaError_t RunGather(const ScArgs& g, DType in, DType out, const void* src, const void* w, const void* bias, void* dst,
                      cudaStream_t s) {
#define JAXCONV_BODY(T, TO) return GatherByCo<T, TO>(g, src, w, bias, dst, s)
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_gather {

std::string Applies(const Problem& pr) {
  using namespace cuda::small_channel;
  if (std::string e = FamilyError(pr); !e.empty()) return e;
  const int64_t bytes = GatherSmem(MakeScArgs(pr), pr.in);
  if (bytes > kSmemMax) return "its staged filter takes more than 96 KiB of shared memory";
  if (bytes > 48 * 1024 && bytes > pr.dev.smem_optin) {
    return "its staged filter takes more shared memory than a block has";
  }
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  const GatherBuffers o = GatherBuffersOf(pr, b);
  return RunGather(MakeScArgs(pr), pr.in, pr.out, o.src, o.w, o.bias, o.dst, s);
}

}  // namespace variants::small_gather
}  // namespace jaxconv
