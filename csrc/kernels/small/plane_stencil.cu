// Single-channel 2-D stencils (c == k == 1, groups 1): the forward, data gradient and filter gradient of the
// msd-style "1 -> 1" layers, which are pure bandwidth problems (9 FMAs per 2-byte pixel read and written).
// Taken by the small-channel family (small_channel.cu) when PlaneStencilApplies; everything else stays there.
//
// Register stencil, no shared memory. A warp owns a strip of 240 destination columns and TH destination rows
// spaced by the row dilation dh (a "comb": rows y0, y0 + dh, ..., so the K source rows of each output row are
// K consecutive teeth of the source comb, whatever dh). Lane l loads the 8 source columns x0 + [0, 8) of each
// comb row with one 16-byte vector (two for f32), x0 = 240 * strip - 8 + 8 l: lanes 0 and 31 only load the
// strip's halo and write nothing, the other 30 lanes take their neighbours' columns by warp shuffles (the
// horizontal halo is at most 8 columns: (K - 1) / 2 * dw <= 8). All TH + K - 1 row loads of a warp are issued
// before any arithmetic (independent 16-byte loads in flight hide the DRAM latency); every source byte is read
// once from DRAM, halo rows and columns again from L2.
//   fwd:   y[y, x]  = act(bias + sum_{r,s} w[r, s] * x[y - ph + r dh, x - pw + s dw])
//   dgrad: dx[y, x] = the same with w rotated by 180 degrees and ph' = (K - 1) dh - ph (stride 1: a correlation)
//   wgrad: dw[r, s] = sum_{y,x} x[y - ph + r dh, x - pw + s dw] * dy[y, x]: per-thread sums, then the warp
//          (shuffles) and the block (shared memory, warp order) reduce them into one partial per block; the
//          small-channel reduction adds the partials in block order (deterministic, no atomics).
// Columns need "same" padding (pw = (K - 1) / 2 * dw on both sides, so the destination has the source's
// width) and a width that is a multiple of 8 (16-byte aligned rows); rows take any padding.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kVec = 8;                    // columns per lane
constexpr int kStripCols = 30 * kVec;      // destination columns per warp (lanes 1..30)
constexpr int kWarps = 4;                  // warps per block
constexpr int kMaxHalo = kVec;             // (K - 1) / 2 * dw: the neighbour lane's columns at most

struct PlaneArgs {
  int64_t src_img, dst_img;  // elements per image of source and destination
  int64_t warps;             // n * groups * dh * strips
  int src_rows, dst_rows;    // rows of source and destination (both have `cols` columns)
  int cols;                  // a multiple of 8
  int dh, ph;                // row dilation; source row of (destination row 0, tap 0) is -ph
  int strips, groups;        // 240-column strips; row groups of TH * dh rows
  int act, has_bias;
};

// 8 consecutive values of T (16 bytes, 32 for f32) as raw 32-bit words, loaded now, converted when used.
template <class T> struct Raw { unsigned w[sizeof(T) * kVec / 4]; };

template <class T>
__device__ __forceinline__ Raw<T> LoadRaw(const T* p, bool valid) {
  Raw<T> r;
#pragma unroll
  for (int i = 0; i < int(sizeof(r.w) / 16); ++i) {
    const uint4 v = valid ? __ldg(reinterpret_cast<const uint4*>(p) + i) : make_uint4(0, 0, 0, 0);
    r.w[4 * i] = v.x, r.w[4 * i + 1] = v.y, r.w[4 * i + 2] = v.z, r.w[4 * i + 3] = v.w;
  }
  return r;
}

template <class T>
__device__ __forceinline__ void Unpack(const Raw<T>& r, float (&o)[kVec]) {
  UnpackWords<T, float, kVec>(r.w, o);
}

