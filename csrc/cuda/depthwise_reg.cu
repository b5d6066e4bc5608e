// Depthwise 3x3 forward (stride 1 or 2) and stride-1 data gradient as a register stencil, float32, channels-last
// 2-D, no dilation, c a multiple of 4. The depthwise family's first choice where it applies (depthwise.cu keeps
// everything else). On the H100 (2026-11-22) it ran MobileNetV2's 3x3 layers (56^2 x 144, b32) in 50-62 us
// against 93 us for depthwise.cu's staged kernel; on 16-bit data and on ConvNeXt's 7x7 the staged kernel was as
// fast or faster, so those stay there.
//
// Thread = (4 consecutive channels (one 16-byte vector), destination column x, TH destination rows): consecutive
// threads take consecutive channel vectors, then columns, so a warp's loads of one source pixel row are
// contiguous. Per window column s the thread loads the M = (TH - 1) * S + K source rows of its column (kept in
// registers), then for every window row r one filter vector (L1-resident) feeds the TH destination rows:
// M + K loads per column for TH outputs. Neighbouring columns' threads load overlapping pixels, which hit L1.
//   fwd:   y[y, x, c]  = act(bias[c] + sum_{r,s} w[r, s, c] * x[y S - ph + r, x S - pw + s, c])
//   dgrad: dx[y, x, c] = sum_{r,s} w[K-1-r, K-1-s, c] * dy[y - (K-1-ph) + r, x - (K-1-pw) + s, c]   (S == 1)
#include <climits>
#include <cstdint>

#include "cuda/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVc = 4;  // channels per thread (one 16-byte vector of floats)
constexpr int kK = 3;   // window

struct DwRegArgs {
  int64_t threads;                         // n * groups * dst_cols * vecs
  int src_rows, src_cols, dst_rows, dst_cols;
  int vecs;                                // c / kVc
  int c, ph, pw, groups;                   // groups: row groups of TH destination rows
  int act, has_bias;
};

template <int S, int TH, bool FLIP>
__global__ void __launch_bounds__(kThreads) DwRegKernel(const DwRegArgs g, const float* __restrict__ src,
                                                        const float* __restrict__ w, const float* __restrict__ bias,
                                                        float* __restrict__ dst) {
  constexpr int K = kK, VC = kVc;
  constexpr int M = (TH - 1) * S + K;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= g.threads) return;
  int64_t q = t;
  const int vec = static_cast<int>(q % g.vecs);
  q /= g.vecs;
  const int xd = static_cast<int>(q % g.dst_cols);
  q /= g.dst_cols;
  const int grp = static_cast<int>(q % g.groups);
  const int64_t n = q / g.groups;
  const int c0 = vec * VC, y0 = grp * TH;
  const int ys0 = y0 * S - g.ph, xs0 = xd * S - g.pw;
  const float* sn = src + n * g.src_rows * static_cast<int64_t>(g.src_cols) * g.c + c0;
  float acc[TH][VC];
#pragma unroll
  for (int j = 0; j < TH; ++j)
#pragma unroll
    for (int i = 0; i < VC; ++i) acc[j][i] = 0.f;
#pragma unroll
  for (int s = 0; s < K; ++s) {
    const int xs = xs0 + s;
    const bool col_ok = xs >= 0 && xs < g.src_cols;
    float col[M][VC];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int ys = ys0 + m;
      if (col_ok && ys >= 0 && ys < g.src_rows) {
        LdGlobalAcc<float, float, VC>(sn + (static_cast<int64_t>(ys) * g.src_cols + xs) * g.c, col[m]);
      } else {
#pragma unroll
        for (int i = 0; i < VC; ++i) col[m][i] = 0.f;
      }
    }
#pragma unroll
    for (int r = 0; r < K; ++r) {
      float wv[VC];
      const int tap = FLIP ? (K - 1 - r) * K + (K - 1 - s) : r * K + s;
      LdGlobalAcc<float, float, VC>(w + static_cast<int64_t>(tap) * g.c + c0, wv);
#pragma unroll
      for (int j = 0; j < TH; ++j)
#pragma unroll
        for (int i = 0; i < VC; ++i) acc[j][i] = fmaf(wv[i], col[j * S + r][i], acc[j][i]);
    }
  }
  float b[VC];
#pragma unroll
  for (int i = 0; i < VC; ++i) b[i] = 0.f;
  if (g.has_bias) {
#pragma unroll
    for (int i = 0; i < VC; ++i) b[i] = bias[c0 + i];
  }
  float* dn = dst + n * g.dst_rows * static_cast<int64_t>(g.dst_cols) * g.c + c0;
#pragma unroll
  for (int j = 0; j < TH; ++j) {
    const int yd = y0 + j;
    if (yd >= g.dst_rows) break;
    float v[VC];
#pragma unroll
    for (int i = 0; i < VC; ++i) v[i] = Activate(acc[j][i] + b[i], g.act);
    float* out = dn + (static_cast<int64_t>(yd) * g.dst_cols + xd) * g.c;
    StGlobal<float, float, VC>(out, v);
  }
}

