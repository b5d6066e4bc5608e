// small.plane_stencil: single-channel 2-D stencils (c == k == 1, groups 1): the forward, data gradient and filter
// gradient of the msd-style "1 -> 1" layers, which are pure bandwidth problems (9 FMAs per 2-byte pixel read and
// written).
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
//          family's reduction (reduce.h) adds the partials in block order (deterministic, no atomics).
// Columns need "same" padding (pw = (K - 1) / 2 * dw on both sides, so the destination has the source's
// width) and a width that is a multiple of 8 (16-byte aligned rows); rows take any padding.
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/small/reduce.h"
#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
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
  // (fetched cold by every SM) several times longer. The data gradient (FLIP) has none.
  WithActivationIf<!FLIP>(g.act, [&](auto act_c) {
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

// Rows per warp: 4, or 2 where 4 leave fewer than kBusyWarps warps (small problems, whose time is one warp's chain of
// loads and FMAs); 8 rows were slower at every size.
int RowsPerWarp(const ConvParams& p, int64_t dst_rows) {
  return MakeArgs(p, dst_rows, dst_rows, 0, 4).warps < kBusyWarps ? 2 : 4;
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
  // rows' loads (two 16-byte vectors a lane per row) and FMAs. 16-bit types keep two rows (one was slower there).
  const int th = RowsPerWarp(p, dst_rows);
  if constexpr (sizeof(T) == 4) {
    if (th == 2 && MakeArgs(p, dst_rows, dst_rows, 0, 2).warps < kBusyWarps) return go(IntC<1>{});
  }
  return WithRows(th, go);
}
// The filter gradient's partial filters: one per block.
int64_t PlaneWgradBlocks(const ConvParams& p) {
  return CeilDiv(MakeArgs(p, p.in[1], p.out[1], p.pad_lo[1], RowsPerWarp(p, p.out[1])).warps, kWarps);
}

cudaError_t LaunchWgrad(const ConvParams& p, DType in, const void* x, const void* dy, float* partials, cudaStream_t s) {
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

// The geometry the kernels take ("" when they take the problem).
std::string PlaneError(const ConvParams& p) {
  if (p.c[0] != 1 || p.k[0] != 1 || p.groups[0] != 1 || p.batch_groups[0] != 1) return "it takes c == k == 1";
  if (p.n[0] < 1) return "it takes a nonempty batch";
  // 2-D (the leading padded dim trivial), unit stride, no lhs dilation.
  if (p.in[0] != 1 || p.out[0] != 1 || p.win[0] != 1 || p.pad_lo[0] != 0 || p.pad_hi[0] != 0) {
    return "it takes 2-D problems";
  }
  for (int d = 0; d < 3; ++d) {
    if (p.stride[d] != 1 || p.lhs_dil[d] != 1) return "it takes unit strides and no lhs dilation";
  }
  const int64_t k = p.win[2], dw = p.rhs_dil[2], half = (k - 1) / 2 * dw;
  if (p.win[1] != k || (k != 3 && k != 5) || (dw != 1 && dw != 2 && dw != 4 && dw != 8) || half > kMaxHalo) {
    return "it takes 3x3 or 5x5 windows, column dilation 1, 2, 4 or 8 and a halo of at most 8 columns";
  }
  // (a zero width would launch an empty grid)
  if (p.pad_lo[2] != half || p.pad_hi[2] != half || p.out[2] != p.in[2] || p.in[2] < kVec || p.in[2] % kVec != 0) {
    return "it takes \"same\" column padding and a width that is a multiple of 8";
  }
  if (p.in[1] < 1 || p.out[1] < 1 || p.rhs_dil[1] > (1 << 16)) return "it takes nonempty rows, row dilation <= 2^16";
  // Rows, columns and in-image offsets are 32-bit; |pad| bounded so source rows stay in int range.
  const int64_t rows = p.in[1] > p.out[1] ? p.in[1] : p.out[1];
  if (rows * p.in[2] > INT32_MAX || p.pad_lo[1] < -(1 << 20) || p.pad_lo[1] > (1 << 20)) {
    return "extents or padding past its 32-bit coordinates";
  }
  // One block per kWarps warps in a 1-D grid (2 rows per warp: the most warps).
  if (CeilDiv(MakeArgs(p, rows, rows, 0, 2).warps, kWarps) > INT32_MAX) return "more blocks than a 1-D grid takes";
  return {};
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_plane_stencil {

std::string Applies(const Problem& pr) {
  if (std::string e = cuda::small_channel::FamilyError(pr); !e.empty()) return e;
  if (!cuda::IsF32AccPair(pr.in, pr.out)) return "it takes 16-bit or float32 operands";
  return cuda::small_channel::PlaneError(pr.p);
}

size_t Workspace(const Problem& pr) {
  if (pr.op != Op::kWgrad) return 0;
  return cuda::small_channel::PartialBytes(pr, cuda::small_channel::PlaneWgradBlocks(pr.p));
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  const ConvParams& p = pr.p;
  // 16-byte row vectors of the source and destination (the operands of the filter gradient).
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(pr.op == Op::kWgrad ? b.b : b.out)) {
    return cudaErrorMisalignedAddress;
  }
  switch (pr.op) {
    case Op::kFwd:
      return cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto to) {
        return LaunchFwd<decltype(t), decltype(to), false>(p, p.in[1], p.out[1], p.pad_lo[1], b.a, b.b, b.bias, b.out,
                                                           s);
      });
    case Op::kDgrad: {
      const int64_t ph = (p.win[1] - 1) * p.rhs_dil[1] - p.pad_lo[1];  // the rotated filter's row offset
      ConvParams q = p;
      q.activation[0] = kActNone;
      q.has_bias[0] = 0;
      return cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto to) {
        return LaunchFwd<decltype(t), decltype(to), true>(q, p.out[1], p.in[1], ph, b.a, b.b, nullptr, b.out, s);
      });
    }
    default: {
      const int64_t blocks = PlaneWgradBlocks(p);
      if (b.ws == nullptr || b.ws_bytes < PartialBytes(pr, blocks)) return cudaErrorInvalidValue;
      if (cudaError_t e = LaunchWgrad(p, pr.in, b.a, b.b, static_cast<float*>(b.ws), s); e != cudaSuccess) return e;
      return ReduceChunks(pr.in, pr.out, b.ws, blocks, WElements(p), b.out, s);
    }
  }
}

}  // namespace variants::small_plane_stencil
}  // namespace jaxconv
