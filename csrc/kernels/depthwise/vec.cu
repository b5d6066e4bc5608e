// depthwise.vec: the depthwise ops on channels-last data as channel vectors per thread (c a multiple of one 16-byte
// vector of the input dtype, every dtype pair).
// Forward and data gradient (stencil.cuh's view) with a hole-free source (delta == 1: no lhs dilation in the forward,
// unit strides in the data gradient), W dilation 1 and a W step of 1 or 2 (DwVecKernel, below).
// Filter gradient without lhs dilation (DwVecWgradKernel, below).
#include <algorithm>
#include <cstdint>
#include <string>

#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/depthwise/stencil.cuh"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ---- channels-last vectorised kernel (delta == 1, W dilation 1 after flipping, W stride 1 or 2) ----
// A block owns a channel tile (CT channels), one output D position, TH output rows and NSEG * R output columns.
// The source tile (with halo, zero-filled outside the source) and the taps of the tile's channels are copied
// into shared memory in the input dtype with cp.async (16-byte chunks, 8 bytes when CT is not a multiple of 8
// 16-bit channels); when two stages fit, the next tile's copies are in flight while this one computes. Each
// thread item owns VA = 16 / sizeof(Acc) consecutive channels and R (VecR) consecutive outputs along W; it slides
// a register window over the source row so each shared-memory load feeds up to R FMAs per channel (U taps per
// step, unrolled).
// Outputs per thread item along W: 8, or 4 where a longer window would spill (stride 2, f64).
constexpr int VecR(int a, int acc_bytes) { return a == 2 || acc_bytes == 8 ? 4 : 8; }
constexpr int64_t kVecSmem = 96 * 1024;  // per block: <= sm_86's 99 KiB opt-in limit, 2 blocks/SM on H100

// n / d without a division instruction; exact for n * d < 2^32 (the staging loops keep n, d < 2^16).
struct FastDiv {
  unsigned d;
  unsigned long long m;  // 2^32 / d + 1
};
inline FastDiv MakeFastDiv(int64_t d) {
  return {static_cast<unsigned>(d), (1ull << 32) / static_cast<unsigned long long>(d) + 1};
}
__device__ __forceinline__ unsigned Div(unsigned n, const FastDiv& f) {
  return static_cast<unsigned>((static_cast<unsigned long long>(n) * f.m) >> 32);
}

struct DvArgs {
  int64_t n, c, tsp[3], taps[3], alpha[3], beta[3], gamma[3], lim[3];  // gamma > 0 (flipped)
  int64_t sN, sS[3], dN, dS[3];  // channel stride 1 (channels-last)
  int64_t wbase, wstep[3];      // element offset of tap f' = wbase + sum f'[d] * wstep[d] (+ channel)
  int64_t ctiles, ntl1, ntl2, tiles;
  int ct, th, nseg, e0, e1, e2, kp2, narrow, tile_bytes, stage_bytes, nbuf;  // stage: tile, then taps
  int act, has_bias;
  FastDiv fd_vpp, fd_e1, fd_e2, fd_k1, fd_k2;  // copies per pixel / tap (ct / copy width), e1, e2, taps[1..2]
};

// Loads N consecutive T from shared memory (8 or 16 bytes) and converts them to Acc.
template <class T, class Acc, int N> __device__ __forceinline__ void LdSharedAcc(const T* p, Acc (&o)[N]) {
  static_assert(N * sizeof(T) == 16 || N * sizeof(T) == 8, "vector size");
  if constexpr (N * sizeof(T) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const unsigned wd[4] = {u.x, u.y, u.z, u.w};
    UnpackWords<T, Acc, N>(wd, o);
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const unsigned wd[2] = {u.x, u.y};
    UnpackWords<T, Acc, N>(wd, o);
  }
}

// Copies BYTES (8 or 16) global -> shared, or zero-fills them when !ok (no global read then; gsrc still valid).
template <int BYTES> __device__ __forceinline__ void CopyAsync(void* sdst, const void* gsrc, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(sdst));
  const int n = ok ? BYTES : 0;
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gsrc), "r"(n) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(sa), "l"(gsrc), "r"(n) : "memory");
  }
#else
  if constexpr (BYTES == 16) {
    *reinterpret_cast<uint4*>(sdst) = ok ? __ldg(reinterpret_cast<const uint4*>(gsrc)) : make_uint4(0, 0, 0, 0);
  } else {
    *reinterpret_cast<uint2*>(sdst) = ok ? __ldg(reinterpret_cast<const uint2*>(gsrc)) : make_uint2(0, 0);
  }
#endif
}
__device__ __forceinline__ void CopyAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most PENDING of this thread's committed copy groups are still in flight.
template <int PENDING> __device__ __forceinline__ void CopyAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// Stages the source tile: pixel (s0, s1, s2) of the E0 x E1 x E2 tile, channels [c0, c0 + CT), N elements per
// copy. Source positions q = lo + s; zero outside the source or past the last channel.
template <class T, int N>
__device__ __forceinline__ void StageSource(const DvArgs& g, const T* __restrict__ src, T* tile, int64_t n,
                                            const int64_t lo[3], int64_t c0, int cvalid) {
  const unsigned vpp = g.fd_vpp.d, uE1 = g.fd_e1.d, uE2 = g.fd_e2.d;
  const unsigned total = static_cast<unsigned>(g.e0) * uE1 * uE2 * vpp;
  const T* base = src + n * g.sN + c0;
  for (unsigned e = threadIdx.x; e < total; e += blockDim.x) {
    const unsigned pix = Div(e, g.fd_vpp), cv = e - pix * vpp;
    const unsigned p01 = Div(pix, g.fd_e2), s2 = pix - p01 * uE2;
    const unsigned s0 = Div(p01, g.fd_e1), s1 = p01 - s0 * uE1;
    const int64_t q0 = lo[0] + s0, q1 = lo[1] + s1, q2 = lo[2] + s2;
    const int cc = static_cast<int>(cv) * N;
    const bool ok = cc < cvalid && q0 >= 0 && q0 < g.lim[0] && q1 >= 0 && q1 < g.lim[1] && q2 >= 0 && q2 < g.lim[2];
    const T* gp = ok ? base + q0 * g.sS[0] + q1 * g.sS[1] + q2 * g.sS[2] + cc : src;
    CopyAsync<N * sizeof(T)>(tile + static_cast<size_t>(pix) * g.ct + cc, gp, ok);
  }
}