// 8 values as TO: one 16-byte store, two for f32.
template <class TO>
__device__ __forceinline__ void Store8(TO* p, const float (&v)[kVec]) {
  if constexpr (sizeof(TO) == 4) {
    StGlobal<TO, float, 4>(p, *reinterpret_cast<const float(*)[4]>(v));
    StGlobal<TO, float, 4>(p + 4, *reinterpret_cast<const float(*)[4]>(v + 4));
  } else {
    StGlobal<TO, float, kVec>(p, v);
  }
}

// e[kMaxHalo + j] = source column x0 + j for j in [-H, 8 + H): the lane's own 8 columns and H of each
// neighbour's (H = (K - 1) / 2 * DW, compile-time, so only those shuffles are issued).
template <int H>
__device__ __forceinline__ void Window(const float* own, float* e) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) e[kMaxHalo + j] = own[j];
#pragma unroll
  for (int j = kVec - H; j < kVec; ++j) e[j] = __shfl_up_sync(0xffffffffu, own[j], 1);
#pragma unroll
  for (int j = 0; j < H; ++j) e[kMaxHalo + kVec + j] = __shfl_down_sync(0xffffffffu, own[j], 1);
}

// The warp's place: image n, destination rows y0 + j dh (j < TH), source columns x0 + [0, 8).
struct WarpPos {
  int64_t n;
  int y0, x0;
  bool ok;  // the warp exists (the last block may have fewer)
};
template <int TH>
__device__ __forceinline__ WarpPos Place(const PlaneArgs& g) {
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  WarpPos p;
  p.ok = wid < g.warps;
  int64_t t = p.ok ? wid : 0;
  const int strip = static_cast<int>(t % g.strips);
  t /= g.strips;
  const int phase = static_cast<int>(t % g.dh);
  t /= g.dh;
  const int grp = static_cast<int>(t % g.groups);
  p.n = t / g.groups;
  p.y0 = grp * TH * g.dh + phase;
  p.x0 = strip * kStripCols - kVec + static_cast<int>(threadIdx.x % 32) * kVec;
  return p;
}

// fwd and dgrad: dst[y0 + j dh, x0 + c] for j < TH, lanes 1..30. FLIP: the dgrad (w rotated by 180 degrees).
template <class T, class TO, int K, int DW, int TH, bool FLIP>
__global__ void __launch_bounds__(kWarps * 32) PlaneFwdKernel(const PlaneArgs g, const T* __restrict__ src,
                                                              const T* __restrict__ w, const TO* __restrict__ bias,
                                                              TO* __restrict__ dst) {
  constexpr int H = (K - 1) / 2 * DW, M = TH + K - 1;
  const WarpPos p = Place<TH>(g);
  if (!p.ok) return;  // whole warps only: the shuffles below see full warps
  const int lane = threadIdx.x % 32;
  const bool col_ok = p.x0 >= 0 && p.x0 < g.cols;
  const T* sbase = src + p.n * g.src_img + p.x0;
  Raw<T> raw[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int ys = p.y0 - g.ph + m * g.dh;
    raw[m] = LoadRaw(sbase + static_cast<int64_t>(ys) * g.cols, col_ok && ys >= 0 && ys < g.src_rows);
  }
  float wt[K][K];
#pragma unroll
  for (int r = 0; r < K; ++r)
#pragma unroll
    for (int s = 0; s < K; ++s) wt[r][s] = ToAcc(w[FLIP ? (K - 1 - r) * K + (K - 1 - s) : r * K + s]);
  const float b0 = g.has_bias ? ToAcc(bias[0]) : 0.f;
  const bool store_col = col_ok && lane >= 1 && lane <= 30;
  TO* dbase = dst + p.n * g.dst_img + p.x0;
  float acc[TH][kVec];
#pragma unroll
  for (int j = 0; j < TH; ++j)
#pragma unroll
    for (int c = 0; c < kVec; ++c) acc[j][c] = 0.f;
  // The activation as a template argument: inlined per output, Activate's switch made this short kernel's code
  // (fetched cold by every SM) several times longer.
  WithActivation(g.act, [&](auto act_c) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float own[kVec], e[kVec + 2 * kMaxHalo];
      Unpack(raw[m], own);
      Window<H>(own, e);
#pragma unroll
      for (int r = 0; r < K; ++r) {
        const int j = m - r;  // source comb row m is tap r of destination row j
        if (j < 0 || j >= TH) continue;
#pragma unroll
        for (int c = 0; c < kVec; ++c)
#pragma unroll
          for (int s = 0; s < K; ++s) {
            acc[j][c] = fmaf(wt[r][s], e[kMaxHalo + c + (s - (K - 1) / 2) * DW], acc[j][c]);
          }
      }
      const int jd = m - (K - 1);  // destination row jd has all its taps now
      if (jd >= 0) {
        const int yd = p.y0 + jd * g.dh;
        if (store_col && yd < g.dst_rows) {
          float v[kVec];
#pragma unroll
          for (int c = 0; c < kVec; ++c) v[c] = Activate(acc[jd][c] + b0, decltype(act_c)::value);
          Store8(dbase + static_cast<int64_t>(yd) * g.cols, v);
        }
      }
    }
  });
}

