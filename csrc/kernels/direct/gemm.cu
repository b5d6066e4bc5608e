// direct.gemm, the floor under every problem: direct convolution for every configuration of conv_params.h (both
// layouts, strides, negative/large pads, lhs/rhs dilation, feature and batch groups, zero-size dims).
//
// fwd and dgrad share one implicit-GEMM kernel (gather form, one writer per output element, no atomics):
//   out[unit u][pos][col] = epilogue( sum_{tap, r} A(u, pos, tap, r) * B(u, r, col, tap) )
// fwd:   pos = (nb, o) y positions, col = kk within the unit, r = cg;   A = x at i(o, tap),  B = w[kk, cg, tap]
// dgrad: pos = (n, i) x positions,  col = cg within the unit, r = kk;   A = dy at o(i, tap), B = w[kk, cg, tap]
// where a "unit" is a feature group (groups > 1) or a batch group (batch_groups > 1) or everything.
// Spatial source index per dim: q = t*alpha + beta + f*gamma, valid iff q >= 0, q % delta == 0, q/delta < lim
// (fwd: alpha = stride, beta = -pad_lo, gamma = rhs_dil, delta = lhs_dil, lim = in;
//  dgrad: alpha = lhs_dil, beta = pad_lo, gamma = -rhs_dil, delta = stride, lim = out).
// The reduction (tap-major, channel-minor, flattened) runs in chunks of 16; tiles of A and B are staged in shared
// memory (converted to the accumulator type); each thread owns a 4 x 4 register block of outputs.
//
// wgrad: dw[kk, cg, tap] = sum over (nb, o); one tile kernel (rows kk, cols (tap, cg)), reduction in chunks of 16
// positions in a fixed order; optional split-K writes per-split partial sums to scratch and ReduceSplits adds them
// in split order (deterministic, no atomics).
#include "dispatch/variant.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBK = 16;

struct GemmArgs {
  int64_t pn, psp[3], ptotal;       // positions: batch pn, spatial psp
  int64_t units, cols, red;         // per unit: columns and reduction channels
  int64_t taps[3], ntaps;
  int64_t aN, aC, aS[3], a_batch_mul, a_chan_mul;
  int64_t alpha[3], beta[3], gamma[3], delta[3], lim[3];
  int64_t bR, bC, bF[3], b_r_mul, b_c_mul;
  int64_t oN, oC, oS[3], o_batch_mul, o_chan_mul;
  int64_t pos_tiles, col_tiles, tiles;
  int a_row_fast, b_row_fast, act, has_bias, any_delta;
};