// Stages the taps (flipped order f') of channels [c0, c0 + cvalid): wsm[((f0 * K1 + f1) * kp2 + f2) * CT + c].
template <class T, int N>
__device__ __forceinline__ void StageTaps(const DvArgs& g, const T* __restrict__ w, T* wsm, int64_t c0, int cvalid) {
  const unsigned vpp = g.fd_vpp.d, K1 = g.fd_k1.d, K2 = g.fd_k2.d;
  const unsigned total = static_cast<unsigned>(g.taps[0]) * K1 * K2 * vpp;
  for (unsigned e = threadIdx.x; e < total; e += blockDim.x) {
    const unsigned tap = Div(e, g.fd_vpp), cv = e - tap * vpp;
    const unsigned f01 = Div(tap, g.fd_k2), f2 = tap - f01 * K2;
    const unsigned f0 = Div(f01, g.fd_k1), f1 = f01 - f0 * K1;
    const int cc = static_cast<int>(cv) * N;
    if (cc >= cvalid) continue;
    CopyAsync<N * sizeof(T)>(wsm + (static_cast<size_t>(f01) * g.kp2 + f2) * g.ct + cc,
                             w + g.wbase + f0 * g.wstep[0] + f1 * g.wstep[1] + f2 * g.wstep[2] + c0 + cc, true);
  }
}

// Where tile t lies: batch n, output D position o0, first output row / column, source origin lo, channels.
struct VecTilePos {
  int64_t n, o0, o1, o2, lo[3], c0;
  int cvalid;  // channels of the tile inside [0, c): a multiple of VL
};
template <int R, int A> __device__ __forceinline__ VecTilePos TileAt(const DvArgs& g, int64_t t) {
  VecTilePos r;
  int64_t q;
  q = DivNN(t, g.ntl2); const int64_t tw = t - q * g.ntl2; t = q;
  q = DivNN(t, g.ntl1); const int64_t th = t - q * g.ntl1; t = q;
  q = DivNN(t, g.tsp[0]); r.o0 = t - q * g.tsp[0]; t = q;
  q = DivNN(t, g.ctiles); const int64_t ct = t - q * g.ctiles; t = q;
  r.n = t;
  r.o1 = th * g.th;
  r.o2 = tw * (static_cast<int64_t>(g.nseg) * R);
  r.lo[0] = r.o0 * g.alpha[0] + g.beta[0];
  r.lo[1] = r.o1 * g.alpha[1] + g.beta[1];
  r.lo[2] = r.o2 * A + g.beta[2];
  r.c0 = ct * g.ct;
  r.cvalid = static_cast<int>(g.c - r.c0 < g.ct ? g.c - r.c0 : g.ct);
  return r;
}

// Taps f in [*lo, *hi] keep q = b + f * step inside [0, lim) (step > 0); the rest read only zero padding.
__device__ __forceinline__ void TapRange(int64_t b, int64_t step, int64_t lim, int64_t taps, int* lo, int* hi) {
  const int64_t l = b >= 0 ? 0 : DivNN(-b + step - 1, step);
  const int64_t h = lim - 1 - b < 0 ? -1 : DivNN(lim - 1 - b, step);
  *lo = static_cast<int>(l < taps ? l : taps);
  *hi = static_cast<int>(h < taps - 1 ? h : taps - 1);
}

