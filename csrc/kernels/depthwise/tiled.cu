// depthwise.tiled: the depthwise ops for any layout, staged through shared memory.
// Forward and data gradient (stencil.cuh's view) where the source is read without holes (delta == 1: no lhs dilation
// in the forward, unit strides in the data gradient): a block stages its source tile with the halo in shared memory,
// zero-filled outside the source, so the inner loop has no bounds checks; channels-last tiles are 32 channels wide,
// channels-first tiles 32 x 32 spatial. Taken where the tile fits 48 KiB; gather.cu takes the rest.
// Filter gradient (any problem): one block per (channel tile, tap, split) reduces its positions in a fixed order in the
// block and writes per-split partials to the workspace for a fixed-order ReduceSplits (deterministic).
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
constexpr int64_t kSmemLimit = 48 * 1024;

// ---- tiled kernel (delta == 1) ----
// CL: TC = 32 channels, tile 1 x 8 x 8; thread (c, r): outputs (r, j) for j < 8.
// CF: TC = 1, tile 1 x 32 x 32; thread (w, r): outputs (r + 8 m, w) for m < 4.
template <class T, class TO, bool CL>
__global__ void __launch_bounds__(kThreads) DwTiledKernel(const DwArgs g, const T* __restrict__ src,
                                                          const T* __restrict__ w, const TO* __restrict__ bias,
                                                          TO* __restrict__ dst) {
  using Acc = typename AccOf<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* tile = reinterpret_cast<Acc*>(smem_raw);
  constexpr int TC = CL ? 32 : 1;
  constexpr int TH = CL ? 8 : 32, TW = CL ? 8 : 32;
  constexpr int R = CL ? 8 : 4;
  const int tid = threadIdx.x;
  const int64_t E0 = g.ext[0], E1 = g.ext[1], E2 = g.ext[2];
  const int64_t tile_elems = E0 * E1 * E2 * TC;

  for (int64_t t = blockIdx.x; t < g.tiles; t += gridDim.x) {
    int64_t rem = t;
    const int64_t tw = rem % g.ntl[2]; rem /= g.ntl[2];
    const int64_t th = rem % g.ntl[1]; rem /= g.ntl[1];
    const int64_t td = rem % g.ntl[0]; rem /= g.ntl[0];
    const int64_t ct = rem % g.ctiles; rem /= g.ctiles;
    const int64_t n = rem;
    const int64_t t0[3] = {td, th * TH, tw * TW};
    int64_t lo[3];
#pragma unroll
    for (int d = 0; d < 3; ++d) lo[d] = t0[d] * g.alpha[d] + g.beta[d] - g.off[d];
    const int64_t c0 = ct * TC;
    __syncthreads();
    // tile_elems * sizeof(Acc) <= 48 KiB, so 32-bit tile-local indices (and cheap 32-bit divisions) suffice
    const unsigned uE1 = static_cast<unsigned>(E1), uE2 = static_cast<unsigned>(E2);
    for (unsigned e = tid; e < static_cast<unsigned>(tile_elems); e += kThreads) {
      unsigned r2 = e;
      const unsigned cc = r2 % TC; r2 /= TC;
      const unsigned s2 = r2 % uE2; r2 /= uE2;
      const unsigned s1 = r2 % uE1; r2 /= uE1;
      const unsigned s0 = r2;
      const int64_t q0 = lo[0] + s0, q1 = lo[1] + s1, q2 = lo[2] + s2, c = c0 + cc;
      Acc v = Acc(0);
      if (c < g.c && q0 >= 0 && q0 < g.lim[0] && q1 >= 0 && q1 < g.lim[1] && q2 >= 0 && q2 < g.lim[2]) {
        v = ToAcc(src[n * g.sN + c * g.sC + q0 * g.sS[0] + q1 * g.sS[1] + q2 * g.sS[2]]);
      }
      tile[e] = v;
    }
    __syncthreads();
    const int lane = tid % 32, row = tid / 32;
    const int64_t c = CL ? c0 + lane : c0;
    Acc acc[R];
#pragma unroll
    for (int m = 0; m < R; ++m) acc[m] = Acc(0);
    if (c < g.c) {
      for (int64_t f0 = 0; f0 < g.taps[0]; ++f0) {
        const int64_t p0 = f0 * g.gamma[0] + g.off[0];  // local out d is 0
        for (int64_t f1 = 0; f1 < g.taps[1]; ++f1) {
          for (int64_t f2 = 0; f2 < g.taps[2]; ++f2) {
            const Acc wv = ToAcc(w[c * g.wC + f0 * g.wF[0] + f1 * g.wF[1] + f2 * g.wF[2]]);
            const int64_t b1 = f1 * g.gamma[1] + g.off[1];
            const int64_t b2 = f2 * g.gamma[2] + g.off[2];
#pragma unroll
            for (int m = 0; m < R; ++m) {
              const int64_t l1 = CL ? row : row + 8 * m;
              const int64_t l2 = CL ? m : lane;
              const int64_t s1 = l1 * g.alpha[1] + b1, s2 = l2 * g.alpha[2] + b2;
              acc[m] = fma(tile[((p0 * E1 + s1) * E2 + s2) * TC + (CL ? lane : 0)], wv, acc[m]);
            }
          }
        }
      }
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const int64_t o1 = t0[1] + (CL ? row : row + 8 * m);
        const int64_t o2 = t0[2] + (CL ? m : lane);
        if (o1 >= g.tsp[1] || o2 >= g.tsp[2]) continue;
        Acc v = acc[m];
        if (g.has_bias) v += ToAcc(bias[c]);
        v = Activate(v, g.act);
        dst[n * g.dN + c * g.dC + t0[0] * g.dS[0] + o1 * g.dS[1] + o2 * g.dS[2]] = FromAcc<TO>(v);
      }
    }
  }
}

