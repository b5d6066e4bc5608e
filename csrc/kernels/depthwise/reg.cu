// depthwise.reg: the depthwise forward, data and filter gradients as register stencils: channels-last 1-D or 2-D (a
// 3-D problem whose D window is 1 folds D into the batch), float32 / bfloat16 / float16 in, float32 accumulation, c a
// multiple of 4, no dilation; windows 3/5/7 wide (1-D: 3/4), W stride 1 or 2, data gradients of stride 1 or 2, and
// filter gradients (DwRowWgradKernel, below). The family's CUDA-core choice where it applies, after the Hopper 3x3
// (tma_sm90.cu) and tensor-core 7x7 (mma.cu) kernels; vec.cu, tiled.cu and gather.cu take the rest.
//
// Thread = (4 consecutive channels, TH destination rows x P destination columns). Consecutive threads take
// consecutive channel vectors, then the P-column strips of a row, so a warp's loads of one source pixel row are
// contiguous (8 or 16 bytes a lane). Per source row the thread loads the L source columns its strip needs into
// registers (all L loads issued before the first use), then every (destination row, window row) pair that uses
// this source row runs KW x P vector FMAs against the filter row from shared memory (float32, flipped for the
// unit-stride data gradient, staged once per persistent block). A source row feeds up to TH destination rows, a
// source column up to KW outputs: per output about (L / P) * (M / TH) loads instead of KH * KW. The source is not
// staged in shared memory (no barrier after the filter's): the halo overlap between neighbouring threads hits L1,
// between row groups L2. It was measured about twice as fast as the staged kernel's 16-bit paths (MobileNetV2 3x3,
// ConvNeXt 7x7) and twenty times the generic kernel's stride-2 data gradient. The loop is issue-bound: per source row
// of the 3x3 bf16 kernel, 96 FFMA among 183 instructions.
//   fwd:   y[y, x, c]  = act(bias[c] + sum_{r,s} w[r, s, c] * x[y SH - ph + r, x S - pw + s, c])
//   dgrad, stride 1: the forward of dy with the filter flipped and pads k - 1 - p.
//   dgrad, stride 2 (kUp): dx[i, j, c] = sum over r, s with (i + ph - r, j + pw - s) even of
//                          w[r, s, c] * dy[(i + ph - r) / 2, (j + pw - s) / 2, c].
//     With P and TH even and strips aligned so that j + pw is even at the strip's first column, which taps reach
//     which output column is known at compile time: (e - s) even for the column e of the strip.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/depthwise/plane.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVc = 4;                       // channels per thread
constexpr int kMaxFilterFloats = 48 * 1024 / 4;  // the block's filter slice in shared memory (float32)
// float4 slots between two channel vectors' filter taps in shared memory: odd, so that the 8 threads of a quarter
// warp, reading consecutive vectors' same tap, hit distinct banks.
__host__ __device__ constexpr int TapStride(int64_t taps) { return static_cast<int>(taps | 1); }
__device__ __forceinline__ int CeilDivDev(int a, int b) { return (a + b - 1) / b; }

enum class Mode { kFwd, kUp };  // kFwd also runs the unit-stride data gradient (flipped filter)

struct DwRowArgs {
  int64_t items;             // n * row_groups * strips
  int64_t src_img, dst_img;  // elements per image
  int src_rows, src_cols, dst_rows, dst_cols;
  int c, vecs, vb, ns;       // channels, channel vectors, vectors per block, spatial items per block
  int kh, sh;                // window rows; row stride (kFwd)
  int row_groups, strips;
  // Strip k's first destination column is k * P + col0 and its first source column k * src_step + qcol0 (likewise
  // rows with row0 / qrow0); src_step is P * S (kFwd) or P / 2 (kUp).
  int col0, qcol0, row0, qrow0;
  int flip, act, has_bias, out_f32;
};

// The L channel vectors of a source row's strip (rp: its first column, c elements apart), zero for the columns
// outside the image (bit l of cmask clear: zero padding).
template <class T, int L>
__device__ __forceinline__ void LdColumns(const T* rp, int c, unsigned cmask, float (&sv)[L][kVc]) {
#pragma unroll
  for (int l = 0; l < L; ++l, rp += c) {
    if (cmask & (1u << l)) {
      LdGlobalAcc<T, float, kVc>(rp, sv[l]);
    } else {
#pragma unroll
      for (int i = 0; i < kVc; ++i) sv[l][i] = 0.f;
    }
  }
}