template <class T, class TO, int U, int A>
__global__ void __launch_bounds__(kThreads, 2) DwVecKernel(const DvArgs g, const T* __restrict__ src,
                                                           const T* __restrict__ w, const TO* __restrict__ bias,
                                                           TO* __restrict__ dst) {
  using Acc = typename AccOf<T>::type;
  constexpr int VA = 16 / sizeof(Acc);  // channels per thread item
  constexpr int VL = 16 / sizeof(T);    // channels per 16-byte copy
  constexpr int R = VecR(A, sizeof(Acc));
  constexpr int H = (R - 1) * A;  // window registers carried between tap steps
  constexpr int WN = H + U;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int CT = g.ct, E1 = g.e1, E2 = g.e2, KP2 = g.kp2;
  const int K1 = static_cast<int>(g.taps[1]), K2 = static_cast<int>(g.taps[2]);
  const int lanes = CT / VA;
  const int items = lanes * g.th * g.nseg;
  const int g0 = static_cast<int>(g.gamma[0]), g1 = static_cast<int>(g.gamma[1]), a1 = static_cast<int>(g.alpha[1]);
  auto stage = [&](int64_t t, int buf) {
    const VecTilePos tp = TileAt<R, A>(g, t);
    T* tile = reinterpret_cast<T*>(smem_raw + buf * g.stage_bytes);
    T* wsm = reinterpret_cast<T*>(smem_raw + buf * g.stage_bytes + g.tile_bytes);
    if (g.narrow) {
      StageSource<T, VA>(g, src, tile, tp.n, tp.lo, tp.c0, tp.cvalid);
      StageTaps<T, VA>(g, w, wsm, tp.c0, tp.cvalid);
    } else {
      StageSource<T, VL>(g, src, tile, tp.n, tp.lo, tp.c0, tp.cvalid);
      StageTaps<T, VL>(g, w, wsm, tp.c0, tp.cvalid);
    }
  };

  int64_t t = blockIdx.x;
  if (g.nbuf == 2 && t < g.tiles) stage(t, 0);
  CopyAsyncCommit();
  for (int iter = 0; t < g.tiles; t += gridDim.x, ++iter) {
    // two stages: copy tile t + gridDim.x into the other buffer (last read before the previous trailing
    // barrier) while tile t computes; one stage: copy tile t now
    const int buf = g.nbuf == 2 ? (iter & 1) : 0;
    if (g.nbuf == 2) {
      if (t + gridDim.x < g.tiles) stage(t + gridDim.x, buf ^ 1);
    } else {
      stage(t, 0);
    }
    CopyAsyncCommit();  // possibly empty: the group count stays regular
    if (g.nbuf == 2) CopyAsyncWait<1>();
    else CopyAsyncWait<0>();
    __syncthreads();  // every thread's copies of tile t have landed

    const VecTilePos tp = TileAt<R, A>(g, t);
    const T* tile = reinterpret_cast<const T*>(smem_raw + buf * g.stage_bytes);
    const T* wsm = reinterpret_cast<const T*>(smem_raw + buf * g.stage_bytes + g.tile_bytes);
    const int64_t n = tp.n, o0 = tp.o0, c0 = tp.c0;
    const int cvalid = tp.cvalid;
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
      // lane fastest, then row (consecutive rows are an odd number of pixels apart: fewer bank conflicts)
      const int lane = it % lanes, rs = it / lanes;
      const int r = rs % g.th, seg = rs / g.th;
      const int cc = lane * VA;
      const int64_t o1 = tp.o1 + r, o2 = tp.o2 + static_cast<int64_t>(seg) * R;
      if (cc >= cvalid || o1 >= g.tsp[1] || o2 >= g.tsp[2]) continue;
      Acc acc[R][VA];
#pragma unroll
      for (int m = 0; m < R; ++m)
#pragma unroll
        for (int v = 0; v < VA; ++v) acc[m][v] = Acc(0);
      int f0lo, f0hi, f1lo, f1hi;
      TapRange(tp.lo[0], g0, g.lim[0], g.taps[0], &f0lo, &f0hi);
      TapRange(o1 * g.alpha[1] + g.beta[1], g1, g.lim[1], K1, &f1lo, &f1hi);
#pragma unroll 1
      for (int f0 = f0lo; f0 <= f0hi; ++f0) {
#pragma unroll 1
        for (int f1 = f1lo; f1 <= f1hi; ++f1) {
          const T* ip = tile + ((f0 * g0 * E1 + r * a1 + f1 * g1) * E2 + seg * R * A) * CT + cc;
          const T* wp = wsm + ((f0 * K1 + f1) * KP2) * CT + cc;
          Acc win[WN][VA];
#pragma unroll
          for (int j = 0; j < H; ++j) LdSharedAcc<T, Acc, VA>(ip + j * CT, win[j]);
#pragma unroll 1
          for (int fc = 0; fc < K2; fc += U) {
            // win[j] holds window column fc + j: output m, tap fc + u reads column m * A + fc + u
#pragma unroll
            for (int j = 0; j < U; ++j) LdSharedAcc<T, Acc, VA>(ip + (fc + H + j) * CT, win[H + j]);
#pragma unroll
            for (int u = 0; u < U; ++u) {
              if (fc + u < K2) {  // columns past the last tap are never multiplied (they may hold real data)
                Acc wv[VA];
                LdSharedAcc<T, Acc, VA>(wp + (fc + u) * CT, wv);
#pragma unroll
                for (int m = 0; m < R; ++m)
#pragma unroll
                  for (int v = 0; v < VA; ++v) acc[m][v] = fma(win[m * A + u][v], wv[v], acc[m][v]);
              }
            }
#pragma unroll
            for (int j = 0; j < H; ++j)
#pragma unroll
              for (int v = 0; v < VA; ++v) win[j][v] = win[j + U][v];
          }
        }
      }
      Acc bv[VA];
#pragma unroll
      for (int v = 0; v < VA; ++v) bv[v] = Acc(0);
      if (g.has_bias) {
#pragma unroll
        for (int v = 0; v < VA; ++v) bv[v] = ToAcc(bias[c0 + cc + v]);
      }
      TO* dp = dst + n * g.dN + o0 * g.dS[0] + o1 * g.dS[1] + o2 * g.dS[2] + c0 + cc;
#pragma unroll
      for (int m = 0; m < R; ++m) {
        if (o2 + m < g.tsp[2]) {
          Acc o[VA];
#pragma unroll
          for (int v = 0; v < VA; ++v) o[v] = Activate(acc[m][v] + bv[v], g.act);
          StGlobal<TO, Acc, VA>(dp + m * g.dS[2], o);
        }
      }
    }
    __syncthreads();  // all reads of this buffer are done before it is refilled
  }
}

struct VecTile {
  int ct = 0, th = 0, nseg = 0, e0 = 0, e1 = 0, e2 = 0, kp2 = 0, tile_bytes = 0, stage_bytes = 0, nbuf = 1;
  int items = 0;
  int64_t smem = 0;
  double busy = 0, bytes_per_item = 0;
};

inline int ThreadsFor(int64_t items) {  // block size of the vectorised kernel: 64..kThreads, whole warps
  return static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(64, CeilDiv(items, 32) * 32)));
}