// Fills the tiled kernel's staging (ext, off, tl, ntl, ctiles, tiles) and its shared memory bytes; false where the
// source has holes (delta > 1) or the tile with its halo needs more than kSmemLimit.
bool PlanTiled(DwArgs* pg, size_t acc_bytes, int64_t* smem) {
  DwArgs& g = *pg;
  for (int d = 0; d < 3; ++d) {
    if (g.delta[d] != 1) return false;
  }
  const int TC = g.cl ? 32 : 1;
  const int64_t tl[3] = {1, g.cl ? 8 : 32, g.cl ? 8 : 32};
  int64_t bytes = TC * static_cast<int64_t>(acc_bytes);
  for (int d = 0; d < 3; ++d) {
    const int64_t span = g.taps[d] == 0 ? 0 : (g.taps[d] - 1) * (g.gamma[d] < 0 ? -g.gamma[d] : g.gamma[d]);
    g.ext[d] = (tl[d] - 1) * g.alpha[d] + span + 1;
    g.off[d] = (g.taps[d] > 0 && g.gamma[d] < 0) ? -(g.taps[d] - 1) * g.gamma[d] : 0;
    g.tl[d] = tl[d];
    g.ntl[d] = CeilDiv(g.tsp[d], tl[d]);
    bytes = bytes > kSmemLimit ? bytes : bytes * g.ext[d];  // saturates past the limit (no overflow)
  }
  if (bytes > kSmemLimit) return false;
  g.ctiles = CeilDiv(g.c, TC);
  g.tiles = g.n * g.ctiles * g.ntl[0] * g.ntl[1] * g.ntl[2];
  *smem = bytes;
  return true;
}

template <class T, class TO>
cudaError_t LaunchTiled(const DwArgs& g, int64_t bytes, const void* src, const void* w, const void* bias, void* dst,
                        cudaStream_t s) {
  const dim3 grid(GridX(g.tiles));
  if (g.cl) {
    DwTiledKernel<T, TO, true><<<grid, kThreads, bytes, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                                             static_cast<const TO*>(bias), static_cast<TO*>(dst));
  } else {
    DwTiledKernel<T, TO, false><<<grid, kThreads, bytes, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                                              static_cast<const TO*>(bias), static_cast<TO*>(dst));
  }
  return cudaGetLastError();
}

// ---- wgrad ----
struct DwWgradArgs {
  int64_t n, c, osp[3], in[3], taps[3], ntaps, rtotal;
  int64_t stride[3], pad[3], ldil[3], rdil[3];
  int64_t xN, xC, xS[3], dN, dC, dS[3], wC, wF[3];
  int64_t ctiles, splits, per_split, blocks, welems;
  int cl;
};