// The TH x P outputs of one item (d: the image's channel vector), bias and activation applied. The output dtype is
// the caller's branch, once per item: tested per pixel, ptxas reloaded the output pointer and branched at each
// (measured a few per cent faster on MobileNetV2 and Mamba bf16). Unpredicated stores for items wholly inside
// were no faster and took the 3x3 kernels past 80 registers.
template <class TO, int TH, int P, int kAct>
__device__ __forceinline__ void StoreTile(TO* d, const float (&acc)[TH][P][kVc], const float (&b)[kVc], int y0,
                                          int x0, const DwRowArgs& g) {
#pragma unroll
  for (int j = 0; j < TH; ++j) {
    const int yd = y0 + j;
    if (yd < 0 || yd >= g.dst_rows) continue;
    TO* row = d + yd * g.dst_cols * g.c;  // < 2^31 elements per image (checked on the host)
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int xd = x0 + p;
      if (xd < 0 || xd >= g.dst_cols) continue;
      float o[kVc];
#pragma unroll
      for (int i = 0; i < kVc; ++i) o[i] = Activate(acc[j][p][i] + b[i], kAct);
      StGlobal<TO, float, kVc>(row + xd * g.c, o);
    }
  }
}

template <class T, int KW, int S, int TH, int P, Mode MODE>
__global__ void __launch_bounds__(kThreads) DwRowKernel(const DwRowArgs g, const T* __restrict__ src,
                                                        const T* __restrict__ w, const void* __restrict__ bias,
                                                        void* __restrict__ dst) {
  static_assert(MODE == Mode::kFwd || (S == 2 && P % 2 == 0), "kUp: stride 2, even strips");
  // Source columns per strip.
  constexpr int L = MODE == Mode::kFwd ? (P - 1) * S + KW : (P - 1) / 2 + (KW - 1) / 2 + 1;
  constexpr int HW = (KW - 1) / 2;  // kUp: column e, tap s reads source column (e - s) / 2 + HW of the strip
  static_assert(L <= 32, "column mask");
  // The filter slice of this block's channel vectors, [vb][TapStride(taps)]: a thread's taps are contiguous (LDS
  // with immediate offsets), and the odd stride keeps a quarter warp's 16-byte reads on distinct banks.
  extern __shared__ float4 wsm[];
  const int vt0 = blockIdx.y * g.vb;
  const int nv = min(g.vb, g.vecs - vt0);
  const int taps = g.kh * KW, tstride = TapStride(taps);
  for (int i = threadIdx.x; i < taps * g.vb; i += blockDim.x) {
    const int v = i / taps, tap = i - v * taps;
    float f[kVc] = {0.f, 0.f, 0.f, 0.f};
    if (v < nv) {
      const int st = g.flip ? taps - 1 - tap : tap;
      LdGlobalAcc<T, float, kVc>(w + static_cast<int64_t>(st) * g.c + (vt0 + v) * kVc, f);
    }
    wsm[v * tstride + tap] = make_float4(f[0], f[1], f[2], f[3]);
  }
  __syncthreads();
  const int v = threadIdx.x % g.vb, slot = threadIdx.x / g.vb;
  if (v >= nv || slot >= g.ns) return;
  const int c0 = (vt0 + v) * kVc;
  const int hh = (g.kh - 1) / 2;
  const int rows = MODE == Mode::kFwd ? (TH - 1) * g.sh + g.kh : (TH - 1) / 2 + hh + 1;
  const int row_elems = g.src_cols * g.c;
  float b[kVc] = {0.f, 0.f, 0.f, 0.f};
  if (g.has_bias) {
#pragma unroll
    for (int i = 0; i < kVc; ++i) {
      b[i] = g.out_f32 ? static_cast<const float*>(bias)[c0 + i] : ToAcc(static_cast<const T*>(bias)[c0 + i]);
    }
  }
  // Persistent blocks (the grid is at most what fits at once): the filter slice is staged once for all the items
  // a block takes. items < 2^31 (checked on the host): 32-bit index arithmetic.
  for (unsigned item = blockIdx.x * g.ns + slot; item < static_cast<unsigned>(g.items); item += gridDim.x * g.ns) {
    const unsigned q = item / static_cast<unsigned>(g.strips);
    const int strip = static_cast<int>(item - q * static_cast<unsigned>(g.strips));
    const unsigned n = q / static_cast<unsigned>(g.row_groups);
    const int rg = static_cast<int>(q - n * static_cast<unsigned>(g.row_groups));
    const int x0 = strip * P + g.col0, y0 = rg * TH + g.row0;
    const int qc0 = strip * (MODE == Mode::kFwd ? P * S : P / 2) + g.qcol0;
    const int qr0 = rg * (MODE == Mode::kFwd ? TH * g.sh : TH / 2) + g.qrow0;
    // Which of the strip's source columns lie inside the image (the same for every row).
    unsigned cmask = 0;
#pragma unroll
    for (int l = 0; l < L; ++l) cmask |= (qc0 + l >= 0 && qc0 + l < g.src_cols ? 1u : 0u) << l;
    const T* sn = src + n * g.src_img + c0;

    float acc[TH][P][kVc];
#pragma unroll
    for (int j = 0; j < TH; ++j)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < kVc; ++i) acc[j][p][i] = 0.f;

    // Source row m's contribution: every (destination row, window row) pair it feeds. kJ (a constant where inlined):
    // the destination rows it is known to feed (bit j), or 0 to test each. (A generic lambda crashed cudafe++.)
    const auto accumulate = [&](int m, const float (&sv)[L][kVc], int kJ) {
#pragma unroll
      for (int j = 0; j < TH; ++j) {
        if (kJ != 0 && !(kJ >> j & 1)) continue;
        // the window row that connects source row m to destination row j
        const int r = MODE == Mode::kFwd ? m - j * g.sh : j + 2 * hh - 2 * m;
        if (kJ == 0 && (r < 0 || r >= g.kh)) continue;
        const float4* wr = wsm + v * tstride + r * KW;
#pragma unroll
        for (int s = 0; s < KW; ++s) {
          const float4 f4 = wr[s];
          const float f[kVc] = {f4.x, f4.y, f4.z, f4.w};
#pragma unroll
          for (int p = 0; p < P; ++p) {
            if (MODE == Mode::kUp && (p - s) % 2 != 0) continue;
            const int l = MODE == Mode::kFwd ? p * S + s : (p - s) / 2 + HW;
#pragma unroll
            for (int i = 0; i < kVc; ++i) acc[j][p][i] = fmaf(f[i], sv[l][i], acc[j][p][i]);
          }
        }
      }
    };
    // Interior items (every source row and column inside the image, most of them) of the unit-stride 7-wide
    // and one-row forwards: no per-column predicates or zero fills, and the source rows in runs that feed the same
    // destination rows, so no branch splits a row's work (measured 4-8 % faster on ConvNeXt 7x7 bf16 and Mamba k=4
    // f32). Not for the 3x3 kernels: there the second loop made ptxas interleave the predicated
    // loop's loads with the unpacking and MobileNetV2 lost more than it gained. The choice is warp-uniform: a warp
    // holds one or two items, and one taking each path would run both (per lane, MobileNetV2 was 30 % slower).
    constexpr bool kInterior = MODE == Mode::kFwd && S == 1 && (KW == 7 || TH == 1);
    const bool inside = cmask == (1u << L) - 1 && qr0 >= 0 && qr0 + rows <= g.src_rows;
    if (kInterior && __all_sync(__activemask(), inside)) {
      const T* rp = sn + qr0 * row_elems + qc0 * g.c;
      const auto run = [&](int m0, int m1, int jset) {
        const T* q = rp + m0 * row_elems;
#pragma unroll 1
        for (int m = m0; m < m1; ++m, q += row_elems) {
          // The row's L loads first, as raw words, then their unpacking: loaded and unpacked column by column,
          // ptxas interleaved the loads with the FMAs and the round trips ran one after another.
          using Raw = std::conditional_t<sizeof(T) * kVc == 16, uint4, uint2>;
          Raw raw[L];
#pragma unroll
          for (int l = 0; l < L; ++l) raw[l] = __ldg(reinterpret_cast<const Raw*>(q + l * g.c));
          float sv[L][kVc];
          UnpackVectors<T>(raw, sv);
          accumulate(m, sv, jset);
        }
      };
      if (TH == 1) {
        run(0, rows, 1);
      } else {  // row m feeds destination row 0 while m < kh, row 1 from m >= sh (rows = sh + kh)
        run(0, min(g.sh, g.kh), 1);
        run(g.sh, g.kh, 3);
        run(max(g.sh, g.kh), rows, 2);
      }
    } else {
#pragma unroll 1
      for (int m = 0; m < rows; ++m) {
        const int qr = qr0 + m;
        if (qr < 0 || qr >= g.src_rows) continue;  // zero padding
        const T* rp = sn + qr * row_elems + qc0 * g.c;
        float sv[L][kVc];
        LdColumns<T, L>(rp, g.c, cmask, sv);
        accumulate(m, sv, 0);
      }
    }

    // The activation as a template argument: a runtime switch per element costs more than the stencil's loads.
    const int64_t dn = n * g.dst_img + c0;
    const auto epilogue = [&](auto act_c) {
      constexpr int kAct = decltype(act_c)::value;
      if (g.out_f32) StoreTile<float, TH, P, kAct>(static_cast<float*>(dst) + dn, acc, b, y0, x0, g);
      else StoreTile<T, TH, P, kAct>(static_cast<T*>(dst) + dn, acc, b, y0, x0, g);
    };
    WithActivation(g.act, epilogue);
  }
}