// Picks the channel tile, the output tile and the stage count of the vectorised kernel (a function of the
// problem only). Preference: as many thread items as threads (up to kThreads), then two stages, then the
// widest channel tile (longer contiguous global rows), then the least halo per item. False: nothing fits.
inline bool PlanVecTile(const DvArgs& g, int tsize, int va, int U, int A, int R, VecTile* best) {
  const int64_t K0 = g.taps[0], K1 = g.taps[1], K2 = g.taps[2];
  const int64_t kp2 = CeilDiv(K2, U) * U;
  const int64_t e0 = (K0 - 1) * g.gamma[0] + 1;
  const int64_t span1 = (K1 - 1) * g.gamma[1] + 1;
  if (e0 > 4096 || span1 > 4096 || kp2 > 4096) return false;  // keeps the products below small
  const int64_t segs = CeilDiv(g.tsp[2], R);
  const int64_t target = K0 * K1 * K2 <= 16 ? 2 * kThreads : kThreads;  // small filters: 2 items per thread
  static const int kCts[] = {64, 48, 32, 16, 8, 4};
  int ct_max = 4;  // the widest channel tile wasting at most 1/8 of the channels in the last tile
  for (int ct : kCts) {
    if (CeilDiv(g.c, ct) * ct - g.c <= g.c / 8) { ct_max = ct; break; }
  }
  bool found = false;
  VecTile pick[3];  // best per stage count (index nbuf)
  bool have[3] = {false, false, false};
  for (int nbuf = 2; nbuf >= 1; --nbuf) {
    const int64_t limit = kVecSmem / nbuf;
    for (int ct : kCts) {
      if (ct > ct_max || ct % va != 0) continue;
      const int64_t lanes = ct / va;
      const int64_t taps_bytes = CeilDiv(K0 * K1 * kp2 * ct * tsize, 16) * 16;
      VecTile bt;
      bool bt_ok = false;
      for (int64_t nseg0 = std::min<int64_t>(segs, std::max<int64_t>(1, target / lanes)); nseg0 >= 1; --nseg0) {
        const int64_t nseg = CeilDiv(segs, CeilDiv(segs, nseg0));  // even W tiles (<= nseg0)
        if (nseg != nseg0) continue;  // visited as its own nseg0
        int64_t e2 = (nseg * R - 1) * A + kp2;
        if (e2 % 2 == 0) ++e2;  // odd pixel count per row: rows of a warp fall on different banks
        const int64_t row_bytes = e0 * e2 * ct * tsize;
        const int64_t avail = limit - taps_bytes - 16;
        if (avail < row_bytes * span1) continue;
        const int64_t th_fit = (avail / row_bytes - span1) / g.alpha[1] + 1;
        int64_t th = std::min<int64_t>({th_fit, g.tsp[1], std::max<int64_t>(1, target / (lanes * nseg))});
        th = CeilDiv(g.tsp[1], CeilDiv(g.tsp[1], th));  // even H tiles (<= th)
        VecTile t;
        t.ct = ct; t.th = static_cast<int>(th); t.nseg = static_cast<int>(nseg); t.nbuf = nbuf;
        t.e0 = static_cast<int>(e0); t.e1 = static_cast<int>((th - 1) * g.alpha[1] + span1);
        t.e2 = static_cast<int>(e2); t.kp2 = static_cast<int>(kp2);
        t.tile_bytes = static_cast<int>(CeilDiv(e0 * t.e1 * e2 * ct * tsize, 16) * 16);
        t.stage_bytes = static_cast<int>(t.tile_bytes + taps_bytes);
        t.smem = static_cast<int64_t>(t.stage_bytes) * nbuf;
        t.items = static_cast<int>(lanes * th * nseg);
        if (t.smem > kVecSmem) continue;
        // FastDiv exactness: copy and pixel counts (< smem / 8 bytes) and divisors stay below 2^16
        if (t.e1 >= 65536 || t.e2 >= 65536 || K1 * K2 >= 65536) continue;
        // busy threads per round (rounds = items / threads, rounded up) and shared bytes per useful item
        // (tiles past the output edge hold idle items)
        t.busy = static_cast<double>(t.items) / CeilDiv(t.items, ThreadsFor(t.items));
        const double useful =
            static_cast<double>(lanes) * g.tsp[1] / CeilDiv(g.tsp[1], th) * segs / CeilDiv(segs, nseg);
        t.bytes_per_item = t.stage_bytes / useful;
        if (!bt_ok || t.busy > bt.busy + 0.5 || (t.busy > bt.busy - 0.5 && t.bytes_per_item < bt.bytes_per_item)) {
          bt = t;
          bt_ok = true;
        }
      }
      if (!bt_ok) continue;
      if (!have[nbuf] || bt.busy > pick[nbuf].busy + 0.5) {
        pick[nbuf] = bt;
        have[nbuf] = true;
      }
    }
  }
  if (have[2] && (!have[1] || pick[2].busy > pick[1].busy - 0.5)) {
    *best = pick[2];
    found = true;
  } else if (have[1]) {
    *best = pick[1];
    found = true;
  }
  return found;
}

