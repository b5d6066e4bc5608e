// long1d.tiled: one spatial dim, long window, few channels (e.g. 1,000,000 inputs x 2047 taps, C = K = 1).
// Predicate (Long1DApplies, dispatch/rules.h): groups == batch_groups == 1, stride == lhs_dil == rhs_dil == 1, only
// the last spatial dim non-trivial, 1 <= c <= 8, 1 <= k <= 8.
// All three ops are the correlation  out[t] = sum_seg sum_r src_seg[t + r + beta] * v_seg[r]:
//   fwd:   t = o, segments c,      src = x[n, c, .],  v = w[k, c, r],        beta = -pad_lo
//   dgrad: t = i, segments kk,     src = dy[n, kk, .], v = w[kk, c, W-1-r],  beta = pad_lo - (W - 1)
//          (dgrad of a stride-1 conv is a correlation of dy with the flipped filter)
//   wgrad: t = tap, segments (n, o-range of a split), src = x[n, c, .], v = dy[n, k, r], beta = -pad_lo;
//          splits write partial sums to scratch, ReduceSplits adds them in split order (deterministic).
// A block (128 threads) owns 2048 consecutive outputs, 16 per thread in registers. Per 1152-long chunk of r it
// stages the source window (2048 + 1152 values; 4 pad words after every 16, so a lane's 16-byte loads at a stride
// of 20 words hit distinct banks) and the chunk of v in shared memory. Each thread slides a 24-value circular
// register window over the source: per 8 taps it loads 8 new source values and 8 of v (four 16-byte shared
// loads, v's as broadcasts) for 128 FMAs, so the FMA pipe, not shared memory, is the limit. (48-tap periods with
// constant shared offsets, SM-balanced 3-warp blocks, and 8 outputs per thread for more resident warps were slower.)
#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kPer = 16;                     // outputs per thread
constexpr int kTile = kThreads * kPer;       // outputs per block
constexpr int kStep = 8;                     // taps per register step
constexpr int kPeriod = 3 * kStep;           // the circular window (kPer + kStep values) repeats every 3 steps
constexpr int kChunk = 48 * kPeriod;         // reduction values per stage (1152; f64 fits 48 KiB static smem)
constexpr int kWin = kTile + kChunk;         // staged source values (the last period's loads reach kWin - 1)
__host__ __device__ constexpr int Phys(int i) { return i + 4 * (i >> 4); }

// Four consecutive shared values (16-byte aligned for float: Phys keeps runs of 16 contiguous and every index
// used here is a multiple of 4) into registers.
__device__ __forceinline__ void Load4(const float* p, float* r) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
}
__device__ __forceinline__ void Load4(const double* p, double* r) {
  const double2 a = reinterpret_cast<const double2*>(p)[0], b = reinterpret_cast<const double2*>(p)[1];
  r[0] = a.x; r[1] = a.y; r[2] = b.x; r[3] = b.y;
}

enum Mode : int { kModeFwd = 0, kModeDgrad = 1, kModeWgrad = 2 };

struct LongArgs {
  int mode, act, has_bias;
  int64_t n, c, k, width, in, out;  // width = window taps
  int64_t pad;
  int64_t xN, xC, xS, yN, yC, yS, wK, wC, wF;
  int64_t tlen, ttiles, splits, per_split, blocks, welems;
};