template <class T, class TO, int TM, int TN>
__global__ void __launch_bounds__(kThreads) GemmFwdDgradKernel(const GemmArgs g, const T* __restrict__ A,
                                                               const T* __restrict__ B,
                                                               const TO* __restrict__ bias, TO* __restrict__ out) {
  static_assert(TM * TN == kThreads, "block shape");
  using Acc = typename AccOf<T>::type;
  constexpr int BM = TM * 4, BN = TN * 4;
  __shared__ Acc As[kBK][BM + 1];
  __shared__ Acc Bs[kBK][BN + 1];
  __shared__ int64_t pos_a[BM], pos_o[BM], pos_base[3][BM];
  __shared__ int64_t row_a[kBK], row_b[kBK], row_g[3][kBK];
  const int tid = threadIdx.x, tx = tid % TN, ty = tid / TN;
  const int64_t R = g.ntaps * g.red;

  for (int64_t tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int64_t ct = tile % g.col_tiles;
    const int64_t pt = (tile / g.col_tiles) % g.pos_tiles;
    const int64_t u = tile / (g.col_tiles * g.pos_tiles);
    const int64_t col0 = ct * BN;
    __syncthreads();  // previous tile's readers of the position table are done
    for (int i = tid; i < BM; i += kThreads) {
      const int64_t pos = pt * BM + i;
      if (pos < g.ptotal) {
        int64_t rem = pos;
        const int64_t s2 = rem % g.psp[2]; rem /= g.psp[2];
        const int64_t s1 = rem % g.psp[1]; rem /= g.psp[1];
        const int64_t s0 = rem % g.psp[0]; rem /= g.psp[0];
        const int64_t nb = rem;
        pos_a[i] = (u * g.a_batch_mul + nb) * g.aN;
        pos_o[i] = (u * g.o_batch_mul + nb) * g.oN + s0 * g.oS[0] + s1 * g.oS[1] + s2 * g.oS[2];
        pos_base[0][i] = s0 * g.alpha[0] + g.beta[0];
        pos_base[1][i] = s1 * g.alpha[1] + g.beta[1];
        pos_base[2][i] = s2 * g.alpha[2] + g.beta[2];
      } else {
        pos_a[i] = -1;
        pos_o[i] = -1;
        pos_base[0][i] = pos_base[1][i] = pos_base[2][i] = 0;
      }
    }
    __syncthreads();  // the epilogue reads pos_o even when the reduction is empty
    Acc acc[4][4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) acc[m][n] = Acc(0);

    for (int64_t r0 = 0; r0 < R; r0 += kBK) {
      __syncthreads();  // previous chunk's compute is done with As/Bs/row tables; pos table written
      if (tid < kBK) {
        const int64_t rr = r0 + tid;
        if (rr < R) {
          const int64_t tap = rr / g.red, ch = rr % g.red;
          const int64_t f2 = tap % g.taps[2], f1 = (tap / g.taps[2]) % g.taps[1], f0 = tap / (g.taps[2] * g.taps[1]);
          row_a[tid] = (u * g.a_chan_mul + ch) * g.aC;
          row_b[tid] = (u * g.b_r_mul + ch) * g.bR + f0 * g.bF[0] + f1 * g.bF[1] + f2 * g.bF[2];
          row_g[0][tid] = f0 * g.gamma[0];
          row_g[1][tid] = f1 * g.gamma[1];
          row_g[2][tid] = f2 * g.gamma[2];
        } else {
          row_a[tid] = -1;
          row_b[tid] = -1;
          row_g[0][tid] = row_g[1][tid] = row_g[2][tid] = 0;
        }
      }
      __syncthreads();
      // A tile: kBK x BM
#pragma unroll 1
      for (int q = 0; q < (kBK * BM) / kThreads; ++q) {
        const int e = tid + q * kThreads;
        int j, i;
        if (g.a_row_fast) { j = e % kBK; i = e / kBK; } else { i = e % BM; j = e / BM; }
        Acc v = Acc(0);
        if (row_a[j] >= 0 && pos_a[i] >= 0) {
          int64_t off = pos_a[i] + row_a[j];
          bool ok = true;
#pragma unroll
          for (int d = 0; d < 3; ++d) {
            int64_t qd = pos_base[d][i] + row_g[d][j];
            if (g.any_delta && g.delta[d] != 1) {
              const int64_t dq = qd >= 0 ? DivNN(qd, g.delta[d]) : -1;
              ok = ok && qd >= 0 && dq * g.delta[d] == qd;
              qd = dq;
            }
            ok = ok && qd >= 0 && qd < g.lim[d];
            off += qd * g.aS[d];
          }
          if (ok) v = ToAcc(A[off]);
        }
        As[j][i] = v;
      }
      // B tile: kBK x BN
#pragma unroll
      for (int q = 0; q < (kBK * BN) / kThreads; ++q) {
        const int e = tid + q * kThreads;
        int j, c;
        if (g.b_row_fast) { j = e % kBK; c = e / kBK; } else { c = e % BN; j = e / BN; }
        Acc v = Acc(0);
        const int64_t col = col0 + c;
        if (row_b[j] >= 0 && col < g.cols) v = ToAcc(B[row_b[j] + (u * g.b_c_mul + col) * g.bC]);
        Bs[j][c] = v;
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kBK; ++j) {
        Acc a[4], b[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) a[m] = As[j][ty + TM * m];
#pragma unroll
        for (int n = 0; n < 4; ++n) b[n] = Bs[j][tx + TN * n];
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
          for (int n = 0; n < 4; ++n) acc[m][n] = fma(a[m], b[n], acc[m][n]);
      }
    }
    // epilogue
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int64_t po = pos_o[ty + TM * m];
      if (po < 0) continue;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int64_t col = col0 + tx + TN * n;
        if (col >= g.cols) continue;
        const int64_t ch = u * g.o_chan_mul + col;
        Acc v = acc[m][n];
        if (g.has_bias) v += ToAcc(bias[ch]);
        v = Activate(v, g.act);
        out[po + ch * g.oC] = FromAcc<TO>(v);
      }
    }
  }
}