// wgrad: one partial dw (K * K floats) per block into part[blockIdx.x * K * K + f].
template <class T, int K, int DW, int TH>
__global__ void __launch_bounds__(kWarps * 32) PlaneWgradKernel(const PlaneArgs g, const T* __restrict__ x,
                                                                const T* __restrict__ dy, float* __restrict__ part) {
  constexpr int H = (K - 1) / 2 * DW, M = TH + K - 1;
  __shared__ float red[kWarps][K * K];
  const WarpPos p = Place<TH>(g);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[K][K];
#pragma unroll
  for (int r = 0; r < K; ++r)
#pragma unroll
    for (int s = 0; s < K; ++s) acc[r][s] = 0.f;
  if (p.ok) {
    const bool col_ok = p.x0 >= 0 && p.x0 < g.cols;
    const bool dy_col = col_ok && lane >= 1 && lane <= 30;  // the halo lanes' dy columns belong to other warps
    const T* xbase = x + p.n * g.src_img + p.x0;
    const T* dbase = dy + p.n * g.dst_img + p.x0;
    Raw<T> rx[M], rd[TH];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int ys = p.y0 - g.ph + m * g.dh;
      rx[m] = LoadRaw(xbase + static_cast<int64_t>(ys) * g.cols, col_ok && ys >= 0 && ys < g.src_rows);
    }
#pragma unroll
    for (int j = 0; j < TH; ++j) {
      const int yd = p.y0 + j * g.dh;
      rd[j] = LoadRaw(dbase + static_cast<int64_t>(yd) * g.cols, dy_col && yd < g.dst_rows);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float own[kVec], e[kVec + 2 * kMaxHalo];
      Unpack(rx[m], own);
      Window<H>(own, e);
#pragma unroll
      for (int r = 0; r < K; ++r) {
        const int j = m - r;
        if (j < 0 || j >= TH) continue;
        float d[kVec];
        Unpack(rd[j], d);
#pragma unroll
        for (int s = 0; s < K; ++s)
#pragma unroll
          for (int c = 0; c < kVec; ++c) acc[r][s] = fmaf(e[kMaxHalo + c + (s - (K - 1) / 2) * DW], d[c], acc[r][s]);
      }
    }
  }
  // Fixed-order reductions: lanes by xor shuffles, then the block's warps in order.
#pragma unroll
  for (int r = 0; r < K; ++r)
#pragma unroll
    for (int s = 0; s < K; ++s) {
      const float v = WarpSum(acc[r][s]);
      if (lane == 0) red[warp][r * K + s] = v;
    }
  __syncthreads();
  if (threadIdx.x < K * K) {
    float v = red[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) v += red[i][threadIdx.x];
    part[static_cast<int64_t>(blockIdx.x) * K * K + threadIdx.x] = v;
  }
}