template <class T, class TO>
__global__ void __launch_bounds__(kThreads) DwWgradKernel(const DwWgradArgs g, const T* __restrict__ x,
                                                          const T* __restrict__ dy, TO* __restrict__ dw,
                                                          typename AccOf<T>::type* __restrict__ scratch) {
  using Acc = typename AccOf<T>::type;
  __shared__ Acc red[kThreads];
  const int tid = threadIdx.x;
  const int cth = g.cl ? 32 : 1;
  const int lanes = kThreads / cth;
  const int cl_ = tid % cth, lane = tid / cth;
  for (int64_t b = blockIdx.x; b < g.blocks; b += gridDim.x) {
    const int64_t bq = DivNN(b, g.splits), split = b - bq * g.splits;
    const int64_t ct = DivNN(bq, g.ntaps), tap = bq - ct * g.ntaps;
    const int64_t c = ct * cth + cl_;
    const int64_t t12 = DivNN(tap, g.taps[2]), f2 = tap - t12 * g.taps[2];
    const int64_t f0 = DivNN(t12, g.taps[1]), f1 = t12 - f0 * g.taps[1];
    const int64_t fo[3] = {f0 * g.rdil[0] - g.pad[0], f1 * g.rdil[1] - g.pad[1], f2 * g.rdil[2] - g.pad[2]};
    const int64_t r_begin = split * g.per_split;
    const int64_t r_end = min(g.rtotal, r_begin + g.per_split);
    Acc acc = Acc(0);
    if (c < g.c && r_begin + lane < r_end) {
      int64_t rem = r_begin + lane;
      int64_t o2; { const int64_t q_ = DivNN(rem, g.osp[2]); o2 = rem - q_ * g.osp[2]; rem = q_; }
      int64_t o1; { const int64_t q_ = DivNN(rem, g.osp[1]); o1 = rem - q_ * g.osp[1]; rem = q_; }
      int64_t o0; { const int64_t q_ = DivNN(rem, g.osp[0]); o0 = rem - q_ * g.osp[0]; rem = q_; }
      int64_t n = rem;
      for (int64_t r = r_begin + lane; r < r_end; r += lanes) {
        int64_t q[3] = {o0 * g.stride[0] + fo[0], o1 * g.stride[1] + fo[1], o2 * g.stride[2] + fo[2]};
        bool ok = true;
        int64_t xo = n * g.xN + c * g.xC;
#pragma unroll
        for (int d = 0; d < 3; ++d) {
          int64_t qd = q[d];
          if (g.ldil[d] != 1) {
            const int64_t dq = qd >= 0 ? DivNN(qd, g.ldil[d]) : -1;
            ok = ok && qd >= 0 && dq * g.ldil[d] == qd;
            qd = dq;
          }
          ok = ok && qd >= 0 && qd < g.in[d];
          xo += qd * g.xS[d];
        }
        if (ok) {
          acc = fma(ToAcc(x[xo]), ToAcc(dy[n * g.dN + c * g.dC + o0 * g.dS[0] + o1 * g.dS[1] + o2 * g.dS[2]]), acc);
        }
        // advance (n, o0, o1, o2) by `lanes` positions
        o2 += lanes;
        while (o2 >= g.osp[2]) {
          o2 -= g.osp[2];
          if (++o1 >= g.osp[1]) {
            o1 = 0;
            if (++o0 >= g.osp[0]) { o0 = 0; ++n; }
          }
        }
      }
    }
    __syncthreads();
    red[tid] = acc;
    __syncthreads();
    if (lane == 0 && c < g.c) {
      Acc s = Acc(0);
      for (int l = 0; l < lanes; ++l) s += red[l * cth + cl_];  // fixed order
      const int64_t off = c * g.wC + f0 * g.wF[0] + f1 * g.wF[1] + f2 * g.wF[2];
      if (g.splits == 1) dw[off] = FromAcc<TO>(s);
      else scratch[split * g.welems + off] = s;
    }
  }
}

DwWgradArgs MakeDwWgradArgs(const ConvParams& p) {
  const Strides5 xs = XStrides(p), ys = YStrides(p), ws = WStrides(p);
  DwWgradArgs g{};
  g.n = p.n[0];
  g.c = p.c[0];
  g.cl = p.layout[0] == kChannelsLast;
  g.ntaps = 1;
  g.rtotal = p.n[0];
  for (int d = 0; d < 3; ++d) {
    g.osp[d] = p.out[d];
    g.in[d] = p.in[d];
    g.taps[d] = p.win[d];
    g.ntaps *= p.win[d];
    g.rtotal *= p.out[d];
    g.stride[d] = p.stride[d];
    g.pad[d] = p.pad_lo[d];
    g.ldil[d] = p.lhs_dil[d];
    g.rdil[d] = p.rhs_dil[d];
    g.xS[d] = xs.s[2 + d];
    g.dS[d] = ys.s[2 + d];
    g.wF[d] = ws.s[2 + d];
  }
  g.xN = xs.s[0];
  g.xC = xs.s[1];
  g.dN = ys.s[0];
  g.dC = ys.s[1];
  g.wC = ws.s[0];  // w[c, 0, f]: output channel stride
  g.ctiles = CeilDiv(g.c, g.cl ? 32 : 1);
  g.welems = WElements(p);
  return g;
}