template <class T, class TO>
cudaError_t LaunchGemm(GemmArgs g, const void* a, const void* b, const void* bias, void* out, cudaStream_t s) {
  const bool narrow = g.cols <= 16;
  const int BM = narrow ? 256 : 64, BN = narrow ? 16 : 64;
  g.pos_tiles = CeilDiv(g.ptotal, BM);
  g.col_tiles = CeilDiv(g.cols, BN);
  g.tiles = g.units * g.pos_tiles * g.col_tiles;
  if (g.tiles <= 0) return cudaSuccess;
  const dim3 grid(GridX(g.tiles));
  if (narrow) {
    GemmFwdDgradKernel<T, TO, 64, 4><<<grid, kThreads, 0, s>>>(g, static_cast<const T*>(a), static_cast<const T*>(b),
                                                               static_cast<const TO*>(bias), static_cast<TO*>(out));
  } else {
    GemmFwdDgradKernel<T, TO, 16, 16><<<grid, kThreads, 0, s>>>(g, static_cast<const T*>(a), static_cast<const T*>(b),
                                                                static_cast<const TO*>(bias), static_cast<TO*>(out));
  }
  return cudaGetLastError();
}

cudaError_t RunGemm(const GemmArgs& g, DType in, DType out, const void* a, const void* b, const void* bias, void* o,
                    cudaStream_t s) {
#define JAXCONV_BODY(T, TO) return LaunchGemm<T, TO>(g, a, b, bias, o, s)
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

struct Units {
  int64_t units, nb, cg, ku;
  bool fg, bg;
};
Units GetUnits(const ConvParams& p) {
  Units r;
  r.fg = p.groups[0] > 1;
  r.bg = p.batch_groups[0] > 1;
  r.units = p.groups[0] * p.batch_groups[0];
  r.nb = p.n[0] / p.batch_groups[0];
  r.cg = p.c[0] / p.groups[0];
  r.ku = p.k[0] / r.units;
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// wgrad
struct WgradArgs {
  int64_t nb, osp[3], rtotal;       // reduction positions: (nb, o)
  int64_t units, rows, cg, ntaps, taps[3], ncols;  // rows = kk per unit, cols = (tap, cg)
  int64_t xN, xC, xS[3], x_batch_mul, x_chan_mul;
  int64_t dN, dC, dS[3];
  int64_t wK, wC, wF[3];
  int64_t stride[3], pad[3], rdil[3], ldil[3], in[3];
  int64_t row_tiles, col_tiles, base_tiles, tiles, splits, chunks_per_split, welems;
  int dy_row_fast, x_col_fast, any_ldil;
};

template <class T, class TO, int TM, int TN>
__global__ void __launch_bounds__(kThreads, 1) WgradKernel(const WgradArgs g, const T* __restrict__ X,
                                                        const T* __restrict__ DY, TO* __restrict__ dw,
                                                        typename AccOf<T>::type* __restrict__ scratch) {
  static_assert(TM * TN == kThreads, "block shape");
  using Acc = typename AccOf<T>::type;
  constexpr int BM = TM * 4, BN = TN * 4;
  __shared__ Acc As[kBK][BM + 1];  // dy: [reduction][row kk]
  __shared__ Acc Bs[kBK][BN + 1];  // x:  [reduction][col (tap, cg)]
  __shared__ int64_t col_x[BN], col_w[BN], col_g[3][BN];
  __shared__ int64_t red_dy[kBK], red_x[kBK], red_base[3][kBK];
  const int tid = threadIdx.x, tx = tid % TN, ty = tid / TN;
  const int64_t nchunks = (g.rtotal + kBK - 1) / kBK;

  for (int64_t tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int64_t split = tile % g.splits;
    const int64_t bt = tile / g.splits;
    const int64_t ct = bt % g.col_tiles;
    const int64_t rt = (bt / g.col_tiles) % g.row_tiles;
    const int64_t u = bt / (g.col_tiles * g.row_tiles);
    const int64_t row0 = rt * BM, col0 = ct * BN;
    __syncthreads();
    for (int c = tid; c < BN; c += kThreads) {
      const int64_t col = col0 + c;
      if (col < g.ncols) {
        const int64_t tap = col / g.cg, cg = col % g.cg;
        const int64_t f2 = tap % g.taps[2], f1 = (tap / g.taps[2]) % g.taps[1], f0 = tap / (g.taps[2] * g.taps[1]);
        col_x[c] = (u * g.x_chan_mul + cg) * g.xC;
        col_w[c] = cg * g.wC + f0 * g.wF[0] + f1 * g.wF[1] + f2 * g.wF[2];
        col_g[0][c] = f0 * g.rdil[0];
        col_g[1][c] = f1 * g.rdil[1];
        col_g[2][c] = f2 * g.rdil[2];
      } else {
        col_x[c] = -1;
        col_w[c] = -1;
        col_g[0][c] = col_g[1][c] = col_g[2][c] = 0;
      }
    }
    __syncthreads();  // the epilogue reads col_w even when this split has no chunks
    Acc acc[4][4];
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int n = 0; n < 4; ++n) acc[m][n] = Acc(0);

    const int64_t c_begin = split * g.chunks_per_split;
    const int64_t c_end = min(nchunks, c_begin + g.chunks_per_split);
    for (int64_t chunk = c_begin; chunk < c_end; ++chunk) {
      __syncthreads();
      if (tid < kBK) {
        const int64_t rr = chunk * kBK + tid;
        if (rr < g.rtotal) {
          int64_t rem = rr;
          const int64_t o2 = rem % g.osp[2]; rem /= g.osp[2];
          const int64_t o1 = rem % g.osp[1]; rem /= g.osp[1];
          const int64_t o0 = rem % g.osp[0]; rem /= g.osp[0];
          const int64_t nb = rem;
          red_dy[tid] = nb * g.dN + o0 * g.dS[0] + o1 * g.dS[1] + o2 * g.dS[2];
          red_x[tid] = (u * g.x_batch_mul + nb) * g.xN;
          red_base[0][tid] = o0 * g.stride[0] - g.pad[0];
          red_base[1][tid] = o1 * g.stride[1] - g.pad[1];
          red_base[2][tid] = o2 * g.stride[2] - g.pad[2];
        } else {
          red_dy[tid] = -1;
          red_x[tid] = -1;
          red_base[0][tid] = red_base[1][tid] = red_base[2][tid] = 0;
        }
      }
      __syncthreads();
#pragma unroll
      for (int q = 0; q < (kBK * BM) / kThreads; ++q) {
        const int e = tid + q * kThreads;
        int j, i;
        if (g.dy_row_fast) { i = e % BM; j = e / BM; } else { j = e % kBK; i = e / kBK; }
        const int64_t row = row0 + i;
        Acc v = Acc(0);
        if (red_dy[j] >= 0 && row < g.rows) v = ToAcc(DY[red_dy[j] + (u * g.rows + row) * g.dC]);
        As[j][i] = v;
      }
#pragma unroll 1
      for (int q = 0; q < (kBK * BN) / kThreads; ++q) {
        const int e = tid + q * kThreads;
        int j, c;
        if (g.x_col_fast) { c = e % BN; j = e / BN; } else { j = e % kBK; c = e / kBK; }
        Acc v = Acc(0);
        if (red_x[j] >= 0 && col_x[c] >= 0) {
          int64_t off = red_x[j] + col_x[c];
          bool ok = true;
#pragma unroll
          for (int d = 0; d < 3; ++d) {
            int64_t qd = red_base[d][j] + col_g[d][c];
            if (g.any_ldil && g.ldil[d] != 1) {
              const int64_t dq = qd >= 0 ? DivNN(qd, g.ldil[d]) : -1;
              ok = ok && qd >= 0 && dq * g.ldil[d] == qd;
              qd = dq;
            }
            ok = ok && qd >= 0 && qd < g.in[d];
            off += qd * g.xS[d];
          }
          if (ok) v = ToAcc(X[off]);
        }
        Bs[j][c] = v;
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kBK; ++j) {
        Acc a[4], b[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) a[m] = As[j][ty + TM * m];
#pragma unroll
        for (int n = 0; n < 4; ++n) b[n] = Bs[j][tx + TN * n];
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
          for (int n = 0; n < 4; ++n) acc[m][n] = fma(a[m], b[n], acc[m][n]);
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int64_t row = row0 + ty + TM * m;
      if (row >= g.rows) continue;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int64_t cw = col_w[tx + TN * n];
        if (cw < 0) continue;
        const int64_t off = (u * g.rows + row) * g.wK + cw;
        if (g.splits == 1) {
          dw[off] = FromAcc<TO>(acc[m][n]);
        } else {
          scratch[split * g.welems + off] = acc[m][n];
        }
      }
    }
  }
}

WgradArgs MakeWgradArgs(const ConvParams& p, bool narrow) {
  const Units un = GetUnits(p);
  const Strides5 xs = XStrides(p), ys = YStrides(p), ws = WStrides(p);
  const bool cl = p.layout[0] == kChannelsLast;
  WgradArgs g{};
  g.nb = un.nb;
  int64_t ospt = 1;
  g.ntaps = 1;
  g.any_ldil = 0;
  for (int d = 0; d < 3; ++d) {
    g.osp[d] = p.out[d];
    ospt *= p.out[d];
    g.taps[d] = p.win[d];
    g.ntaps *= p.win[d];
    g.xS[d] = xs.s[2 + d];
    g.dS[d] = ys.s[2 + d];
    g.wF[d] = ws.s[2 + d];
    g.stride[d] = p.stride[d];
    g.pad[d] = p.pad_lo[d];
    g.rdil[d] = p.rhs_dil[d];
    g.ldil[d] = p.lhs_dil[d];
    g.in[d] = p.in[d];
    if (p.lhs_dil[d] != 1) g.any_ldil = 1;
  }
  g.rtotal = un.nb * ospt;
  g.units = un.units;
  g.rows = un.ku;
  g.cg = un.cg;
  g.ncols = g.ntaps * un.cg;
  g.xN = xs.s[0];
  g.xC = xs.s[1];
  g.x_batch_mul = un.bg ? un.nb : 0;
  g.x_chan_mul = un.fg ? un.cg : 0;
  g.dN = ys.s[0];
  g.dC = ys.s[1];
  g.wK = ws.s[0];
  g.wC = ws.s[1];
  const int BM = narrow ? 16 : 64, BN = narrow ? 256 : 64;
  g.row_tiles = CeilDiv(g.rows, BM);
  g.col_tiles = CeilDiv(g.ncols, BN);
  g.base_tiles = g.units * g.row_tiles * g.col_tiles;
  g.welems = WElements(p);
  g.dy_row_fast = cl ? 1 : 0;  // channels-last dy: kk contiguous
  g.x_col_fast = cl ? 1 : 0;   // channels-last x: cg contiguous
  return g;
}

bool WgradNarrow(const ConvParams& p) { return GetUnits(p).ku <= 16; }

cudaError_t Fwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias, void* y,
                cudaStream_t s) {
  const Units un = GetUnits(p);
  const Strides5 xs = XStrides(p), ys = YStrides(p), ws = WStrides(p);
  const bool cl = p.layout[0] == kChannelsLast;
  GemmArgs g{};
  g.pn = un.nb;
  g.ptotal = un.nb;
  g.ntaps = 1;
  g.any_delta = 0;
  for (int d = 0; d < 3; ++d) {
    g.psp[d] = p.out[d];
    g.ptotal *= p.out[d];
    g.taps[d] = p.win[d];
    g.ntaps *= p.win[d];
    g.aS[d] = xs.s[2 + d];
    g.alpha[d] = p.stride[d];
    g.beta[d] = -p.pad_lo[d];
    g.gamma[d] = p.rhs_dil[d];
    g.delta[d] = p.lhs_dil[d];
    g.lim[d] = p.in[d];
    if (p.lhs_dil[d] != 1) g.any_delta = 1;
    g.bF[d] = ws.s[2 + d];
    g.oS[d] = ys.s[2 + d];
  }
  g.units = un.units;
  g.cols = un.ku;
  g.red = un.cg;
  g.aN = xs.s[0];
  g.aC = xs.s[1];
  g.a_batch_mul = un.bg ? un.nb : 0;
  g.a_chan_mul = un.fg ? un.cg : 0;
  g.bR = ws.s[1];
  g.bC = ws.s[0];
  g.b_r_mul = 0;
  g.b_c_mul = un.ku;
  g.oN = ys.s[0];
  g.oC = ys.s[1];
  g.o_batch_mul = 0;
  g.o_chan_mul = un.ku;
  g.a_row_fast = cl ? 1 : 0;  // x channels contiguous
  g.b_row_fast = 0;           // w: channels-last kk contiguous; channels-first neither
  g.act = static_cast<int>(p.activation[0]);
  g.has_bias = static_cast<int>(p.has_bias[0]);
  return RunGemm(g, in, out, x, w, bias, y, s);
}