// Filter gradient, same thread shape: dw[r, s, c] = sum over (n, y, x) of x[n, y SH - ph + r, x S - pw + s, c] *
// dy[n, y, x, c]. Block = (split, channel tile, group of RH window rows); thread = (4 channels, slot); a slot walks
// the items (n, y, P-column strip) of its split ns apart, loads the strip's P dy vectors once and, per window row
// of its group, the L source columns, and accumulates all RH x KW taps in registers. Then a fixed-order sum over
// the slots in shared memory, and per split either dw or a float32 partial for ReduceSplits (deterministic).
// Outputs past the last column are not paired with anything (an inf in x must reach only the taps that see it).
template <class T, int KW, int S, int P, int RH>
__global__ void __launch_bounds__(kThreads) DwRowWgradKernel(const DwRowArgs g, int64_t per_split, int splits,
                                                             const T* __restrict__ x, const T* __restrict__ dy,
                                                             void* __restrict__ dw, float* __restrict__ scratch) {
  constexpr int L = (P - 1) * S + KW;
  constexpr int NA = RH * KW * kVc;  // accumulators per thread
  static_assert(L <= 32, "column mask");
  extern __shared__ float red[];  // [ns][vb * NA]
  const int split = blockIdx.x;
  const int ctiles = CeilDivDev(g.vecs, g.vb);
  const int ctile = static_cast<int>(blockIdx.y) % ctiles, r0 = static_cast<int>(blockIdx.y) / ctiles * RH;
  const int vt0 = ctile * g.vb;
  const int nv = min(g.vb, g.vecs - vt0);
  const int v = threadIdx.x % g.vb, slot = threadIdx.x / g.vb;
  const int c0 = (vt0 + v) * kVc;
  float acc[RH][KW][kVc];
#pragma unroll
  for (int rr = 0; rr < RH; ++rr)
#pragma unroll
    for (int s = 0; s < KW; ++s)
#pragma unroll
      for (int i = 0; i < kVc; ++i) acc[rr][s][i] = 0.f;
  const int64_t ibeg = split * per_split, iend = min(g.items, ibeg + per_split);
  if (v < nv && slot < g.ns) {
    const int row_elems = g.src_cols * g.c;
    for (int64_t it = ibeg + slot; it < iend; it += g.ns) {
      const unsigned item = static_cast<unsigned>(it);  // items < 2^31 (checked on the host)
      const unsigned q = item / static_cast<unsigned>(g.strips);
      const int strip = static_cast<int>(item - q * static_cast<unsigned>(g.strips));
      const unsigned n = q / static_cast<unsigned>(g.dst_rows);
      const int yd = static_cast<int>(q - n * static_cast<unsigned>(g.dst_rows));
      const int x0 = strip * P, qc0 = x0 * S + g.qcol0;
      unsigned cmask = 0, pmask = 0;
#pragma unroll
      for (int l = 0; l < L; ++l) cmask |= (qc0 + l >= 0 && qc0 + l < g.src_cols ? 1u : 0u) << l;
#pragma unroll
      for (int p = 0; p < P; ++p) pmask |= (x0 + p < g.dst_cols ? 1u : 0u) << p;
      float dv[P][kVc];
      const T* dp = dy + n * g.dst_img + (static_cast<int64_t>(yd) * g.dst_cols + x0) * g.c + c0;
#pragma unroll
      for (int p = 0; p < P; ++p, dp += g.c) {
        if (pmask & (1u << p)) {
          LdGlobalAcc<T, float, kVc>(dp, dv[p]);
        } else {
#pragma unroll
          for (int i = 0; i < kVc; ++i) dv[p][i] = 0.f;
        }
      }
      const T* sn = x + n * g.src_img + c0;
#pragma unroll
      for (int rr = 0; rr < RH; ++rr) {
        const int r = r0 + rr;
        const int qr = yd * g.sh + g.qrow0 + r;
        if (r >= g.kh || qr < 0 || qr >= g.src_rows) continue;  // padding rows add nothing
        const T* rp = sn + qr * row_elems + qc0 * g.c;
        float sv[L][kVc];
        LdColumns<T, L>(rp, g.c, cmask, sv);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if (!(pmask & (1u << p))) continue;
#pragma unroll
          for (int s = 0; s < KW; ++s)
#pragma unroll
            for (int i = 0; i < kVc; ++i) acc[rr][s][i] = fmaf(sv[p * S + s][i], dv[p][i], acc[rr][s][i]);
        }
      }
    }
  }
  // Fixed-order sum over the slots.
  float* mine = red + (static_cast<int64_t>(slot) * g.vb + v) * NA;
