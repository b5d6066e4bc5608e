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
// weight reads are shared-memory broadcasts. Fused bias + activation epilogue (fwd).
//
// wgrad: dw[f, ci, kk] = sum_{n, o} x[n, i(o, f), ci] * dy[n, o, kk]. The (tap, k) space is cut into slices of
// TF taps x KB output channels (all c, padded to CB); a block owns one slice and one chunk of consecutive
// positions; each thread strides over the chunk's positions keeping TF*CB*KB (<= 64) partial sums in registers,
// then the block reduces them in a fixed order (warp shuffles, then the 8 warps in order) and writes the slice of
// its chunk's partial vector to scratch[chunk][welems]. A second kernel adds the chunks per element in a fixed
// tree order. No atomics: bitwise deterministic. chunks * slices ~ 4 x SMs blocks.
#include "cuda/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kSmemDefault = 48 * 1024;
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

template <class T, class TO, int CO, int P>
__global__ void __launch_bounds__(kThreads, (CO >= 64 || sizeof(T) == 8) ? 1 : 2) ScGatherKernel(const ScArgs g, const T* __restrict__ src,
                                                           const T* __restrict__ w, const TO* __restrict__ bias,
                                                           TO* __restrict__ dst) {
  using Acc = typename AccOf<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* wt = reinterpret_cast<Acc*>(smem_raw);
  const int cin = g.cin;
  {
    const int wn = g.ntaps * cin * CO;
    for (int e = threadIdx.x; e < wn; e += kThreads) {
      const int co = e % CO, r = e / CO;
      const int ci = r % cin, f = r / cin;
      wt[e] = co < g.cout ? ToAcc(w[static_cast<int64_t>(f) * g.wF + ci * g.wCi + co * g.wCo]) : Acc(0);
    }
  }
  __syncthreads();
  const int step2 = g.alpha[2] * g.sS[2];  // source offset between consecutive pixels of a group
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < g.total; e += step) {
    int64_t rem = e;
    int gq, t1, t0;
    { const int64_t q_ = DivNN(rem, g.gw); gq = static_cast<int>(rem - q_ * g.gw); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.tsp[1]); t1 = static_cast<int>(rem - q_ * g.tsp[1]); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.tsp[0]); t0 = static_cast<int>(rem - q_ * g.tsp[0]); rem = q_; }
    const int64_t n = rem;
    const int t2 = gq * P;
    Acc acc[P][CO];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int co = 0; co < CO; ++co) acc[p][co] = Acc(0);
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
          const Acc* wrow = wt + f * cin * CO;
          const int qb = t2 * g.alpha[2] + g.beta[2] + f2 * g.gamma[2];
          if (g.unit && qb >= 0 && qb + (P - 1) * g.alpha[2] < g.lim[2]) {
            // interior: all P source pixels valid, one check for the group
            const T* xp = rowp + qb * g.sS[2];
#pragma unroll 2
            for (int ci = 0; ci < cin; ++ci) {
              if constexpr (CO <= 16) {
                Acc wv[CO];
#pragma unroll
                for (int co = 0; co < CO; ++co) wv[co] = wrow[ci * CO + co];
#pragma unroll
                for (int p = 0; p < P; ++p) {
                  const Acc v = ToAcc(xp[p * step2 + ci]);
#pragma unroll
                  for (int co = 0; co < CO; ++co) acc[p][co] = fma(v, wv[co], acc[p][co]);
                }
              } else {
#pragma unroll
                for (int p = 0; p < P; ++p) {
                  const Acc v = ToAcc(xp[p * step2 + ci]);
#pragma unroll
                  for (int co = 0; co < CO; ++co) acc[p][co] = fma(v, wrow[ci * CO + co], acc[p][co]);
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
                  for (int co = 0; co < CO; ++co) acc[p][co] = fma(v, wrow[ci * CO + co], acc[p][co]);
                }
              }
            }
          }
        }
      }
    }
    TO* dbase = dst + n * g.dN + (t0 * g.dS[0] + t1 * g.dS[1]);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (t2 + p >= g.tsp[2]) break;
      TO* dp = dbase + (t2 + p) * g.dS[2];
#pragma unroll
      for (int co = 0; co < CO; ++co) {
        if (co < g.cout) {
          Acc v = acc[p][co];
          if (g.has_bias) v += ToAcc(bias[co]);
          dp[co] = FromAcc<TO>(Activate(v, g.act));
        }
      }
    }
  }
}