// Rows per warp: 4, or 2 on small problems, whose time is one warp's chain of loads and FMAs. Measured on the
// H100 (2026-11-22, forward, 3x3): 4096^2 bf16 34.7 us at 4 rows, 39.6 at 8, 40.5 at 2; 1024^2 bf16 3.1 us at 2,
// 3.4 at 4, 5.4 at 8.
int RowsPerWarp(const ConvParams& p, int64_t dst_rows);

template <class F>
cudaError_t WithRows(int th, F&& f) {
  return th == 2 ? f(IntC<2>{}) : f(IntC<4>{});
}

int KernelTaps(const ConvParams& p) { return static_cast<int>(p.win[2]); }

// Geometry for `src_rows` source and `dst_rows` destination rows; ph as in PlaneArgs.
PlaneArgs MakeArgs(const ConvParams& p, int64_t src_rows, int64_t dst_rows, int64_t ph, int th) {
  PlaneArgs g{};
  g.cols = static_cast<int>(p.in[2]);
  g.src_rows = static_cast<int>(src_rows);
  g.dst_rows = static_cast<int>(dst_rows);
  g.src_img = src_rows * p.in[2];
  g.dst_img = dst_rows * p.in[2];
  g.dh = static_cast<int>(p.rhs_dil[1]);
  g.ph = static_cast<int>(ph);
  g.strips = static_cast<int>(CeilDiv(p.in[2], kStripCols));
  g.groups = static_cast<int>(CeilDiv(dst_rows, int64_t(th) * g.dh));
  g.warps = p.n[0] * g.groups * g.dh * g.strips;
  g.act = static_cast<int>(p.activation[0]);
  g.has_bias = static_cast<int>(p.has_bias[0]);
  return g;
}

// Calls f(IntC<K>, IntC<DW>) for the problem's (K, dw); false for any other pair.
template <class F>
bool WithTaps(const ConvParams& p, F&& f) {
  const int k = KernelTaps(p);
  const int64_t dw = p.rhs_dil[2];
  if (k == 3) {
    switch (dw) {
      case 1: f(IntC<3>{}, IntC<1>{}); return true;
      case 2: f(IntC<3>{}, IntC<2>{}); return true;
      case 4: f(IntC<3>{}, IntC<4>{}); return true;
      case 8: f(IntC<3>{}, IntC<8>{}); return true;
      default: return false;
    }
  }
  if (k == 5) {
    switch (dw) {
      case 1: f(IntC<5>{}, IntC<1>{}); return true;
      case 2: f(IntC<5>{}, IntC<2>{}); return true;
      case 4: f(IntC<5>{}, IntC<4>{}); return true;
      default: return false;
    }
  }
  return false;
}

template <class T, class TO, bool FLIP>
cudaError_t LaunchFwd(const ConvParams& p, int64_t src_rows, int64_t dst_rows, int64_t ph, const void* src,
                      const void* w, const void* bias, void* dst, cudaStream_t s) {
  auto go = [&](auto th) {
    constexpr int TH = decltype(th)::value;
    const PlaneArgs g = MakeArgs(p, src_rows, dst_rows, ph, TH);
    const unsigned blocks = static_cast<unsigned>(CeilDiv(g.warps, kWarps));
    WithTaps(p, [&](auto k, auto dw) {
      PlaneFwdKernel<T, TO, decltype(k)::value, decltype(dw)::value, TH, FLIP><<<blocks, kWarps * 32, 0, s>>>(
          g, static_cast<const T*>(src), static_cast<const T*>(w), static_cast<const TO*>(bias),
          static_cast<TO*>(dst));
    });
    return cudaGetLastError();
  };
  // One row per warp for float32 where two rows still leave fewer than kBusyWarps warps: a warp's chain is its
  // rows' loads (two 16-byte vectors a lane per row) and FMAs. H200, run 158, msd 1 -> 1 256^2: f32 forward 1.79
  // -> 1.66 us, data gradient 1.75 -> 1.61; bf16 1.69 -> 1.76 and 1.64 -> 1.73, so 16-bit types keep two.
  const int th = RowsPerWarp(p, dst_rows);
  if constexpr (sizeof(T) == 4) {
    if (th == 2 && MakeArgs(p, dst_rows, dst_rows, 0, 2).warps < kBusyWarps) return go(IntC<1>{});
  }
  return WithRows(th, go);
}