#pragma unroll
  for (int rr = 0; rr < RH; ++rr)
#pragma unroll
    for (int s = 0; s < KW; ++s)
#pragma unroll
      for (int i = 0; i < kVc; ++i) mine[(rr * KW + s) * kVc + i] = acc[rr][s][i];
  __syncthreads();
  const int per_slot = g.vb * NA;
  for (int idx = threadIdx.x; idx < per_slot; idx += blockDim.x) {
    const int vv = idx / NA, e = idx - vv * NA;
    const int rr = e / (KW * kVc), s = e / kVc % KW, i = e % kVc;
    if (vv >= nv || r0 + rr >= g.kh) continue;
    float sum = 0.f;
    for (int k = 0; k < g.ns; ++k) sum += red[k * per_slot + idx];
    const int64_t off = static_cast<int64_t>((r0 + rr) * KW + s) * g.c + (vt0 + vv) * kVc + i;
    if (splits > 1) scratch[split * static_cast<int64_t>(g.kh) * KW * g.c + off] = sum;
    else if (g.out_f32) static_cast<float*>(dw)[off] = sum;
    else static_cast<T*>(dw)[off] = FromAcc<T>(sum);
  }
}

// The problem as the kernel sees it: source -> destination rows and columns, after folding D into the batch.
// The shared 2-D view; in kUp (the strided data gradient) ph / pw are the forward's pad_lo.
struct RowProblem : DwPlane {
  Mode mode = Mode::kFwd;
};