DwRegArgs MakeArgs(const ConvParams& p, int64_t src_rows, int64_t src_cols, int64_t dst_rows, int64_t dst_cols,
                   int64_t ph, int64_t pw, int th) {
  DwRegArgs a{};
  a.src_rows = static_cast<int>(src_rows);
  a.src_cols = static_cast<int>(src_cols);
  a.dst_rows = static_cast<int>(dst_rows);
  a.dst_cols = static_cast<int>(dst_cols);
  a.c = static_cast<int>(p.c[0]);
  a.vecs = static_cast<int>(p.c[0] / kVc);
  a.ph = static_cast<int>(ph);
  a.pw = static_cast<int>(pw);
  a.groups = static_cast<int>(CeilDiv(dst_rows, th));
  a.threads = p.n[0] * a.groups * dst_cols * a.vecs;
  a.act = static_cast<int>(p.activation[0]);
  a.has_bias = static_cast<int>(p.has_bias[0]);
  return a;
}

// Destination rows per thread: 4, or 2 when 4 would leave fewer than kBusyWarps warps.
int RowsPerThread(const ConvParams& p, int64_t dst_rows, int64_t dst_cols) {
  return MakeArgs(p, 1, 1, dst_rows, dst_cols, 0, 0, 4).threads < 32 * kBusyWarps ? 2 : 4;
}

template <bool FLIP>
cudaError_t Launch(const ConvParams& p, int64_t src_rows, int64_t src_cols, int64_t dst_rows, int64_t dst_cols,
                   int64_t ph, int64_t pw, const void* src, const void* w, const void* bias, void* dst,
                   cudaStream_t s) {
  const int th = RowsPerThread(p, dst_rows, dst_cols);
  const int64_t stride = p.stride[1];
  auto go = [&](auto sc, auto thc) {
    constexpr int S = decltype(sc)::value, TH = decltype(thc)::value;
    const DwRegArgs a = MakeArgs(p, src_rows, src_cols, dst_rows, dst_cols, ph, pw, TH);
    DwRegKernel<S, TH, FLIP><<<static_cast<unsigned>(CeilDiv(a.threads, kThreads)), kThreads, 0, s>>>(
        a, static_cast<const float*>(src), static_cast<const float*>(w), static_cast<const float*>(bias),
        static_cast<float*>(dst));
    return cudaGetLastError();
  };
  auto with_th = [&](auto sc) { return th == 2 ? go(sc, IntC<2>{}) : go(sc, IntC<4>{}); };
  if constexpr (FLIP) return with_th(IntC<1>{});  // the data gradient: stride 1 only
  else return stride == 1 ? with_th(IntC<1>{}) : with_th(IntC<2>{});
}

}  // namespace

bool DepthwiseRegApplies(const ConvParams& p, CudaOp op, DT in) {
  if (in != DT::kF32 || op == CudaOp::kWgrad || p.layout[0] != kChannelsLast) return false;
  const int64_t c = p.c[0];
  if (p.groups[0] != c || p.k[0] != c || p.batch_groups[0] != 1 || p.n[0] < 1 || c < 1) return false;
  if (c % kVc != 0) return false;
  if (p.in[0] != 1 || p.out[0] != 1 || p.win[0] != 1 || p.pad_lo[0] != 0 || p.pad_hi[0] != 0) return false;
  const int64_t k = p.win[1], st = p.stride[1];
  if (p.win[2] != k || k != kK || p.stride[2] != st || (st != 1 && st != 2)) return false;
  if (op == CudaOp::kDgrad && st != 1) return false;
  for (int d = 1; d < 3; ++d) {
    if (p.rhs_dil[d] != 1 || p.lhs_dil[d] != 1 || p.out[d] < 1) return false;
    if (p.pad_lo[d] < 0 || p.pad_lo[d] >= k || p.in[d] > (1 << 24) || p.out[d] > (1 << 24)) return false;
  }
  // 32-bit channel offsets within an image; a 1-D grid.
  if (p.in[1] * p.in[2] * c > INT32_MAX || p.out[1] * p.out[2] * c > INT32_MAX) return false;
  return CeilDiv(MakeArgs(p, 1, 1, p.out[1], p.out[2], 0, 0, 2).threads, kThreads) <= INT32_MAX &&
         CeilDiv(MakeArgs(p, 1, 1, p.in[1], p.in[2], 0, 0, 2).threads, kThreads) <= INT32_MAX;
}

cudaError_t DepthwiseRegFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched) {
  *launched = false;
  if (!DepthwiseRegApplies(p, CudaOp::kFwd, in) || out != DT::kF32 || !Aligned16(x) || !Aligned16(w) ||
      !Aligned16(y)) {
    return cudaSuccess;
  }
  *launched = true;
  return Launch<false>(p, p.in[1], p.in[2], p.out[1], p.out[2], p.pad_lo[1], p.pad_lo[2], x, w, bias, y, s);
}

cudaError_t DepthwiseRegDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched) {
  *launched = false;
  if (!DepthwiseRegApplies(p, CudaOp::kDgrad, in) || out != DT::kF32 || !Aligned16(dy) || !Aligned16(w) ||
      !Aligned16(dx)) {
    return cudaSuccess;
  }
  *launched = true;
  ConvParams q = p;
  q.activation[0] = kActNone;
  q.has_bias[0] = 0;
  const int64_t k = p.win[1];
  return Launch<true>(q, p.out[1], p.out[2], p.in[1], p.in[2], k - 1 - p.pad_lo[1], k - 1 - p.pad_lo[2], dy, w,
                             nullptr, dx, s);
}

}  // namespace cuda
}  // namespace jaxconv