cudaError_t Dgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx, cudaStream_t s) {
  const Units un = GetUnits(p);
  const Strides5 xs = XStrides(p), ys = YStrides(p), ws = WStrides(p);
  const bool cl = p.layout[0] == kChannelsLast;
  GemmArgs g{};
  g.pn = un.nb;
  g.ptotal = un.nb;
  g.ntaps = 1;
  g.any_delta = 0;
  for (int d = 0; d < 3; ++d) {
    g.psp[d] = p.in[d];
    g.ptotal *= p.in[d];
    g.taps[d] = p.win[d];
    g.ntaps *= p.win[d];
    g.aS[d] = ys.s[2 + d];
    g.alpha[d] = p.lhs_dil[d];
    g.beta[d] = p.pad_lo[d];
    g.gamma[d] = -p.rhs_dil[d];
    g.delta[d] = p.stride[d];
    g.lim[d] = p.out[d];
    if (p.stride[d] != 1) g.any_delta = 1;
    g.bF[d] = ws.s[2 + d];
    g.oS[d] = xs.s[2 + d];
  }
  // Positions (nb, i) per unit: with batch groups the unit's dx batch is b*Nb + nb; otherwise Nb == N.
  g.units = un.units;
  g.cols = un.cg;
  g.red = un.ku;
  g.aN = ys.s[0];
  g.aC = ys.s[1];
  g.a_batch_mul = 0;
  g.a_chan_mul = un.ku;
  g.bR = ws.s[0];
  g.bC = ws.s[1];
  g.b_r_mul = un.ku;
  g.b_c_mul = 0;
  g.oN = xs.s[0];
  g.oC = xs.s[1];
  g.o_batch_mul = un.bg ? un.nb : 0;
  g.o_chan_mul = un.fg ? un.cg : 0;
  g.a_row_fast = cl ? 1 : 0;  // dy channels contiguous
  g.b_row_fast = cl ? 1 : 0;  // channels-last w: kk (the reduction) contiguous
  g.act = kActNone;
  g.has_bias = 0;
  return RunGemm(g, in, out, dy, w, nullptr, dx, s);
}