int RowsPerWarp(const ConvParams& p, int64_t dst_rows) {
  // At least kBusyWarps at 4 rows, else 2 rows.
  return MakeArgs(p, dst_rows, dst_rows, 0, 4).warps < kBusyWarps ? 2 : 4;
}

// ---- c -> 1 forward (k == 1, channels-last, 2 <= c): y[y, x] = act(bias + sum_{r,s,ch} w[r, s, ch] x[.., ch]) ----
// A pixel's c channels are G = c / VC lanes of VC channels (one 8- or 16-byte load each; G a power of two <= 32),
// so a warp covers 32 / G consecutive destination pixels of a row and TH comb rows (as above). Lane (pixel, g)
// loads, per source row and column tap, its VC channels at the tapped column (neighbouring pixels' loads of
// the same row hit L1), accumulates the K taps of the K destination rows that row feeds, and the G lanes of a
// pixel add their partial sums by xor shuffles. Any column padding and dilation (loads are per column).
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

}  // namespace

bool PlaneStencilApplies(const ConvParams& p, DType in) {
  if (in == DType::kF64) return false;
  if (p.c[0] != 1 || p.k[0] != 1 || p.groups[0] != 1 || p.batch_groups[0] != 1 || p.n[0] < 1) return false;
  // 2-D (the leading padded dim trivial), unit stride, no lhs dilation.
  if (p.in[0] != 1 || p.out[0] != 1 || p.win[0] != 1 || p.pad_lo[0] != 0 || p.pad_hi[0] != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1) return false;
  const int64_t k = p.win[2], dw = p.rhs_dil[2], half = (k - 1) / 2 * dw;
  if (p.win[1] != k || (k != 3 && k != 5) || (dw != 1 && dw != 2 && dw != 4 && dw != 8) || half > kMaxHalo) {
    return false;
  }
  if (p.pad_lo[2] != half || p.pad_hi[2] != half || p.out[2] != p.in[2] || p.in[2] < kVec || p.in[2] % kVec != 0) {
    return false;  // (a zero width would launch an empty grid)
  }
  if (p.in[1] < 1 || p.out[1] < 1 || p.rhs_dil[1] > (1 << 16)) return false;
  // Rows, columns and in-image offsets are 32-bit; |pad| bounded so source rows stay in int range.
  const int64_t rows = p.in[1] > p.out[1] ? p.in[1] : p.out[1];
  if (rows * p.in[2] > INT32_MAX || p.pad_lo[1] < -(1 << 20) || p.pad_lo[1] > (1 << 20)) return false;
  // One block per kWarps warps in a 1-D grid (2 rows per warp: the most warps).
  return CeilDiv(MakeArgs(p, rows, rows, 0, 2).warps, kWarps) <= INT32_MAX;
}

int64_t PlaneWgradBlocks(const ConvParams& p) {
  return CeilDiv(MakeArgs(p, p.in[1], p.out[1], p.pad_lo[1], RowsPerWarp(p, p.out[1])).warps, kWarps);
}

cudaError_t PlaneStencilFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched) {
  *launched = false;
  if (!PlaneStencilApplies(p, in) || !Aligned16(x) || !Aligned16(y)) return cudaSuccess;
  *launched = true;
  return WithF32AccTypes(in, out, [&](auto t, auto to) {
    using T = decltype(t);
    return LaunchFwd<T, decltype(to), false>(p, p.in[1], p.out[1], p.pad_lo[1], x, w, bias, y, s);
  });
}