// (TH, P): one-row problems (kh == 1) take 8 columns per thread; 2-D ones 2 rows x 4 columns.
constexpr bool kOneRow = true;
inline int RowsPerThread(bool one_row) { return one_row ? 1 : 2; }
inline int ColsPerThread(bool one_row) { return one_row ? 8 : 4; }

// Vectors per block: at most 64, the filter slice within kMaxFilterFloats, the channel tiles balanced.
inline int64_t VectorsPerBlock(int64_t vecs, int64_t taps) {
  const int64_t cap = std::min<int64_t>(64, kMaxFilterFloats / (TapStride(taps) * kVc));
  if (cap < 1) return 0;
  return CeilDiv(vecs, CeilDiv(vecs, cap));
}

// Whether an instantiated kernel takes (mode, kw, stride, one-row): see Launch.
inline bool HasKernel(const RowProblem& rp, bool one_row) {
  if (rp.mode == Mode::kUp) return !one_row && (rp.kw == 3 || rp.kw == 5);
  if (one_row) return rp.sw == 1 && (rp.kw == 3 || rp.kw == 4);
  return (rp.sw == 1 || rp.sw == 2) && (rp.kw == 3 || rp.kw == 5 || rp.kw == 7);
}

inline bool OneRow(const RowProblem& rp) { return rp.kh == 1 && rp.mode == Mode::kFwd && HasKernel(rp, kOneRow); }

