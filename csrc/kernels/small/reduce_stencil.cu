// small.reduce_stencil: the c -> 1 3x3 forward (k == 1, channels-last, 2 <= c, unit stride, no lhs dilation):
// y[y, x] = act(bias + sum_{r,s,ch} w[r, s, ch] x[.., ch]). A bandwidth problem the GEMM-shaped direct kernel runs an
// order of magnitude off; it is not held to the family's gate (c > 16 too: the direct family's forward took it for
// every problem it fits).
// A pixel's c channels are G = c / VC lanes of VC channels (one 8- or 16-byte load each; G a power of two <= 32),
// so a warp covers 32 / G consecutive destination pixels of a row and TH destination rows spaced by the row dilation
// dh (a "comb", as in plane_stencil.cu). Lane (pixel, g) loads, per source row and column tap, its VC channels at the
// tapped column (neighbouring pixels' loads of the same row hit L1), accumulates the K taps of the K destination rows
// that row feeds, and the G lanes of a pixel add their partial sums by xor shuffles. Any column padding and dilation
// (loads are per column).
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

constexpr int kWarps = 4;  // warps per block

struct ReduceArgs {
  int64_t warps;
  int src_rows, src_cols, dst_rows, dst_cols;
  int dh, dw, ph, pw;
  int chunks, groups;  // pixel chunks of 32 / G per row; row groups of TH * dh rows
  int act, has_bias;
};

template <class T, class TO, int VC, int G, int K, int TH>
__global__ void __launch_bounds__(kWarps * 32) ReduceFwdKernel(const ReduceArgs g, const T* __restrict__ x,
                                                               const T* __restrict__ w, const TO* __restrict__ bias,
                                                               TO* __restrict__ y) {
  constexpr int C = VC * G, PX = 32 / G, M = TH + K - 1;
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (wid >= g.warps) return;  // whole warps: the shuffles see full warps
  int64_t t = wid;
  const int chunk = static_cast<int>(t % g.chunks);
  t /= g.chunks;
  const int phase = static_cast<int>(t % g.dh);
  t /= g.dh;
  const int grp = static_cast<int>(t % g.groups);
  const int64_t n = t / g.groups;
  const int lane = threadIdx.x % 32, cg = lane % G;
  const int xd = chunk * PX + lane / G;  // destination column
  const int y0 = grp * TH * g.dh + phase;
  float wt[K][K][VC];
#pragma unroll
  for (int r = 0; r < K; ++r)
#pragma unroll
    for (int s = 0; s < K; ++s)
#pragma unroll
      for (int i = 0; i < VC; ++i) wt[r][s][i] = ToAcc(w[(r * K + s) * C + cg * VC + i]);
  float acc[TH];
#pragma unroll
  for (int j = 0; j < TH; ++j) acc[j] = 0.f;
  const T* xn = x + n * g.src_rows * static_cast<int64_t>(g.src_cols) * C + cg * VC;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int ys = y0 - g.ph + m * g.dh;
    const bool row_ok = ys >= 0 && ys < g.src_rows && xd < g.dst_cols;
#pragma unroll
    for (int s = 0; s < K; ++s) {
      const int xs = xd - g.pw + s * g.dw;
      float v[VC];
      if (row_ok && xs >= 0 && xs < g.src_cols) {
        LdGlobalAcc<T, float, VC>(xn + (static_cast<int64_t>(ys) * g.src_cols + xs) * C, v);
      } else {
#pragma unroll
        for (int i = 0; i < VC; ++i) v[i] = 0.f;
      }
#pragma unroll
      for (int r = 0; r < K; ++r) {
        const int j = m - r;
        if (j < 0 || j >= TH) continue;
#pragma unroll
        for (int i = 0; i < VC; ++i) acc[j] = fmaf(wt[r][s][i], v[i], acc[j]);
      }
    }
  }
  const float b0 = g.has_bias ? ToAcc(bias[0]) : 0.f;
#pragma unroll
  for (int j = 0; j < TH; ++j) {
    float v = acc[j];
#pragma unroll
    for (int o = G / 2; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int yd = y0 + j * g.dh;
    if (cg == 0 && xd < g.dst_cols && yd < g.dst_rows) {
      y[(n * g.dst_rows + yd) * static_cast<int64_t>(g.dst_cols) + xd] = FromAcc<TO>(Activate(v + b0, g.act));
    }
  }
}

// Channels per lane: one 16-byte vector, or 8 bytes when c is that small.
int ReduceVc(const ConvParams& p, DType in) {
  const int eb = in == DType::kF32 ? 4 : 2;
  return static_cast<int>(p.c[0] * eb >= 16 ? 16 / eb : 8 / eb);
}