cudaError_t PlaneStencilDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched) {
  *launched = false;
  if (!PlaneStencilApplies(p, in) || !Aligned16(dy) || !Aligned16(dx)) return cudaSuccess;
  *launched = true;
  const int64_t ph = (p.win[1] - 1) * p.rhs_dil[1] - p.pad_lo[1];  // the rotated filter's row offset
  ConvParams q = p;
  q.activation[0] = kActNone;
  q.has_bias[0] = 0;
  return WithF32AccTypes(in, out, [&](auto t, auto to) {
    using T = decltype(t);
    return LaunchFwd<T, decltype(to), true>(q, p.out[1], p.in[1], ph, dy, w, nullptr, dx, s);
  });
}

cudaError_t PlaneStencilWgrad(const ConvParams& p, DType in, const void* x, const void* dy, float* partials,
                              cudaStream_t s, bool* launched) {
  *launched = false;
  if (!PlaneStencilApplies(p, in) || !Aligned16(x) || !Aligned16(dy)) return cudaSuccess;
  *launched = true;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    return WithRows(RowsPerWarp(p, p.out[1]), [&](auto th) {
      constexpr int TH = decltype(th)::value;
      const PlaneArgs g = MakeArgs(p, p.in[1], p.out[1], p.pad_lo[1], TH);
      const unsigned blocks = static_cast<unsigned>(CeilDiv(g.warps, kWarps));
      WithTaps(p, [&](auto k, auto dw) {
        PlaneWgradKernel<T, decltype(k)::value, decltype(dw)::value, TH><<<blocks, kWarps * 32, 0, s>>>(
            g, static_cast<const T*>(x), static_cast<const T*>(dy), partials);
      });
      return cudaGetLastError();
    });
  };
  switch (in) {
    case DType::kBF16: return run(__nv_bfloat16{});
    case DType::kF16: return run(__half{});
    default: return run(float{});
  }
}

bool ReduceStencilApplies(const ConvParams& p, DType in) {
  if (in == DType::kF64 || p.layout[0] != kChannelsLast) return false;
  if (p.k[0] != 1 || p.c[0] < 2 || p.groups[0] != 1 || p.batch_groups[0] != 1 || p.n[0] < 1) return false;
  if (p.in[0] != 1 || p.out[0] != 1 || p.win[0] != 1 || p.pad_lo[0] != 0 || p.pad_hi[0] != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1) return false;
  if (p.win[1] != 3 || p.win[2] != 3 || p.out[1] < 1 || p.out[2] < 1) return false;
  const int vc = ReduceVc(p, in);
  const int64_t lanes = p.c[0] / vc;
  if (p.c[0] % vc != 0 || lanes > 32 || (lanes & (lanes - 1)) != 0) return false;
  // 32-bit coordinates (pads and dilations bounded so tapped positions stay in int range).
  for (int d = 1; d < 3; ++d) {
    if (p.in[d] > (1 << 24) || p.out[d] > (1 << 24) || p.rhs_dil[d] > (1 << 20)) return false;
    if (p.pad_lo[d] < -(1 << 24) || p.pad_lo[d] > (1 << 24)) return false;
  }
  return CeilDiv(MakeReduceArgs(p, static_cast<int>(lanes), 2).warps, kWarps) <= INT32_MAX;
}

cudaError_t ReduceStencilFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                             void* y, cudaStream_t s, bool* launched) {
  *launched = false;
  const int eb = in == DType::kF32 ? 4 : 2;
  if (!ReduceStencilApplies(p, in) || reinterpret_cast<uintptr_t>(x) % (ReduceVc(p, in) * eb) != 0) return cudaSuccess;
  *launched = true;
  const bool wide = ReduceVc(p, in) * eb == 16;
  return WithF32AccTypes(in, out, [&](auto t, auto to) {
    using T = decltype(t);
    using TO = decltype(to);
    constexpr int kWide = 16 / sizeof(T), kNarrow = 8 / sizeof(T);
    return wide ? LaunchReduce<T, TO, kWide>(p, x, w, bias, y, s) : LaunchReduce<T, TO, kNarrow>(p, x, w, bias, y, s);
  });
}


}  // namespace cuda
}  // namespace jaxconv