DwRowArgs MakeArgs(const ConvParams& p, const RowProblem& rp) {
  const bool one_row = OneRow(rp);
  const int th = RowsPerThread(one_row), pc = ColsPerThread(one_row);
  const int64_t c = p.c[0];
  DwRowArgs a{};
  a.src_rows = static_cast<int>(rp.src_rows);
  a.src_cols = static_cast<int>(rp.src_cols);
  a.dst_rows = static_cast<int>(rp.dst_rows);
  a.dst_cols = static_cast<int>(rp.dst_cols);
  a.src_img = rp.src_rows * rp.src_cols * c;
  a.dst_img = rp.dst_rows * rp.dst_cols * c;
  a.c = static_cast<int>(c);
  a.vecs = static_cast<int>(c / kVc);
  a.vb = static_cast<int>(VectorsPerBlock(a.vecs, rp.kh * rp.kw));
  a.ns = a.vb > 0 ? kThreads / a.vb : 0;
  a.kh = static_cast<int>(rp.kh);
  a.sh = static_cast<int>(rp.sh);
  if (rp.mode == Mode::kFwd) {
    a.col0 = 0;
    a.qcol0 = static_cast<int>(-rp.pw);
    a.row0 = 0;
    a.qrow0 = static_cast<int>(-rp.ph);
    a.strips = static_cast<int>(CeilDiv(rp.dst_cols, pc));
    a.row_groups = static_cast<int>(CeilDiv(rp.dst_rows, th));
  } else {
    // Padded coordinates t = j + pw; strips start at even t (from pw rounded down), so e and t share parity.
    const int64_t tc = rp.pw & ~int64_t(1), tr = rp.ph & ~int64_t(1);
    a.col0 = static_cast<int>(tc - rp.pw);
    a.qcol0 = static_cast<int>(tc / 2 - (rp.kw - 1) / 2);
    a.row0 = static_cast<int>(tr - rp.ph);
    a.qrow0 = static_cast<int>(tr / 2 - (rp.kh - 1) / 2);
    a.strips = static_cast<int>(CeilDiv(rp.dst_cols - a.col0, pc));
    a.row_groups = static_cast<int>(CeilDiv(rp.dst_rows - a.row0, th));
  }
  a.items = rp.n * a.row_groups * a.strips;
  a.flip = rp.flip;
  a.act = static_cast<int>(p.activation[0]);
  a.has_bias = static_cast<int>(p.has_bias[0]);
  return a;
}

// The filter gradient's items are single destination rows (TH = 1) and its block needs no filter slice.
// Window rows per filter-gradient block (RH): 3 for 2-D windows 3 wide (all 9 taps of a 3x3 in registers), else 1.
inline int WgradRows(const RowProblem& rp) { return rp.kw == 3 && !OneRow(rp) ? 3 : 1; }
// Channel vectors per block. 3x3 (RH = 3, one block row for the whole window): at most 4 (64 slots of 4 channels),
// so that there are enough blocks without many splits, whose fixed-order sum (ReduceSplits, one thread per filter
// element) is latency-bound: with one block for all of MobileNetV2's 144 channels, its 528 splits took ten times as
// long to add as with 4 vectors. Wider windows and 1-D (one block row per window row, and long rows or many
// channels): wide blocks, fewer passes over dy (measured 1.2-1.8x faster than 4 vectors on ConvNeXt 7x7 and Mamba
// k = 4).
DwRowArgs MakeWgradArgs(const ConvParams& p, const RowProblem& rp) {
  DwRowArgs a = MakeArgs(p, rp);
  a.vb = static_cast<int>(WgradRows(rp) == 3 ? CeilDiv(a.vecs, CeilDiv(a.vecs, 4)) : VectorsPerBlock(a.vecs, 1));
  a.ns = kThreads / a.vb;
  a.row_groups = a.dst_rows;
  a.strips = static_cast<int>(CeilDiv(rp.dst_cols, ColsPerThread(OneRow(rp))));
  a.items = rp.n * a.row_groups * a.strips;
  a.act = kActNone;
  a.has_bias = 0;
  return a;
}

// Splits of the filter gradient (a function of the problem: they fix the workspace): at most two blocks per SM for
// the 3x3 blocks, four (two waves) for the wide ones (the settings measured best), each slot with at
// least 4 items, partials within 512 MiB.
int64_t WgradSplits(const ConvParams& p, const RowProblem& rp) {
  const DwRowArgs a = MakeWgradArgs(p, rp);
  const int64_t base = CeilDiv(a.vecs, a.vb) * CeilDiv(a.kh, WgradRows(rp));
  // Rounded down: every variant takes 88-128 registers, so two blocks fit on an SM, and rounding up had put a few
  // blocks into a wave of their own (MobileNetV2 56^2 x 144: 270 blocks for 264 places; rounding down made its bf16
  // kernel and ConvNeXt 7x7 float32 markedly faster).
  int64_t splits = std::max<int64_t>(1, (WgradRows(rp) == 3 ? 2 : 4) * kPlanSms / base);
  splits = std::min<int64_t>(splits, a.items / (4 * a.ns));
  splits = std::min<int64_t>(splits, 1024);
  splits = std::min<int64_t>(splits, (int64_t(1) << 27) / std::max<int64_t>(1, WElements(p)));
  return splits < 2 ? 1 : splits;
}