// Splits of the filter gradient (a function of the problem: they fix the workspace): about two blocks per SM, at least
// 32 positions per lane and split, partials within 512 MiB.
int64_t TiledWgradSplits(const ConvParams& p, DType in) {
  const DwWgradArgs g = MakeDwWgradArgs(p);
  const int64_t base = g.ctiles * g.ntaps;
  if (base <= 0 || g.rtotal <= 0) return 1;
  const int64_t lanes = g.cl ? 8 : 256;
  int64_t splits = CeilDiv(2 * kPlanSms, base);
  splits = std::min<int64_t>(splits, g.rtotal / (lanes * 32));  // >= 32 positions per lane per split
  splits = std::min<int64_t>(splits, 1024);
  const int64_t per = g.welems * static_cast<int64_t>(AccBytes(in));
  if (per > 0) splits = std::min<int64_t>(splits, (int64_t(1) << 29) / per);
  return splits < 2 ? 1 : splits;
}

cudaError_t TiledWgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw, void* scratch,
                       int64_t splits, cudaStream_t s) {
  DwWgradArgs g = MakeDwWgradArgs(p);
  g.splits = splits;
  g.per_split = std::max<int64_t>(1, CeilDiv(g.rtotal, g.splits));
  g.blocks = g.ctiles * g.ntaps * g.splits;
#define JAXCONV_BODY(T, TO)                                                                                    \
  DwWgradKernel<T, TO><<<GridX(g.blocks), kThreads, 0, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(dy), \
                                                            static_cast<TO*>(dw),                               \
                                                            static_cast<typename AccOf<T>::type*>(scratch));    \
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
  if (g.splits > 1) return ReduceSplits(in, out, scratch, g.splits, g.welems, dw, s);
  return cudaSuccess;
}

}  // namespace
}  // namespace cuda

namespace variants::depthwise_tiled {

std::string Applies(const Problem& pr) {
  if (!DepthwiseApplies(pr.p)) return "it takes depthwise convolutions (groups == c == k, batch_groups == 1)";
  if (pr.op == Op::kWgrad) return {};
  cuda::DwArgs g = cuda::MakeDwArgs(pr.p, pr.op);
  int64_t smem = 0;
  if (!cuda::PlanTiled(&g, cuda::AccBytes(pr.in), &smem)) {
    return "it takes no forward lhs dilation or data-gradient stride, and source tiles within 48 KiB";
  }
  return {};
}

size_t Workspace(const Problem& pr) {
  if (pr.op != Op::kWgrad) return 0;
  const int64_t splits = cuda::TiledWgradSplits(pr.p, pr.in);
  return cuda::SplitPartialBytes(pr.p, pr.in, splits);
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  if (pr.op == Op::kWgrad) {
    const int64_t splits = cuda::TiledWgradSplits(pr.p, pr.in);
    if (splits > 1 && (b.ws == nullptr || b.ws_bytes < Workspace(pr))) return cudaErrorInvalidValue;
    return cuda::TiledWgrad(pr.p, pr.in, pr.out, b.a, b.b, b.out, b.ws, splits, s);
  }
  cuda::DwArgs g = cuda::MakeDwArgs(pr.p, pr.op);
  int64_t smem = 0;
  if (!cuda::PlanTiled(&g, cuda::AccBytes(pr.in), &smem)) return cudaErrorNotSupported;
  if (cuda::DwDstElements(g) <= 0) return cudaSuccess;
  const void* bias = pr.op == Op::kFwd ? b.bias : nullptr;
#define JAXCONV_BODY(T, TO) return cuda::LaunchTiled<T, TO>(g, smem, b.a, b.b, bias, b.out, s)
  JAXCONV_DTYPE_SWITCH(pr.in, pr.out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace variants::depthwise_tiled
}  // namespace jaxconv