template <class T, class TO>
// minBlocks 4: without it ptxas picks 72 registers and spills the register window.
__global__ void __launch_bounds__(kThreads, 4) LongKernel(const LongArgs g, const T* __restrict__ a,
                                                       const T* __restrict__ b, const TO* __restrict__ bias,
                                                       TO* __restrict__ out, typename AccOf<T>::type* __restrict__ scratch) {
  using Acc = typename AccOf<T>::type;
  __shared__ __align__(16) Acc xs[Phys(kWin)];
  __shared__ __align__(16) Acc ws[kChunk];
  const int tid = threadIdx.x;
  for (int64_t blk = blockIdx.x; blk < g.blocks; blk += gridDim.x) {
    int64_t rem = blk, qq;
    qq = DivNN(rem, g.splits);
    const int64_t split = rem - qq * g.splits; rem = qq;
    qq = DivNN(rem, g.ttiles);
    const int64_t tt = rem - qq * g.ttiles; rem = qq;
    // fwd: (n, k); dgrad: (n, c); wgrad: (k, c)
    const int64_t nid1 = g.mode == kModeFwd ? g.k : g.c;
    const int64_t id0 = DivNN(rem, nid1);
    const int64_t id1 = rem - id0 * nid1;
    const int64_t t0 = tt * kTile;
    Acc acc[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) acc[j] = Acc(0);

    // segments
    int64_t q_lo, q_hi;
    if (g.mode == kModeFwd) { q_lo = 0; q_hi = g.c; }
    else if (g.mode == kModeDgrad) { q_lo = 0; q_hi = g.k; }
    else {
      const int64_t rb = split * g.per_split, re = min(g.n * g.out, rb + g.per_split);
      q_lo = g.out > 0 ? DivNN(rb, g.out) : 0;
      q_hi = g.out > 0 ? DivNN(re + g.out - 1, g.out) : 0;
      if (re <= rb) q_hi = q_lo;
    }
    for (int64_t q = q_lo; q < q_hi; ++q) {
      const T* src; const T* v; int64_t sstride, slim, vstride, beta, ra, rb;
      bool flip = false;
      if (g.mode == kModeFwd) {  // id0 = n, id1 = k, q = c
        src = a + id0 * g.xN + q * g.xC; sstride = g.xS; slim = g.in;
        v = b + id1 * g.wK + q * g.wC; vstride = g.wF;
        beta = -g.pad; ra = 0; rb = g.width;
      } else if (g.mode == kModeDgrad) {  // a = dy, id0 = n, id1 = c, q = kk
        src = a + id0 * g.yN + q * g.yC; sstride = g.yS; slim = g.out;
        v = b + q * g.wK + id1 * g.wC; vstride = g.wF; flip = true;
        beta = g.pad - (g.width - 1); ra = 0; rb = g.width;
      } else {  // a = x, b = dy, id0 = k, id1 = c, q = n
        src = a + q * g.xN + id1 * g.xC; sstride = g.xS; slim = g.in;
        v = b + q * g.yN + id0 * g.yC; vstride = g.yS;
        beta = -g.pad;
        const int64_t sb = split * g.per_split - q * g.out, se = sb + g.per_split;
        ra = sb > 0 ? sb : 0; rb = se < g.out ? se : g.out;
      }
      for (int64_t rc0 = ra; rc0 < rb; rc0 += kChunk) {
        const int64_t rlen = (rb - rc0) < kChunk ? (rb - rc0) : int64_t(kChunk);
        __syncthreads();  // previous stage fully consumed
        const int64_t base = t0 + rc0 + beta;
        for (int i = tid; i < kWin; i += kThreads) {
          const int64_t pos = base + i;
          xs[Phys(i)] = (pos >= 0 && pos < slim) ? ToAcc(src[pos * sstride]) : Acc(0);
        }
        for (int i = tid; i < kChunk; i += kThreads) {
          Acc val = Acc(0);
          if (i < rlen) {
            const int64_t r = rc0 + i;
            val = ToAcc(v[(flip ? (g.width - 1 - r) : r) * vstride]);
          }
          ws[i] = val;
        }
        __syncthreads();
        const int tb = tid * kPer;
        const int nper = static_cast<int>(rlen / kPeriod);
        // xr is circular: at the start of period p, slots 0..15 hold source values tb + r .. tb + r + 15
        // (r = p * kPeriod); step s loads tb + r + 8s + 16 .. + 23 into slots (8s + 16) % 24 .. + 7.
        Acc xr[kPer + kStep];
#pragma unroll
        for (int m = 0; m < kPer; m += 4) Load4(xs + Phys(tb + m), xr + m);
        for (int per = 0; per < nper; ++per) {
          const int r = per * kPeriod;
#pragma unroll
          for (int st = 0; st < 3; ++st) {
            constexpr int kW = kPer + kStep;
            const int slot = (st * kStep + kPer) % kW;
            Load4(xs + Phys(tb + r + st * kStep + kPer), xr + slot);
            Load4(xs + Phys(tb + r + st * kStep + kPer + 4), xr + slot + 4);
            Acc wr[kStep];
            Load4(ws + r + st * kStep, wr);
            Load4(ws + r + st * kStep + 4, wr + 4);
#pragma unroll
            for (int rr = 0; rr < kStep; ++rr)
#pragma unroll
              for (int j = 0; j < kPer; ++j) acc[j] = fma(xr[(st * kStep + rr + j) % kW], wr[rr], acc[j]);
          }
        }
        // The last < 24 taps of the chunk one at a time: exact, so no product of a padded zero tap with a
        // source value outside this output's window (inf * 0) can reach the result.
        for (int r = nper * kPeriod; r < rlen; ++r) {
          const Acc wv = ws[r];
#pragma unroll
          for (int j = 0; j < kPer; ++j) acc[j] = fma(xs[Phys(tb + r + j)], wv, acc[j]);
        }
      }
    }
    // epilogue
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t t = t0 + tid * kPer + j;
      if (t >= g.tlen) continue;
      if (g.mode == kModeFwd) {
        Acc val = acc[j];
        if (g.has_bias) val += ToAcc(bias[id1]);
        val = Activate(val, g.act);
        out[id0 * g.yN + id1 * g.yC + t * g.yS] = FromAcc<TO>(val);
      } else if (g.mode == kModeDgrad) {
        out[id0 * g.xN + id1 * g.xC + t * g.xS] = FromAcc<TO>(acc[j]);
      } else {
        const int64_t off = id0 * g.wK + id1 * g.wC + t * g.wF;
        if (g.splits == 1) out[off] = FromAcc<TO>(acc[j]);
        else scratch[split * g.welems + off] = acc[j];
      }
    }
  }
}