// The filter gradient's split-K plan: enough tiles for two blocks per SM, at least 128 positions per split.
int64_t WgradSplits(const ConvParams& p, DType in) {
  const WgradArgs g = MakeWgradArgs(p, WgradNarrow(p));
  if (g.base_tiles <= 0 || g.rtotal <= 0) return 1;
  const int64_t nchunks = CeilDiv(g.rtotal, kBK);
  const int64_t want_blocks = 2 * kPlanSms;
  int64_t splits = CeilDiv(want_blocks, g.base_tiles);
  splits = std::min<int64_t>(splits, nchunks / 8);  // at least 8 chunks (128 positions) per split
  splits = std::min<int64_t>(splits, 256);
  const int64_t cap_bytes = int64_t(1) << 29;       // 512 MiB of scratch at most
  const int64_t per_split = g.welems * static_cast<int64_t>(AccBytes(in));
  if (per_split > 0) splits = std::min<int64_t>(splits, cap_bytes / per_split);
  return splits < 2 ? 1 : splits;
}

cudaError_t Wgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw, void* scratch,
                  int64_t splits, cudaStream_t s) {
  const bool narrow = WgradNarrow(p);
  WgradArgs g = MakeWgradArgs(p, narrow);
  if (g.welems <= 0) return cudaSuccess;
  const int64_t nchunks = CeilDiv(g.rtotal, kBK);
  g.splits = splits < 1 ? 1 : splits;
  g.chunks_per_split = std::max<int64_t>(1, CeilDiv(nchunks, g.splits));
  g.tiles = g.base_tiles * g.splits;
  if (g.tiles > 0) {
    const dim3 grid(GridX(g.tiles));
#define JAXCONV_BODY(T, TO)                                                                                 \
  using A_ = typename AccOf<T>::type;                                                                      \
  if (narrow) {                                                                                            \
    WgradKernel<T, TO, 4, 64><<<grid, kThreads, 0, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(dy), \
                                                        static_cast<TO*>(dw), static_cast<A_*>(scratch));  \
  } else {                                                                                                 \
    WgradKernel<T, TO, 16, 16><<<grid, kThreads, 0, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(dy), \
                                                         static_cast<TO*>(dw), static_cast<A_*>(scratch)); \
  }                                                                                                        \
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
  }
  if (g.splits > 1) return ReduceSplits(in, out, scratch, g.splits, g.welems, dw, s);
  return cudaSuccess;
}

}  // namespace
}  // namespace cuda

namespace variants::direct_gemm {

std::string Applies(const Problem&) { return {}; }

size_t Workspace(const Problem& pr) {
  return pr.op == Op::kWgrad ? cuda::SplitPartialBytes(pr.p, pr.in, cuda::WgradSplits(pr.p, pr.in)) : 0;
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  switch (pr.op) {
    case Op::kFwd: return cuda::Fwd(pr.p, pr.in, pr.out, b.a, b.b, b.bias, b.out, s);
    case Op::kDgrad: return cuda::Dgrad(pr.p, pr.in, pr.out, b.a, b.b, b.out, s);
    default: {
      const int64_t splits = cuda::SplitsThatFit(pr.p, pr.in, cuda::WgradSplits(pr.p, pr.in), b.ws, b.ws_bytes);
      return cuda::Wgrad(pr.p, pr.in, pr.out, b.a, b.b, b.out, b.ws, splits, s);
    }
  }
}

}  // namespace variants::direct_gemm
}  // namespace jaxconv