ReduceArgs MakeReduceArgs(const ConvParams& p, int g_lanes, int th) {
  ReduceArgs a{};
  a.src_rows = static_cast<int>(p.in[1]);
  a.src_cols = static_cast<int>(p.in[2]);
  a.dst_rows = static_cast<int>(p.out[1]);
  a.dst_cols = static_cast<int>(p.out[2]);
  a.dh = static_cast<int>(p.rhs_dil[1]);
  a.dw = static_cast<int>(p.rhs_dil[2]);
  a.ph = static_cast<int>(p.pad_lo[1]);
  a.pw = static_cast<int>(p.pad_lo[2]);
  a.chunks = static_cast<int>(CeilDiv(p.out[2], 32 / g_lanes));
  a.groups = static_cast<int>(CeilDiv(p.out[1], int64_t(th) * a.dh));
  a.warps = p.n[0] * a.groups * a.dh * a.chunks;
  a.act = static_cast<int>(p.activation[0]);
  a.has_bias = static_cast<int>(p.has_bias[0]);
  return a;
}

template <class T, class TO, int VC>
cudaError_t LaunchReduce(const ConvParams& p, const void* x, const void* w, const void* bias, void* y, cudaStream_t s) {
  auto with_g = [&](auto gl) {
    constexpr int G = decltype(gl)::value;
    const int th = MakeReduceArgs(p, G, 4).warps < kBusyWarps ? 2 : 4;
    return WithRows(th, [&](auto thc) {
      constexpr int TH = decltype(thc)::value;
      const ReduceArgs a = MakeReduceArgs(p, G, TH);
      ReduceFwdKernel<T, TO, VC, G, 3, TH><<<static_cast<unsigned>(CeilDiv(a.warps, kWarps)), kWarps * 32, 0, s>>>(
          a, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const TO*>(bias), static_cast<TO*>(y));
      return cudaGetLastError();
    });
  };
  switch (p.c[0] / VC) {
    case 1: return with_g(IntC<1>{});
    case 2: return with_g(IntC<2>{});
    case 4: return with_g(IntC<4>{});
    case 8: return with_g(IntC<8>{});
    case 16: return with_g(IntC<16>{});
    default: return with_g(IntC<32>{});
  }
}
// The geometry the kernel takes ("" when it takes the problem).
std::string ReduceError(const ConvParams& p, DType in) {
  if (p.layout[0] != kChannelsLast) return "it takes channels-last layouts";
  if (p.k[0] != 1 || p.c[0] < 2 || p.groups[0] != 1 || p.batch_groups[0] != 1) {
    return "it takes c -> 1 (c >= 2) without groups";
  }
  if (p.n[0] < 1) return "it takes a nonempty batch";
  if (p.in[0] != 1 || p.out[0] != 1 || p.win[0] != 1 || p.pad_lo[0] != 0 || p.pad_hi[0] != 0) {
    return "it takes 2-D problems";
  }
  for (int d = 0; d < 3; ++d) {
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1) return "it takes unit strides and no lhs dilation";
  }
  if (p.win[1] != 3 || p.win[2] != 3 || p.out[1] < 1 || p.out[2] < 1) return "it takes 3x3 windows";
  const int vc = ReduceVc(p, in);
  const int64_t lanes = p.c[0] / vc;
  if (p.c[0] % vc != 0 || lanes > 32 || (lanes & (lanes - 1)) != 0) {
    return "it takes c / (channels per 8- or 16-byte vector) a power of two <= 32";
  }
  // 32-bit coordinates (pads and dilations bounded so tapped positions stay in int range).
  for (int d = 1; d < 3; ++d) {
    if (p.in[d] > (1 << 24) || p.out[d] > (1 << 24) || p.rhs_dil[d] > (1 << 20) || p.pad_lo[d] < -(1 << 24) ||
        p.pad_lo[d] > (1 << 24)) {
      return "extents, dilations or padding past its 32-bit coordinates";
    }
  }
  if (CeilDiv(MakeReduceArgs(p, static_cast<int>(lanes), 2).warps, kWarps) > INT32_MAX) {
    return "more blocks than a 1-D grid takes";
  }
  return {};
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_reduce_stencil {

std::string Applies(const Problem& pr) {
  if (!cuda::IsF32AccPair(pr.in, pr.out)) return "it takes 16-bit or float32 operands";
  return cuda::small_channel::ReduceError(pr.p, pr.in);
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  const ConvParams& p = pr.p;
  const int eb = pr.in == DType::kF32 ? 4 : 2;
  // A lane's channels are one 8- or 16-byte vector.
  if (reinterpret_cast<uintptr_t>(b.a) % (ReduceVc(p, pr.in) * eb) != 0) return cudaErrorMisalignedAddress;
  const bool wide = ReduceVc(p, pr.in) * eb == 16;
  return cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto to) {
    using T = decltype(t);
    using TO = decltype(to);
    constexpr int kWide = 16 / sizeof(T), kNarrow = 8 / sizeof(T);
    return wide ? LaunchReduce<T, TO, kWide>(p, b.a, b.b, b.bias, b.out, s)
                : LaunchReduce<T, TO, kNarrow>(p, b.a, b.b, b.bias, b.out, s);
  });
}

}  // namespace variants::small_reduce_stencil
}  // namespace jaxconv