// The row problem of op when the kernels take it, else false.
bool MakeRowProblem(const ConvParams& p, Op op, RowProblem* rp) {
  RowProblem r;
  if (!DwPlaneOf(p, op, &r) || r.c % kVc != 0) return false;
  if (op == Op::kDgrad && !r.flip) {  // strided: the upsampling kernel, stride 2 along W (and H, unless 1-D)
    if (!(r.sw == 2 && (r.sh == 2 || (r.kh == 1 && p.in[1] == 1 && p.pad_lo[1] == 0)))) return false;
    r.mode = Mode::kUp;
    r.sh = r.sw = 2;
  }
  if (!HasKernel(r, OneRow(r))) return false;
  if (VectorsPerBlock(r.c / kVc, r.kh * r.kw) < 1) return false;
  // 32-bit offsets within an image row block; grid limits.
  if (r.src_rows * r.src_cols * r.c > INT32_MAX || r.dst_rows * r.dst_cols * r.c > INT32_MAX) return false;
  const DwRowArgs a = op == Op::kWgrad ? MakeWgradArgs(p, r) : MakeArgs(p, r);
  const int64_t grid_y = CeilDiv(a.vecs, a.vb) * (op == Op::kWgrad ? CeilDiv(a.kh, WgradRows(r)) : 1);
  if (a.items > INT32_MAX - kThreads * 65536LL || grid_y > 65535) return false;
  *rp = r;
  return true;
}

template <class T>
cudaError_t Launch(const ConvParams& p, const RowProblem& rp, bool out_f32, const void* src, const void* w,
                   const void* bias, void* dst, cudaStream_t s) {
  DwRowArgs a = MakeArgs(p, rp);
  a.out_f32 = out_f32;
  if (a.items == 0) return cudaSuccess;
  const int64_t blocks = CeilDiv(a.items, a.ns);
  const unsigned ctiles = static_cast<unsigned>(CeilDiv(a.vecs, a.vb));
  const size_t smem = static_cast<size_t>(TapStride(a.kh * rp.kw)) * a.vb * sizeof(float4);
  const unsigned threads = static_cast<unsigned>(a.vb * a.ns);
  auto go = [&](auto kwc, auto sc, auto thc, auto pc, auto modec) {
    constexpr int KW = decltype(kwc)::value, S = decltype(sc)::value, TH = decltype(thc)::value;
    constexpr int P = decltype(pc)::value;
    constexpr Mode M = static_cast<Mode>(decltype(modec)::value);
    auto launch = [&](auto kern) {
      // Persistent: at most the blocks that fit at once, over all channel tiles (measured 5-15 % faster than one
      // block per group of items).
      int64_t resident = 0;
      if (const cudaError_t e = ResidentBlocks(kern, threads, smem, ctiles, &resident); e != cudaSuccess) return e;
      const int64_t grid = std::min<int64_t>(blocks, resident);
      kern<<<dim3(static_cast<unsigned>(grid), ctiles), threads, smem, s>>>(a, static_cast<const T*>(src),
                                                                          static_cast<const T*>(w), bias, dst);
      return cudaGetLastError();
    };
    return launch(DwRowKernel<T, KW, S, TH, P, M>);
  };
  constexpr IntC<static_cast<int>(Mode::kFwd)> fwd{};
  constexpr IntC<static_cast<int>(Mode::kUp)> up{};
  if (rp.mode == Mode::kUp) {
    return rp.kw == 3 ? go(IntC<3>{}, IntC<2>{}, IntC<2>{}, IntC<4>{}, up)
                      : go(IntC<5>{}, IntC<2>{}, IntC<2>{}, IntC<4>{}, up);
  }
  if (OneRow(rp)) {
    return rp.kw == 3 ? go(IntC<3>{}, IntC<1>{}, IntC<1>{}, IntC<8>{}, fwd)
                      : go(IntC<4>{}, IntC<1>{}, IntC<1>{}, IntC<8>{}, fwd);
  }
  auto with_s = [&](auto kwc) {
    return rp.sw == 1 ? go(kwc, IntC<1>{}, IntC<2>{}, IntC<4>{}, fwd) : go(kwc, IntC<2>{}, IntC<2>{}, IntC<4>{}, fwd);
  };
  if (rp.kw == 3) return with_s(IntC<3>{});
  if (rp.kw == 5) return with_s(IntC<5>{});
  return with_s(IntC<7>{});
}