LongArgs MakeLongArgs(const ConvParams& p, int mode) {
  const Strides5 xs = XStrides(p), ys = YStrides(p), ws = WStrides(p);
  LongArgs g{};
  g.mode = mode;
  g.act = mode == kModeFwd ? static_cast<int>(p.activation[0]) : kActNone;
  g.has_bias = mode == kModeFwd ? static_cast<int>(p.has_bias[0]) : 0;
  g.n = p.n[0]; g.c = p.c[0]; g.k = p.k[0];
  g.width = p.win[2]; g.in = p.in[2]; g.out = p.out[2]; g.pad = p.pad_lo[2];
  g.xN = xs.s[0]; g.xC = xs.s[1]; g.xS = xs.s[4];
  g.yN = ys.s[0]; g.yC = ys.s[1]; g.yS = ys.s[4];
  g.wK = ws.s[0]; g.wC = ws.s[1]; g.wF = ws.s[4];
  g.tlen = mode == kModeFwd ? g.out : mode == kModeDgrad ? g.in : g.width;
  g.ttiles = CeilDiv(g.tlen, kTile);
  g.splits = 1;
  g.per_split = 0;
  g.welems = WElements(p);
  return g;
}

template <class T, class TO>
cudaError_t LaunchLong(const LongArgs& g, const void* a, const void* b, const void* bias, void* out, void* scratch,
                       cudaStream_t s) {
  if (g.blocks <= 0) return cudaSuccess;
  LongKernel<T, TO><<<GridX(g.blocks), kThreads, 0, s>>>(g, static_cast<const T*>(a), static_cast<const T*>(b),
                                                         static_cast<const TO*>(bias), static_cast<TO*>(out),
                                                         static_cast<typename AccOf<T>::type*>(scratch));
  return cudaGetLastError();
}

cudaError_t RunLong(const LongArgs& g, DType in, DType out, const void* a, const void* b, const void* bias, void* o,
                    void* scratch, cudaStream_t s) {
#define JAXCONV_BODY(T, TO) return LaunchLong<T, TO>(g, a, b, bias, o, scratch, s)
  JAXCONV_DTYPE_SWITCH(in, out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

cudaError_t Fwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias, void* y,
                cudaStream_t s) {
  LongArgs g = MakeLongArgs(p, kModeFwd);
  g.blocks = g.n * g.k * g.ttiles;
  return RunLong(g, in, out, x, w, bias, y, nullptr, s);
}

cudaError_t Dgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx, cudaStream_t s) {
  LongArgs g = MakeLongArgs(p, kModeDgrad);
  g.blocks = g.n * g.c * g.ttiles;
  return RunLong(g, in, out, dy, w, nullptr, dx, nullptr, s);
}

// The filter gradient's split plan: about four blocks per SM, at least 4096 reduction values per split.
int64_t WgradSplits(const ConvParams& p, DType in) {
  const LongArgs g = MakeLongArgs(p, kModeWgrad);
  const int64_t base = g.k * g.c * g.ttiles;
  const int64_t R = g.n * g.out;
  if (base <= 0 || R <= 0) return 1;
  int64_t splits = CeilDiv(4 * kPlanSms, base);
  splits = std::min<int64_t>(splits, R / 4096);
  splits = std::min<int64_t>(splits, 4096);
  const int64_t per = g.welems * static_cast<int64_t>(AccBytes(in));
  if (per > 0) splits = std::min<int64_t>(splits, (int64_t(1) << 29) / per);
  return splits < 2 ? 1 : splits;
}

cudaError_t Wgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw, void* scratch,
                  int64_t splits, cudaStream_t s) {
  LongArgs g = MakeLongArgs(p, kModeWgrad);
  if (g.welems <= 0) return cudaSuccess;
  g.splits = splits < 1 ? 1 : splits;
  g.per_split = std::max<int64_t>(1, CeilDiv(g.n * g.out, g.splits));
  g.blocks = g.k * g.c * g.ttiles * g.splits;
  if (cudaError_t e = RunLong(g, in, out, x, dy, nullptr, dw, scratch, s); e != cudaSuccess) return e;
  if (g.splits > 1) return ReduceSplits(in, out, scratch, g.splits, g.welems, dw, s);
  return cudaSuccess;
}

}  // namespace
}  // namespace cuda

namespace variants::long1d_tiled {

std::string Applies(const Problem& pr) {
  return Long1DApplies(pr.p) ? std::string()
                             : "it takes one spatial dim, unit stride and dilations, no groups and c, k <= 8";
}

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

}  // namespace variants::long1d_tiled
}  // namespace jaxconv
