// small.chunked_wgrad: the family's general filter gradient (any strides, dilations and padding, every dtype):
// dw[f, ci, kk] = sum_{n, o} x[n, i(o, f), ci] * dy[n, o, kk]. The (tap, k) space is cut into slices of TF taps x KB
// output channels (all c, padded to CB); a block owns one slice and one chunk of consecutive positions; each thread
// strides over the chunk's positions keeping TF*CB*KB (<= 64) partial sums in registers, then the block reduces them
// in a fixed order (warp shuffles, then the 8 warps in order) and writes the slice of its chunk's partial vector to
// scratch[chunk][welems]. The family's reduction adds the chunks per element in a fixed tree order. No atomics:
// bitwise deterministic. chunks * slices ~ 4 x SMs blocks.
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/small/reduce.h"
#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

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
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_chunked_wgrad {

std::string Applies(const Problem& pr) { return cuda::small_channel::FamilyError(pr); }

size_t Workspace(const Problem& pr) {
  using namespace cuda::small_channel;
  return PartialBytes(pr, MakeWgArgs(pr.p).chunks);
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  const ScWgArgs g = MakeWgArgs(pr.p);
  if (b.ws == nullptr || b.ws_bytes < PartialBytes(pr, g.chunks)) return cudaErrorInvalidValue;
  const WgCfg cfg = PickWgCfg(pr.p);
  cudaError_t e = cudaErrorInvalidValue;
  switch (pr.in) {
    case DType::kF32: e = WgByCfg<float>(g, cfg, b.a, b.b, b.ws, s); break;
    case DType::kF64: e = WgByCfg<double>(g, cfg, b.a, b.b, b.ws, s); break;
    case DType::kBF16: e = WgByCfg<__nv_bfloat16>(g, cfg, b.a, b.b, b.ws, s); break;
    case DType::kF16: e = WgByCfg<__half>(g, cfg, b.a, b.b, b.ws, s); break;
  }
  if (e != cudaSuccess) return e;
  return ReduceChunks(pr.in, pr.out, b.ws, g.chunks, g.welems, b.out, s);
}

}  // namespace variants::small_chunked_wgrad
}  // namespace jaxconv