template <class T, class TO, int U, int A>
cudaError_t LaunchVecKernel(const DvArgs& g, int threads, int64_t smem, const void* src, const void* w,
                            const void* bias, void* dst, cudaStream_t s) {
  auto kern = DwVecKernel<T, TO, U, A>;
  if (const cudaError_t e = AllowDynamicSmem(kern, static_cast<size_t>(smem)); e != cudaSuccess) return e;
  // two stages: persistent blocks (about two per SM of an H100) that each prefetch their next tile
  int64_t grid = g.tiles;
  if (g.nbuf == 2) grid = CeilDiv(g.tiles, CeilDiv(g.tiles, 2 * kPlanSms));
  kern<<<GridX(grid), threads, smem, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                          static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

// The vector kernel's arguments and launch shape (a function of the problem only).
struct VecLaunch {
  DvArgs g{};
  VecTile t;
  int u = 4, a = 1, threads = 0;
};

// Plans the vector kernel for op (fwd or dgrad): "" with *out filled, else why it does not take the problem.
std::string PlanVec(const ConvParams& p, Op op, DType in, VecLaunch* out) {
  const DwArgs a = MakeDwArgs(p, op);
  const int acc_bytes = static_cast<int>(AccBytes(in)), tsize = DTypeBytes(in);
  const int VA = 16 / acc_bytes;
  const int VL = 16 / tsize;
  if (!a.cl || a.sC != 1 || a.dC != 1 || a.wC != 1) return "it takes channels-last layouts";
  if (a.c % VL != 0) return "it takes c a multiple of one 16-byte vector";
  if (DwDstElements(a) <= 0) return "it takes non-empty outputs";
  DvArgs g{};
  g.n = a.n;
  g.c = a.c;
  g.wbase = 0;
  for (int d = 0; d < 3; ++d) {
    if (a.delta[d] != 1) return "it takes no lhs dilation in the forward and unit strides in the data gradient";
    if (a.taps[d] < 1 || a.gamma[d] == 0) return "it takes non-empty windows";
    g.tsp[d] = a.tsp[d];
    g.taps[d] = a.taps[d];
    g.alpha[d] = a.alpha[d];
    g.lim[d] = a.lim[d];
    g.sS[d] = a.sS[d];
    g.dS[d] = a.dS[d];
    if (a.gamma[d] < 0) {  // f' = taps - 1 - f makes the step positive
      g.beta[d] = a.beta[d] + (a.taps[d] - 1) * a.gamma[d];
      g.gamma[d] = -a.gamma[d];
      g.wbase += (a.taps[d] - 1) * a.wF[d];
      g.wstep[d] = -a.wF[d];
    } else {
      g.beta[d] = a.beta[d];
      g.gamma[d] = a.gamma[d];
      g.wstep[d] = a.wF[d];
    }
  }
  if (g.gamma[2] != 1 || (g.alpha[2] != 1 && g.alpha[2] != 2)) return "it takes W dilation 1 and a W step of 1 or 2";
  // tile-local shared-memory offsets are int: keep every per-dim factor modest
  if (g.gamma[0] > 64 || g.gamma[1] > 64 || g.alpha[1] > 64) return "it takes D and H dilations and H steps up to 64";
  g.sN = a.sN;
  g.dN = a.dN;
  g.act = a.act;
  g.has_bias = a.has_bias;
  const int A = static_cast<int>(g.alpha[2]);
  const int U = g.taps[2] <= 4 || A == 2 ? 4 : 8;  // U = 8 with stride 2 would spill
  const int R = VecR(A, acc_bytes);
  VecTile t;
  if (!PlanVecTile(g, tsize, VA, U, A, R, &t)) return "no tile fits its shared memory";
  g.ct = t.ct;
  g.th = t.th;
  g.nseg = t.nseg;
  g.e0 = t.e0;
  g.e1 = t.e1;
  g.e2 = t.e2;
  g.kp2 = t.kp2;
  g.tile_bytes = t.tile_bytes;
  g.stage_bytes = t.stage_bytes;
  g.nbuf = t.nbuf;
  g.narrow = t.ct % VL != 0;
  g.fd_vpp = MakeFastDiv(t.ct / (g.narrow ? VA : VL));
  g.fd_e1 = MakeFastDiv(t.e1);
  g.fd_e2 = MakeFastDiv(t.e2);
  g.fd_k1 = MakeFastDiv(g.taps[1]);
  g.fd_k2 = MakeFastDiv(g.taps[2]);
  g.ctiles = CeilDiv(g.c, t.ct);
  g.ntl1 = CeilDiv(g.tsp[1], t.th);
  g.ntl2 = CeilDiv(CeilDiv(g.tsp[2], R), t.nseg);
  g.tiles = g.n * g.ctiles * g.tsp[0] * g.ntl1 * g.ntl2;
  out->g = g;
  out->t = t;
  out->u = U;
  out->a = A;
  out->threads = ThreadsFor(t.items);
  return {};
}

template <class T, class TO>
cudaError_t RunVec(const VecLaunch& v, const void* src, const void* w, const void* bias, void* dst, cudaStream_t s) {
  if (v.g.tiles <= 0) return cudaSuccess;
  if (v.u == 4 && v.a == 1) return LaunchVecKernel<T, TO, 4, 1>(v.g, v.threads, v.t.smem, src, w, bias, dst, s);
  if (v.u == 4 && v.a == 2) return LaunchVecKernel<T, TO, 4, 2>(v.g, v.threads, v.t.smem, src, w, bias, dst, s);
  return LaunchVecKernel<T, TO, 8, 1>(v.g, v.threads, v.t.smem, src, w, bias, dst, s);
}

// ---- channels-last vectorised wgrad (no lhs dilation) ----
// A block owns (tap group, channel tile, split): the group is one f0, RH consecutive f1 and TK consecutive f2;
// thread (lane, rt) owns VA consecutive channels and accumulates all RH * TK taps in registers over "units"
// (one output row (n, o0, o1) and a segment of at most kWSeg outputs along W) rt, rt + rowt, ... of its split.
// With W stride and dilation 1 it walks the source columns k once, keeping the TK most recent dy vectors in
// registers (pairs (x[k], dy[o]) with k = o - pad + f2), so each step loads 1 dy and RH x vectors for
// RH * TK vector FMAs; otherwise it loads x per tap. A fixed-order in-block reduction over rt, then per-split
// partials go to scratch and ReduceSplits adds them in a fixed order (deterministic).
constexpr int64_t kWSeg = 256;

struct DvWArgs {
  int64_t c, osp[3], in[3], taps[3], stride[3], pad[3], rdil[3];
  int64_t xN, xS[3], dN, dS[3], wF[3];
  int64_t segw, nsegw, units, per_split, splits, ng1, ng2, ngroups, ctiles, blocks, welems;
  int ct, lanes, rowt;
};

// 14 accumulated taps do not fit 128 registers: one block per SM there, no spills.
template <class T, class TO, int TK, int RH, bool SLIDE>
__global__ void __launch_bounds__(kThreads, TK * RH > 12 ? 1 : 2)
    DwVecWgradKernel(const DvWArgs g, const T* __restrict__ x, const T* __restrict__ dy, TO* __restrict__ dw,
                     typename AccOf<T>::type* __restrict__ scratch) {
  using Acc = typename AccOf<T>::type;
  constexpr int VA = 16 / sizeof(Acc);
  __shared__ __align__(16) Acc red[kThreads * VA];
  const int tid = threadIdx.x;
  const int lane = tid % g.lanes, rt = tid / g.lanes;
  const int K1 = static_cast<int>(g.taps[1]), K2 = static_cast<int>(g.taps[2]);
  for (int64_t b = blockIdx.x; b < g.blocks; b += gridDim.x) {
    int64_t rem = b, q;
    q = DivNN(rem, g.ngroups); const int64_t grp = rem - q * g.ngroups; rem = q;
    q = DivNN(rem, g.ctiles); const int64_t ct = rem - q * g.ctiles; rem = q;
    const int64_t split = rem;
    q = DivNN(grp, g.ng2); const int fk0 = static_cast<int>(grp - q * g.ng2) * TK;
    const int64_t g01 = q;
    q = DivNN(g01, g.ng1); const int fr0 = static_cast<int>(g01 - q * g.ng1) * RH;
    const int64_t f0 = q;
    const int64_t c0 = ct * g.ct;
    const int cvalid = static_cast<int>(g.c - c0 < g.ct ? g.c - c0 : g.ct);
    const int cc = lane * VA;
    Acc acc[RH][TK][VA];
#pragma unroll
    for (int i = 0; i < RH; ++i)
#pragma unroll
      for (int j = 0; j < TK; ++j)
#pragma unroll
        for (int v = 0; v < VA; ++v) acc[i][j][v] = Acc(0);
    const int64_t ubeg = split * g.per_split;
    const int64_t uend = min(g.units, ubeg + g.per_split);
    if (rt < g.rowt && cc < cvalid) {
      for (int64_t u = ubeg + rt; u < uend; u += g.rowt) {
        int64_t r = u;
        q = DivNN(r, g.nsegw); const int64_t sw = r - q * g.nsegw; r = q;
        q = DivNN(r, g.osp[1]); const int64_t o1 = r - q * g.osp[1]; r = q;
        q = DivNN(r, g.osp[0]); const int64_t o0 = r - q * g.osp[0]; r = q;
        const int64_t n = r;
        const int64_t q0 = o0 * g.stride[0] - g.pad[0] + f0 * g.rdil[0];
        if (q0 < 0 || q0 >= g.in[0]) continue;  // every tap of the group reads padding
        const int64_t o2a = sw * g.segw, o2b = min(o2a + g.segw, g.osp[2]);
        const T* xr[RH];
        bool rv[RH];
#pragma unroll
        for (int i = 0; i < RH; ++i) {
          const int64_t q1 = o1 * g.stride[1] - g.pad[1] + (fr0 + i) * g.rdil[1];
          rv[i] = fr0 + i < K1 && q1 >= 0 && q1 < g.in[1];
          xr[i] = x + n * g.xN + q0 * g.xS[0] + (rv[i] ? q1 : 0) * g.xS[1] + c0 + cc;
        }
        const T* dyr = dy + n * g.dN + o0 * g.dS[0] + o1 * g.dS[1] + c0 + cc;
        if constexpr (SLIDE) {
          // Step k (source column) loads dy[o2 = k + pad - fk0] into ring slot (k - kb) % TK; then slot
          // (s - j) % TK holds dy[k + pad - fk0 - j], the partner of x column k for tap fk0 + j, when that
          // output lies in [o2a, o2b) (else the pair is skipped: an inf in x must not reach a tap that never
          // sees it through a 0 * inf). Steps go TK at a time so every slot index is a compile-time constant.
          Acc dyw[TK][VA];
#pragma unroll
          for (int j = 0; j < TK; ++j)
#pragma unroll
            for (int v = 0; v < VA; ++v) dyw[j][v] = Acc(0);
          const int64_t kb = o2a - g.pad[2] + fk0, ke = o2b - 1 - g.pad[2] + fk0 + TK - 1;
          const unsigned len = static_cast<unsigned>(o2b - o2a);  // <= kWSeg
          for (int64_t k0 = kb; k0 <= ke; k0 += TK) {
#pragma unroll
            for (int s = 0; s < TK; ++s) {
              const int64_t k = k0 + s;
              if (k > ke) break;
              const int64_t o2 = k + g.pad[2] - fk0;
              if (o2 < o2b) {
                LdGlobalAcc<T, Acc, VA>(dyr + o2 * g.dS[2], dyw[s]);
              } else {
#pragma unroll
                for (int v = 0; v < VA; ++v) dyw[s][v] = Acc(0);
              }
              const bool kv = k >= 0 && k < g.in[2];
              const int step = static_cast<int>(k - kb);  // < kWSeg + TK
#pragma unroll
              for (int i = 0; i < RH; ++i) {
                if (rv[i] && kv) {
                  Acc xv[VA];
                  LdGlobalAcc<T, Acc, VA>(xr[i] + k * g.xS[2], xv);
#pragma unroll
                  for (int j = 0; j < TK; ++j) {
                    if (static_cast<unsigned>(step - j) < len) {  // output o2a + step - j is in the unit
#pragma unroll
                      for (int v = 0; v < VA; ++v)
                        acc[i][j][v] = fma(xv[v], dyw[(s - j + TK) % TK][v], acc[i][j][v]);
                    }
                  }
                }
              }
            }
          }
        } else {
          for (int64_t o2 = o2a; o2 < o2b; ++o2) {
            Acc dv[VA];
            LdGlobalAcc<T, Acc, VA>(dyr + o2 * g.dS[2], dv);
#pragma unroll
            for (int j = 0; j < TK; ++j) {
              const int64_t k = o2 * g.stride[2] - g.pad[2] + (fk0 + j) * g.rdil[2];
              if (fk0 + j >= K2 || k < 0 || k >= g.in[2]) continue;
#pragma unroll
              for (int i = 0; i < RH; ++i) {
                if (rv[i]) {
                  Acc xv[VA];
                  LdGlobalAcc<T, Acc, VA>(xr[i] + k * g.xS[2], xv);
#pragma unroll
                  for (int v = 0; v < VA; ++v) acc[i][j][v] = fma(xv[v], dv[v], acc[i][j][v]);
                }
              }
            }
          }
        }
      }
    }
    // fixed-order reduction over rt, one tap at a time (the tap conditions are block-uniform)
#pragma unroll
    for (int i = 0; i < RH; ++i) {
#pragma unroll
      for (int j = 0; j < TK; ++j) {
        if (fr0 + i >= K1 || fk0 + j >= K2) continue;
        __syncthreads();
#pragma unroll
        for (int v = 0; v < VA; ++v) red[tid * VA + v] = acc[i][j][v];
        __syncthreads();
        if (tid < cvalid) {
          Acc s = Acc(0);
          for (int k = 0; k < g.rowt; ++k) s += red[k * g.lanes * VA + tid];
          const int64_t off = f0 * g.wF[0] + (fr0 + i) * g.wF[1] + (fk0 + j) * g.wF[2] + c0 + tid;
          if (g.splits == 1) dw[off] = FromAcc<TO>(s);
          else scratch[split * g.welems + off] = s;
        }
      }
    }
  }
}

// The vectorised wgrad's plan: a function of the problem only (the splits fix the workspace size).
struct VecWgradPlan {
  bool ok = false;
  int ct = 0, lanes = 0, rowt = 0, tk = 0, rh = 0;
  bool slide = false;  // W stride and dilation 1
  int64_t ctiles = 0, ng1 = 0, ng2 = 0, ngroups = 0, segw = 0, nsegw = 0, units = 0, splits = 1;
};

inline VecWgradPlan PlanVecWgrad(const ConvParams& p, DType in) {
  VecWgradPlan pl;
  const int tsize = in == DType::kF64 ? 8 : in == DType::kF32 ? 4 : 2;
  const int va = in == DType::kF64 ? 2 : 4;
  const int vl = 16 / tsize;
  const int64_t c = p.c[0];
  if (p.layout[0] != kChannelsLast || c % vl != 0 || c <= 0) return pl;
  for (int d = 0; d < 3; ++d) {
    if (p.lhs_dil[d] != 1 || p.win[d] < 1 || p.out[d] < 1 || p.in[d] < 1) return pl;
  }
  if (p.n[0] < 1 || p.win[1] > (int64_t(1) << 20) || p.win[2] > (int64_t(1) << 20)) return pl;
  static const int kCts[] = {64, 32, 16, 8, 4};
  pl.ct = 4;  // a multiple of VA (loads are VA elements wide)
  for (int ct : kCts) {
    if (CeilDiv(c, ct) * ct - c <= c / 8) { pl.ct = ct; break; }
  }
  pl.lanes = pl.ct / va;
  pl.rowt = kThreads / pl.lanes;
  pl.slide = p.stride[2] == 1 && p.rhs_dil[2] == 1;
  // register tiles (TK x RH taps) sized to stay within 128 registers
  pl.tk = p.win[2] <= 4 || !pl.slide ? 4 : 7;
  pl.rh = !pl.slide || p.win[1] == 1 || in == DType::kF64 ? 1 : p.win[2] > 4 ? 2 : 3;  // f64: twice the registers
  pl.ctiles = CeilDiv(c, pl.ct);
  pl.ng1 = CeilDiv(p.win[1], pl.rh);
  pl.ng2 = CeilDiv(p.win[2], pl.tk);
  pl.ngroups = p.win[0] * pl.ng1 * pl.ng2;
  pl.segw = std::min<int64_t>(p.out[2], kWSeg);
  pl.nsegw = CeilDiv(p.out[2], pl.segw);
  pl.units = p.n[0] * p.out[0] * p.out[1] * pl.nsegw;
  const int64_t base = pl.ctiles * pl.ngroups;
  int64_t splits = CeilDiv(4 * kPlanSms, base);
  splits = std::min<int64_t>(splits, pl.units / pl.rowt);  // every thread gets a unit
  splits = std::min<int64_t>(splits, 1024);
  const int64_t per = WElements(p) * static_cast<int64_t>(AccBytes(in));
  if (per > 0) splits = std::min<int64_t>(splits, (int64_t(1) << 29) / per);
  pl.splits = splits < 2 ? 1 : splits;
  pl.ok = true;
  return pl;
}

template <class T, class TO, int TK, int RH, bool SLIDE>
cudaError_t LaunchVecWgrad(const DvWArgs& g, const void* x, const void* dy, void* dw, void* scratch, cudaStream_t s) {
  DwVecWgradKernel<T, TO, TK, RH, SLIDE><<<GridX(g.blocks), kThreads, 0, s>>>(
      g, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<TO*>(dw),
      static_cast<typename AccOf<T>::type*>(scratch));
  return cudaGetLastError();
}

template <class T, class TO>
cudaError_t RunVecWgrad(const ConvParams& p, const VecWgradPlan& pl, const void* x, const void* dy, void* dw,
                        void* scratch, cudaStream_t s) {
  const Strides5 xs = XStrides(p), ys = YStrides(p), ws = WStrides(p);
  DvWArgs g{};
  g.c = p.c[0];
  for (int d = 0; d < 3; ++d) {
    g.osp[d] = p.out[d];
    g.in[d] = p.in[d];
    g.taps[d] = p.win[d];
    g.stride[d] = p.stride[d];
    g.pad[d] = p.pad_lo[d];
    g.rdil[d] = p.rhs_dil[d];
    g.xS[d] = xs.s[2 + d];
    g.dS[d] = ys.s[2 + d];
    g.wF[d] = ws.s[2 + d];
  }
  g.xN = xs.s[0];
  g.dN = ys.s[0];
  g.segw = pl.segw;
  g.nsegw = pl.nsegw;
  g.units = pl.units;
  g.splits = pl.splits < 1 ? 1 : pl.splits;
  g.per_split = std::max<int64_t>(1, CeilDiv(g.units, g.splits));
  g.ng1 = pl.ng1;
  g.ng2 = pl.ng2;
  g.ngroups = pl.ngroups;
  g.ctiles = pl.ctiles;
  g.blocks = g.ctiles * g.ngroups * g.splits;
  g.welems = WElements(p);
  g.ct = pl.ct;
  g.lanes = pl.lanes;
  g.rowt = pl.rowt;
  if (!pl.slide) return LaunchVecWgrad<T, TO, 4, 1, false>(g, x, dy, dw, scratch, s);
  if constexpr (sizeof(typename AccOf<T>::type) == 8) {  // rh == 1
    if (pl.tk == 7) return LaunchVecWgrad<T, TO, 7, 1, true>(g, x, dy, dw, scratch, s);
    return LaunchVecWgrad<T, TO, 4, 1, true>(g, x, dy, dw, scratch, s);
  } else {
    if (pl.tk == 7 && pl.rh == 1) return LaunchVecWgrad<T, TO, 7, 1, true>(g, x, dy, dw, scratch, s);
    if (pl.tk == 7) return LaunchVecWgrad<T, TO, 7, 2, true>(g, x, dy, dw, scratch, s);
    if (pl.rh == 1) return LaunchVecWgrad<T, TO, 4, 1, true>(g, x, dy, dw, scratch, s);
    return LaunchVecWgrad<T, TO, 4, 3, true>(g, x, dy, dw, scratch, s);
  }
}

size_t VecWgradWorkspace(const ConvParams& p, DType in) {
  const VecWgradPlan pl = PlanVecWgrad(p, in);
  return pl.ok ? SplitPartialBytes(p, in, pl.splits) : 0;
}

}  // namespace
}  // namespace cuda