template <class T, class TO, int CO, int P>
cudaError_t LaunchGather(const ScArgs& g0, const void* src, const void* w, const void* bias, void* dst,
                         cudaStream_t s, bool* launched) {
  *launched = false;
  ScArgs g = g0;
  const int64_t bytes = static_cast<int64_t>(g.ntaps) * g.cin * CO * static_cast<int64_t>(sizeof(typename AccOf<T>::type));
  if (bytes > kSmemMax) return cudaSuccess;  // caller falls back to the direct kernel
  auto kern = ScGatherKernel<T, TO, CO, P>;
  if (bytes > kSmemDefault) {
    if (cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it, fall back
      return cudaSuccess;
    }
  }
  g.gw = CeilDiv(g.tsp[2], P);
  g.total = g.n * g.tsp[0] * g.tsp[1] * g.gw;
  *launched = true;
  if (g.total <= 0) return cudaSuccess;
  kern<<<GridX(CeilDiv(g.total, kThreads)), kThreads, bytes, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                                                  static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

template <class T, class TO>
cudaError_t GatherByCo(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst, cudaStream_t s,
                       bool* launched) {
  if (g.cout <= 1) return LaunchGather<T, TO, 1, 4>(g, src, w, bias, dst, s, launched);
  if (g.cout <= 4) return LaunchGather<T, TO, 4, 4>(g, src, w, bias, dst, s, launched);
  if (g.cout <= 16) return LaunchGather<T, TO, 16, 2>(g, src, w, bias, dst, s, launched);
  return LaunchGather<T, TO, 64, 1>(g, src, w, bias, dst, s, launched);
}

cudaError_t RunGather(const ScArgs& g, DT in, DT out, const void* src, const void* w, const void* bias, void* dst,
                      cudaStream_t s, bool* launched) {
#define JAXCONV_BODY(T, TO) return GatherByCo<T, TO>(g, src, w, bias, dst, s, launched)
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
// chunks in order, then a fixed tree over the lanes.
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
      for (int64_t c = y; c < chunks; c += lanes) v += src[c * count + e];
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

}  // namespace

bool SmallChannelApplies(const ConvParams& p) {
  if (p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) return false;
  if (p.c[0] < 1 || p.c[0] > 16 || p.k[0] < 1 || p.k[0] > 64) return false;
  const int64_t ntaps = SpatialCount(p.win);
  if (ntaps < 1 || ntaps * p.c[0] * p.k[0] > 12288) return false;
  // The kernels do per-image coordinate and offset arithmetic in 32 bits: bound every coordinate they form
  // (fwd q = o*stride - pad_lo + f*rhs_dil, dgrad q = i*lhs_dil + pad_lo - f*rhs_dil, plus a few strides of
  // look-ahead) and the per-image element counts of x and y.
  const int64_t kLim = int64_t(1) << 30;
  for (int d = 0; d < 3; ++d) {
    const int64_t plo = p.pad_lo[d] < 0 ? -p.pad_lo[d] : p.pad_lo[d];
    const int64_t phi = p.pad_hi[d] < 0 ? -p.pad_hi[d] : p.pad_hi[d];
    if (p.in[d] >= kLim || p.out[d] >= kLim || p.win[d] >= kLim || p.stride[d] >= kLim || p.lhs_dil[d] >= kLim ||
        p.rhs_dil[d] >= kLim || plo >= kLim || phi >= kLim) {
      return false;
    }
    const int64_t a = p.in[d] * p.lhs_dil[d] + plo + phi + p.win[d] * p.rhs_dil[d] + p.out[d] * p.stride[d] +
                      8 * (p.stride[d] + p.lhs_dil[d]);  // all terms < 2^60: no overflow
    if (a >= kLim) return false;
  }
  return SpatialCount(p.in) * p.c[0] < kLim && SpatialCount(p.out) * p.k[0] < kLim;
}

cudaError_t SmallChannelFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
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
  const cudaError_t e = RunGather(g, in, out, x, w, bias, y, s, &launched);
  if (e != cudaSuccess || launched) return e;
  return DirectFwd(p, in, out, x, w, bias, y, s);
}

cudaError_t SmallChannelDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
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
  const cudaError_t e = RunGather(g, in, out, dy, w, nullptr, dx, s, &launched);
  if (e != cudaSuccess || launched) return e;
  return DirectDgrad(p, in, out, dy, w, dx, s);
}

int64_t SmallChannelWgradChunks(const ConvParams& p) {
  if (WElements(p) <= 0) return 0;
  return MakeWgArgs(p).chunks;
}

cudaError_t SmallChannelWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw,
                              void* scratch, size_t scratch_bytes, cudaStream_t s) {
  const ScWgArgs g = MakeWgArgs(p);
  if (g.welems <= 0) return cudaSuccess;
  const size_t need = static_cast<size_t>(g.chunks) * static_cast<size_t>(g.welems) * AccBytes(in);
  if (scratch == nullptr || scratch_bytes < need) return DirectWgrad(p, in, out, x, dy, dw, nullptr, 1, s);
  const WgCfg cfg = PickWgCfg(p);
  cudaError_t e = cudaSuccess;
  switch (in) {
    case DT::kF32: e = WgByCfg<float>(g, cfg, x, dy, scratch, s); break;
    case DT::kF64: e = WgByCfg<double>(g, cfg, x, dy, scratch, s); break;
    case DT::kBF16: e = WgByCfg<__nv_bfloat16>(g, cfg, x, dy, scratch, s); break;
    case DT::kF16: e = WgByCfg<__half>(g, cfg, x, dy, scratch, s); break;
  }
  if (e != cudaSuccess) return e;
  int ex = 1;
  const int64_t target = 2 * kPlanSms;
  while (ex < 32 && (CeilDiv(g.welems, ex) > target || g.chunks < kThreads / ex / 4)) ex *= 2;
  const unsigned grid = GridX(CeilDiv(g.welems, ex));
#define JAXCONV_BODY(T, TO)                                                                              \
  using A_ = typename AccOf<T>::type;                                                                   \
  ScReduceKernel<A_, TO><<<grid, kThreads, 0, s>>>(static_cast<const A_*>(scratch), g.chunks, g.welems, ex, \
                                                    static_cast<TO*>(dw));                              \
  return cudaGetLastError()
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace cuda
}  // namespace jaxconv