template <class T>
cudaError_t LaunchWgrad(const ConvParams& p, const RowProblem& rp, bool out_f32, const void* x, const void* dy,
                        void* dw, void* scratch, int64_t splits, cudaStream_t s) {
  DwRowArgs a = MakeWgradArgs(p, rp);
  a.out_f32 = out_f32;
  const int rh = WgradRows(rp);
  const int64_t per_split = CeilDiv(a.items, splits);
  const dim3 grid(static_cast<unsigned>(splits),
                  static_cast<unsigned>(CeilDiv(a.vecs, a.vb) * CeilDiv(a.kh, rh)));
  const unsigned threads = static_cast<unsigned>(a.vb * a.ns);
  auto go = [&](auto kwc, auto sc, auto pc, auto rhc) {
    constexpr int KW = decltype(kwc)::value, S = decltype(sc)::value, P = decltype(pc)::value;
    constexpr int RH = decltype(rhc)::value;
    const size_t smem = static_cast<size_t>(threads) * RH * KW * kVc * sizeof(float);
    DwRowWgradKernel<T, KW, S, P, RH><<<grid, threads, smem, s>>>(a, per_split, static_cast<int>(splits),
                                                                  static_cast<const T*>(x), static_cast<const T*>(dy),
                                                                  dw, static_cast<float*>(scratch));
    return cudaGetLastError();
  };
  if (OneRow(rp)) {
    return rp.kw == 3 ? go(IntC<3>{}, IntC<1>{}, IntC<8>{}, IntC<1>{}) : go(IntC<4>{}, IntC<1>{}, IntC<8>{}, IntC<1>{});
  }
  auto with_s = [&](auto kwc, auto rhc) {
    return rp.sw == 1 ? go(kwc, IntC<1>{}, IntC<4>{}, rhc) : go(kwc, IntC<2>{}, IntC<4>{}, rhc);
  };
  if (rp.kw == 3) return with_s(IntC<3>{}, IntC<3>{});
  if (rp.kw == 5) return with_s(IntC<5>{}, IntC<1>{});
  return with_s(IntC<7>{}, IntC<1>{});
}

// The row problem of pr, or why the kernels do not take it.
std::string RowError(const Problem& pr, RowProblem* rp) {
  if (!DepthwiseApplies(pr.p)) return "it takes depthwise convolutions (groups == c == k, batch_groups == 1)";
  if (!IsF32AccPair(pr.in, pr.out)) return "it takes float32, bfloat16 or float16 operands";
  if (!MakeRowProblem(pr.p, pr.op, rp)) {
    return "it takes channels-last 1-D or 2-D problems, c a multiple of 4, no dilation and its window widths and "
           "strides";
  }
  return {};
}

template <class F>
cudaError_t WithInputType(DType in, F&& f) {
  if (in == DType::kF32) return f(float{});
  if (in == DType::kBF16) return f(__nv_bfloat16{});
  return f(__half{});
}

}  // namespace
}  // namespace cuda

namespace variants::depthwise_reg {

std::string Applies(const Problem& pr) {
  cuda::RowProblem rp;
  return cuda::RowError(pr, &rp);
}

size_t Workspace(const Problem& pr) {
  cuda::RowProblem rp;
  if (pr.op != Op::kWgrad || !cuda::RowError(pr, &rp).empty()) return 0;
  const int64_t splits = cuda::WgradSplits(pr.p, rp);
  return splits > 1 ? static_cast<size_t>(splits) * WElements(pr.p) * sizeof(float) : 0;
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  cuda::RowProblem rp;
  if (!cuda::RowError(pr, &rp).empty()) return cudaErrorNotSupported;
  const bool out_f32 = pr.out == DType::kF32;
  if (pr.op == Op::kWgrad) {
    if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
    const int64_t splits = cuda::WgradSplits(pr.p, rp);
    if (splits > 1 && (b.ws == nullptr || b.ws_bytes < Workspace(pr))) return cudaErrorInvalidValue;
    const cudaError_t e = cuda::WithInputType(pr.in, [&](auto t) {
      return cuda::LaunchWgrad<decltype(t)>(pr.p, rp, out_f32, b.a, b.b, b.out, b.ws, splits, s);
    });
    if (e != cudaSuccess || splits == 1) return e;
    return cuda::ReduceSplits(pr.in, pr.out, b.ws, splits, WElements(pr.p), b.out, s);
  }
  // The data gradient has no epilogue.
  ConvParams p = pr.p;
  if (pr.op == Op::kDgrad) {
    p.activation[0] = kActNone;
    p.has_bias[0] = 0;
  }
  const void* bias = pr.op == Op::kFwd && p.has_bias[0] ? b.bias : nullptr;
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b) || !cuda::Aligned16(b.out) ||
      (bias != nullptr && !cuda::Aligned16(bias))) {
    return cudaErrorMisalignedAddress;
  }
  return cuda::WithInputType(pr.in, [&](auto t) {
    return cuda::Launch<decltype(t)>(p, rp, out_f32, b.a, b.b, bias, b.out, s);
  });
}

}  // namespace variants::depthwise_reg
}  // namespace jaxconv