namespace variants::depthwise_vec {

std::string Applies(const Problem& pr) {
  if (!DepthwiseApplies(pr.p)) return "it takes depthwise convolutions (groups == c == k, batch_groups == 1)";
  if (pr.op == Op::kWgrad) {
    return cuda::PlanVecWgrad(pr.p, pr.in).ok
               ? std::string()
               : "it takes channels-last layouts, c a multiple of one 16-byte vector and no lhs dilation";
  }
  cuda::VecLaunch v;
  return cuda::PlanVec(pr.p, pr.op, pr.in, &v);
}

size_t Workspace(const Problem& pr) { return pr.op == Op::kWgrad ? cuda::VecWgradWorkspace(pr.p, pr.in) : 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  if (pr.op == Op::kWgrad) {
    const cuda::VecWgradPlan pl = cuda::PlanVecWgrad(pr.p, pr.in);
    if (!pl.ok) return cudaErrorNotSupported;
    if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
    if (pl.splits > 1 && (b.ws == nullptr || b.ws_bytes < Workspace(pr))) return cudaErrorInvalidValue;
    cudaError_t e = cudaSuccess;
#define JAXCONV_BODY(T, TO) e = cuda::RunVecWgrad<T, TO>(pr.p, pl, b.a, b.b, b.out, b.ws, s)
    JAXCONV_DTYPE_SWITCH(pr.in, pr.out, JAXCONV_BODY);
#undef JAXCONV_BODY
    if (e != cudaSuccess || pl.splits <= 1) return e;
    return cuda::ReduceSplits(pr.in, pr.out, b.ws, pl.splits, WElements(pr.p), b.out, s);
  }
  cuda::VecLaunch v;
  if (!cuda::PlanVec(pr.p, pr.op, pr.in, &v).empty()) return cudaErrorNotSupported;
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
  const void* bias = pr.op == Op::kFwd ? b.bias : nullptr;
#define JAXCONV_BODY(T, TO) return cuda::RunVec<T, TO>(v, b.a, b.b, bias, b.out, s)
  JAXCONV_DTYPE_SWITCH(pr.in, pr.out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace variants::depthwise_vec
}  // namespace jaxconv
