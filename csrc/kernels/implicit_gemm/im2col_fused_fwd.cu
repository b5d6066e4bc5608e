// implicit_gemm.im2col_fused_fwd: the forward of first layers (im2col.cuh) in one fused kernel, the unrolled window
// never in memory.
// y[m, k] = act(sum_j cols[m, j] * w'[j, k] + bias[k]). Why: the chunked route wrote and re-read cols (49x the size
// of x for a 7x7 stem) and ran ResNet's stem no faster than lax in bf16 and at about 0.7x in TF32. A block keeps its
// kFfK-channel slice of w' (all rows, zero-padded to jp) in shared memory for the whole launch and loops over pixel
// tiles (qt <= kFfPix pixels of one output row): it stores the tile's patch (loaded into registers during the
// previous tile's MMAs: a tile's own loads, issued after its barrier, left the warps waiting on them), unrolls its
// cols into shared memory (16-bit; see the kernel for f32), runs mma.sync with f32 accumulators and applies the
// epilogue from the registers. Operands: bf16/f16 (m16n8k16); f32 as TF32 (m16n8k8), rounded once when staged; f32 as
// 3xTF32 (each value split into big and small TF32 parts, three products; FfMath).
#include <algorithm>
#include <string>
#include <type_traits>

#include "dispatch/variant.h"
#include "kernels/implicit_gemm/im2col.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kFfPix = 64;        // pixels per tile (MMA M): 2 rows of warps, 32 pixels each
constexpr int kFfK = 64;          // output channels per block (MMA N): WN columns of warps, 64 / WN channels each
constexpr int kFfPreElems = 3072; // patch elements per block prefetched in registers (a 7x7 stem's tile: 2457)
constexpr int kFfWBatch = 10;     // 16-byte filter vectors per thread in flight (a 7x7 bf16 stem's slice: 10)
constexpr size_t kFfMaxPatch = size_t(48) << 10;
__host__ __device__ constexpr int FfKStep(int elem) { return elem == 2 ? 16 : 8; }
__host__ __device__ constexpr int FfRowsPadded(int rows, int elem) {
  return (rows + FfKStep(elem) - 1) / FfKStep(elem) * FfKStep(elem);
}
// Row strides of cols and of the filter slice: odd multiples of 16 bytes, so the 8 rows one ldmatrix reads fall
// in distinct banks. 16-bit: the slice is j-major, [jp][kFfK + 8] (B read transposed); f32: k-major, [kFfK][jp + 4]
// (ldmatrix moves 32-bit elements only untransposed).
__host__ __device__ constexpr int FfColsLd(int jp, int elem) { return jp + (elem == 2 ? 8 : 4); }
__host__ __device__ constexpr int FfSliceElems(int jp, int elem) {
  return elem == 2 ? jp * (kFfK + 8) : kFfK * (jp + 4);
}
// 3xTF32 split when staged (kFfSplitStaged) keeps the slice's big parts, then its small parts; the patch's big parts
// in the first patch buffer, its small parts in the second (the others double-buffer the patch instead).
__host__ __device__ constexpr int FfSlices(bool staged) { return staged ? 2 : 1; }
// A patch buffer: the patch, then zeros that the columns past rows read (table[j] = patch_elems) for every pixel row.
__host__ __device__ constexpr int64_t FfPatchElems(int64_t patch_elems, int64_t sc) {
  return patch_elems + (kFfPix - 1) * sc + 1;
}

// T: __nv_bfloat16, __half or float (y in T). w: the HWIO filter as a (rows, k_total) matrix; bias: k_total elements
// or null; tiles: row_count output rows of segs = ceil(out[2] / qt) tiles each; blockIdx.y: the k block.
// f32 operands skip cols: the MMAs load their A fragments from the patch itself (the unroll had been half the
// kernel's instructions, and cols' shared memory halved its occupancy), so the patch is double
// buffered (3xTF32 split when staged: one buffer for its big parts, one for its small parts, and a barrier per tile).
// Either way columns past rows read a zero tail behind the patch (FfPatchElems) and rows past qn are never stored.
// WN: columns of warps (2: 128 threads, 32 channels per warp; 4: 256 threads, 16 channels per warp, for grids of
// one wave). Registers: kFfSplitStaged at 128 threads may take up to 255 (its shared memory allows two blocks per SM
// anyway), everything else stays within 128 (four blocks of 128 threads or two of 256 per SM).
template <class T, int kMath, int WN>
__global__ void __launch_bounds__(64 * WN, kMath == kFfSplitStaged && WN == 2 ? 2 : 8 / WN)
    FusedFwdKernel(const Geometry g, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                   int k_total, int row_count, int act, T* __restrict__ y) {
  constexpr int kE = sizeof(T), kThreads = 64 * WN, kWc = kFfK / WN, kNi = kWc / 8;  // kNi n8 tiles per warp
  constexpr int kFfPre = kFfPreElems / kThreads;
  constexpr bool kSplit = kMath != kFfTf32, kStaged = kMath == kFfSplitStaged;
  constexpr bool kTf32 = std::is_same_v<T, float> && !kSplit;  // operands rounded to TF32 once, when staged
  static_assert(!kSplit || kE == 4, "3xTF32 splits float32 operands");
  constexpr int kPatchBufs = kE == 4 ? 2 : 1;  // f32: a double buffer, or kStaged's big and small parts
  extern __shared__ int4 smem4[];
  const int jp = FfRowsPadded(g.rows, kE), cld = FfColsLd(jp, kE), rows_tr = g.win0 * g.win1;
  const int rt4 = (rows_tr + 3) / 4 * 4, patch_elems = rows_tr * g.wt * g.c, sc = g.stride[2] * g.c;
  const int pbuf = static_cast<int>(FfPatchElems(patch_elems, sc));  // < 2^31: MakeFusedFwdPlan's bound
  const int slice_elems = FfSliceElems(jp, kE);
  T* ws = reinterpret_cast<T*>(smem4);                   // the filter slice w'[j, k0 + n] (FfSlices of it), zero-padded
  T* colss = ws + FfSlices(kStaged) * slice_elems;       // 16-bit: [kFfPix][cld], the tile's cols
  int* table = reinterpret_cast<int*>(colss + (kE == 2 ? kFfPix * cld : 0));  // [jp]: column j's patch offset
  int* rowtabs = table + jp;                             // [2][rt4]: the row tables of this tile and the next
  T* patches = reinterpret_cast<T*>(rowtabs + 2 * rt4);  // [kPatchBufs][pbuf]
  const int tid = threadIdx.x, lane = tid & 31, wm = (tid >> 5) & 1, wn = tid >> 6;
  const int k0 = blockIdx.y * kFfK;
  // Stores operand value v at p[i] as the MMAs read it: TF32-rounded (kTf32), split with its small part `small`
  // elements on (kStaged), else as it is.
  const auto stage = [](T* p, int i, int small, T v) {
    if constexpr (kStaged) {
      const float2 bs = SplitTf32(v);
      p[i] = bs.x;
      p[small + i] = bs.y;
    } else if constexpr (kTf32) {
      p[i] = __uint_as_float(Tf32Bits(v));
    } else {
      p[i] = v;
    }
  };
  // The first tile's patch loads go out before the filter slice's, so the two round trips overlap.
  const int segs = (g.out[2] + g.qt - 1) / g.qt, tiles = row_count * segs;
  const auto origin = [&](int b, int* rowtab) {
    const int row = b / segs;
    return FillRowTable<kThreads>(g, row, (b - row * segs) * g.qt, rowtab);
  };
  T pre[kFfPre];
  int b = blockIdx.x, parity = 0;
  TileOrigin cur{};
  if (b < tiles) {
    cur = origin(b, rowtabs);
    __syncthreads();
    LoadPatchElems<kFfPre, kThreads>(g, x, cur, rowtabs, tid, pre);
  }
  // The slice as 16-byte vectors of kVw channels (k_total % kVw == 0 and w 16-byte aligned: Launch), kFfWBatch
  // loads in flight per thread: element by element, one round trip each, it was half the stem's time at batch 1
  // (ncu). Vector slot i is row j, channels n..n+kVw-1. 16-bit copies rows as they are; f32
  // transposes them into k-major rows with scalar stores, so a warp takes 16 rows x 2 vectors (32-byte runs of
  // each row) and its lanes' stores fall in distinct banks (a warp along one row had them 8-way conflicted: 84 % of
  // the shared-store wavefronts on the batch-1 stem, ncu).
  constexpr int kVw = 16 / kE, kRowVecs = kFfK / kVw;
  const auto slot = [](int i, int& j, int& n) {
    if constexpr (kE == 2) {
      j = i / kRowVecs;
      n = (i - j * kRowVecs) * kVw;
    } else {
      const int grp = i >> 5, jb = grp / (kRowVecs / 2), vp = grp - jb * (kRowVecs / 2);
      j = jb * 16 + (i & 15);
      n = (vp * 2 + ((i >> 4) & 1)) * kVw;
    }
  };
  const int slots = (kE == 2 ? jp : (jp + 15) / 16 * 16) * kRowVecs;  // rows j >= jp are skipped
  for (int i0 = tid; i0 < slots; i0 += kFfWBatch * kThreads) {
    int4 v[kFfWBatch];
#pragma unroll
    for (int u = 0; u < kFfWBatch; ++u) {
      int j, n;
      slot(i0 + u * kThreads, j, n);
      v[u] = make_int4(0, 0, 0, 0);
      if (j < g.rows && k0 + n < k_total) {
        v[u] = __ldg(reinterpret_cast<const int4*>(w + static_cast<int64_t>(j) * k_total + k0 + n));
      }
    }
#pragma unroll
    for (int u = 0; u < kFfWBatch; ++u) {
      int j, n;
      slot(i0 + u * kThreads, j, n);
      if (j >= jp) continue;
      if constexpr (kE == 2) {
        *reinterpret_cast<int4*>(ws + j * (kFfK + 8) + n) = v[u];  // rows of 144 bytes: 16-byte aligned
      } else {
        const float* e = reinterpret_cast<const float*>(&v[u]);
#pragma unroll
        for (int q = 0; q < kVw; ++q) stage(ws, (n + q) * (jp + 4) + j, slice_elems, e[q]);
      }
    }
  }
  for (int j = tid; j < jp; j += kThreads) table[j] = j < g.rows ? PatchOffset(g, j) : patch_elems;
  for (int i = patch_elems + tid; i < pbuf; i += kThreads) {
#pragma unroll
    for (int u = 0; u < kPatchBufs; ++u) patches[u * pbuf + i] = T{};
  }
  // This thread's output channels and their bias, the same on every tile.
  float bias_v[kNi][2];
#pragma unroll
  for (int ni = 0; ni < kNi; ++ni) {
    const int n = k0 + wn * kWc + ni * 8 + (lane & 3) * 2;  // k_total is even: n < k_total implies n + 1 < it
    bias_v[ni][0] = bias != nullptr && n < k_total ? ToAcc(bias[n]) : 0.f;
    bias_v[ni][1] = bias != nullptr && n < k_total ? ToAcc(bias[n + 1]) : 0.f;
  }
  for (; b < tiles; b += gridDim.x, parity ^= 1) {
    const int row = b / segs, q0 = (b - row * segs) * g.qt, qn = min(g.qt, g.out[2] - q0);
    const int* rowtab = rowtabs + parity * rt4;
    int* next_rowtab = rowtabs + (parity ^ 1) * rt4;
    T* patch = patches + (kE == 4 && !kStaged ? parity * pbuf : 0);
    // The next tile's row table: the other buffer, last read for the previous tile (before its first barrier).
    const bool has_next = b + static_cast<int>(gridDim.x) < tiles;
    TileOrigin next{};
    if (has_next) next = origin(b + gridDim.x, next_rowtab);
    // kStaged's one buffer was read by the previous tile's MMAs.
    if constexpr (kStaged) {
      if (b != static_cast<int>(blockIdx.x)) __syncthreads();
    }
    // Else this patch buffer was last read before the previous barrier (16-bit: the previous tile's second one).
    const auto put = [&](int i, T v) { stage(patch, i, pbuf, v); };
#pragma unroll
    for (int u = 0; u < kFfPre; ++u) {
      if (tid + u * kThreads < patch_elems) put(tid + u * kThreads, pre[u]);
    }
    if (patch_elems > kFfPreElems) LoadPatch<kThreads>(g, x, cur, rowtab, put, kFfPreElems);  // the rest
    __syncthreads();  // the patch (on the first tile also ws, table and the zero tails) and the next row table written
    if constexpr (kE == 2) {
      // cols[ml, j] = patch[table[j] + ml * stride * c]; work items of 8 pixels and a column pair (one word),
      // stepped through without divisions.
      const uint16_t* pb = reinterpret_cast<const uint16_t*>(patch);
      uint32_t* cw = reinterpret_cast<uint32_t*>(colss);
      const int pairs = jp / 2, cwl = cld / 2;
      int jq = tid, m0 = 0;
      for (; jq >= pairs; jq -= pairs) m0 += 8;
      for (; m0 < qn;) {
        const uint16_t* s0 = pb + table[2 * jq] + m0 * sc;
        const uint16_t* s1 = pb + table[2 * jq + 1] + m0 * sc;
        uint32_t* dst = cw + m0 * cwl + jq;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (m0 + i < qn) dst[i * cwl] = uint32_t(s0[i * sc]) | (uint32_t(s1[i * sc]) << 16);
        }
        for (jq += kThreads; jq >= pairs; jq -= pairs) m0 += 8;
      }
      __syncthreads();  // cols written; every thread is done with the patch
    }
    if (has_next) LoadPatchElems<kFfPre, kThreads>(g, x, next, next_rowtab, tid, pre);
    cur = next;
    float acc[2][kNi][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;
      }
    }
    if constexpr (kE == 2) {
      // A = cols (pixels x j, row-major): lane l addresses pixel row l % 16 at column 8 * (l / 16). B = the j-major
      // slice, read transposed as the filter gradient's B.
      const uint16_t* cs = reinterpret_cast<const uint16_t*>(colss);
      const uint16_t* wsb = reinterpret_cast<const uint16_t*>(ws);
      for (int kk = 0; kk < jp; kk += 16) {
        uint32_t a[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          LdMatrix<4>(a[mi], cs + (wm * 32 + mi * 16 + (lane & 15)) * cld + kk + ((lane >> 4) << 3));
        }
#pragma unroll
        for (int ni = 0; ni < kNi; ni += 2) {
          uint32_t bq[4];
          const int jr = kk + (lane & 7) + (((lane >> 3) & 1) << 3);
          LdMatrix<4, true>(bq, wsb + jr * (kFfK + 8) + wn * kWc + ni * 8 + ((lane >> 4) << 3));
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            Mma16816<std::is_same_v<T, __nv_bfloat16>>(acc[mi][ni], a[mi], bq[0], bq[1]);
            Mma16816<std::is_same_v<T, __nv_bfloat16>>(acc[mi][ni + 1], a[mi], bq[2], bq[3]);
          }
        }
      }
    } else {
      // m16n8k8 fragments (g = lane / 4, t = lane % 4): A (pixel g | g + 8, j t | t + 4) straight from the patch,
      // pixel rows past qn clamped to the last; B (j t | t + 4, k g) by ldmatrix on 32-bit elements (an 8x8 b16
      // matrix is 8 rows of 4 elements, thread l getting element l % 4 of row l / 4) from the k-major slice, lanes
      // 8-15 at j + 4, lanes 16-31 at the next n tile.
      const float* wsk = reinterpret_cast<const float*>(ws);
      const int gq = lane >> 2, tq = lane & 3;
      int rm[2][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) rm[mi][h] = min(wm * 32 + mi * 16 + gq + h * 8, qn - 1) * sc;
      }
      for (int kk = 0; kk < jp; kk += 8) {
        uint32_t a[2][4], bb[kNi / 2][4], as[2][4], bs[kNi / 2][4];  // as, bs: kSplit's small parts
        const int o0 = table[kk + tq], o1 = table[kk + tq + 4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          const int at[4] = {o0 + rm[mi][0], o0 + rm[mi][1], o1 + rm[mi][0], o1 + rm[mi][1]};
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            a[mi][r] = __float_as_uint(patch[at[r]]);
            if constexpr (kStaged) as[mi][r] = __float_as_uint(patch[pbuf + at[r]]);
          }
        }
#pragma unroll
        for (int nj = 0; nj < kNi / 2; ++nj) {
          const int nr = wn * kWc + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
          const float* at = wsk + nr * (jp + 4) + kk + (((lane >> 3) & 1) << 2);
          LdMatrix<4>(bb[nj], at);
          if constexpr (kStaged) LdMatrix<4>(bs[nj], at + slice_elems);
        }
        if constexpr (kMath == kFfSplitRegs) {
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const float2 v = SplitTf32(__uint_as_float(a[mi][r]));
              a[mi][r] = __float_as_uint(v.x);
              as[mi][r] = __float_as_uint(v.y);
            }
          }
#pragma unroll
          for (int nj = 0; nj < kNi / 2; ++nj) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const float2 v = SplitTf32(__uint_as_float(bb[nj][r]));
              bb[nj][r] = __float_as_uint(v.x);
              bs[nj][r] = __float_as_uint(v.y);
            }
          }
        }
        if constexpr (kSplit) {
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
            for (int ni = 0; ni < kNi; ++ni) {
              MmaTf32(acc[mi][ni], as[mi], bb[ni >> 1][(ni & 1) * 2], bb[ni >> 1][(ni & 1) * 2 + 1]);
              MmaTf32(acc[mi][ni], a[mi], bs[ni >> 1][(ni & 1) * 2], bs[ni >> 1][(ni & 1) * 2 + 1]);
            }
          }
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
          for (int ni = 0; ni < kNi; ++ni) {
            MmaTf32(acc[mi][ni], a[mi], bb[ni >> 1][(ni & 1) * 2], bb[ni >> 1][(ni & 1) * 2 + 1]);
          }
        }
      }
    }
    // Accumulator r of tile (mi, ni): pixel lane / 4 (+ 8 for r >= 2), channel 2 * (lane % 4) (+ 1 for odd r). The
    // activation is a template argument here: a runtime switch per element had been a tenth of the instructions.
    T* yrow = y + (static_cast<int64_t>(row) * g.out[2] + q0) * k_total;
    const auto epilogue = [&](auto act_c) {
      constexpr int kAct = decltype(act_c)::value;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni) {
          const int n = k0 + wn * kWc + ni * 8 + (lane & 3) * 2;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int ml = wm * 32 + mi * 16 + (lane >> 2) + h * 8;
            if (ml >= qn || n >= k_total) continue;
            StorePair(yrow + static_cast<int64_t>(ml) * k_total + n, Activate(acc[mi][ni][2 * h] + bias_v[ni][0], kAct),
                      Activate(acc[mi][ni][2 * h + 1] + bias_v[ni][1], kAct));
          }
        }
      }
    };
    WithActivation(act, epilogue);
  }
}

// The fused forward's launch; tiles == 0 when it does not apply (too many rows, or grid limits).
struct FusedFwdPlan {
  int qt = 0;  // pixels per tile: out[2] in equal segments of at most kFfPix
  int64_t tiles = 0, kblocks = 0;
  size_t smem = 0;
};

// staged: 3xTF32 split when staged (two slices). smem_max: the device's opt-in limit per block.
FusedFwdPlan MakeFusedFwdPlan(const ConvParams& p, DType in, bool staged, size_t smem_max) {
  FusedFwdPlan f;
  const int eb = static_cast<int>(ElemBytes(in));
  const int64_t rows = SpatialCount(p.win) * p.c[0], rows_tr = p.win[0] * p.win[1];
  if (rows > kFfMaxRows) return f;
  const int jp = FfRowsPadded(static_cast<int>(rows), eb);
  // A patch buffer (the patch and its zero tail, FfPatchElems) of at most kFfMaxPatch bytes and shared memory
  // within the device's limit: fewer pixels per tile while either is larger.
  const auto buffer = [&](int64_t qt) {
    return FfPatchElems(rows_tr * PatchWidth(p, qt) * p.c[0], p.stride[2] * p.c[0]);
  };
  // f32: the slice (staged 3xTF32: twice) and two buffers' bytes of patch; 16-bit: the slice, cols and one patch buffer
  // (FusedFwdKernel); then the column and row tables.
  const auto smem = [&](int64_t qt) {
    const int64_t elems = FfSlices(staged) * FfSliceElems(jp, eb) +
                          (eb == 2 ? kFfPix * FfColsLd(jp, eb) + buffer(qt) : 2 * buffer(qt));
    return static_cast<size_t>(elems * eb + (jp + 2 * CeilDiv(rows_tr, 4) * 4) * 4);
  };
  int64_t segs = CeilDiv(p.out[2], kFfPix), qt = CeilDiv(p.out[2], segs);
  while (static_cast<size_t>(buffer(qt) * eb) > kFfMaxPatch || smem(qt) > smem_max) {
    if (qt == 1) return f;
    qt = CeilDiv(p.out[2], ++segs);
  }
  const int64_t tiles = p.n[0] * p.out[0] * p.out[1] * segs, kblocks = CeilDiv(p.k[0], kFfK);
  if (tiles > kMaxIndex || kblocks > 65535) return f;
  f.qt = static_cast<int>(qt);
  f.tiles = tiles;
  f.kblocks = kblocks;
  f.smem = smem(qt);
  return f;
}

// The fused forward's kernels for an operand type and precision: the one-wave launch's (256 threads, kOneWaveMath;
// none for TF32) and the persistent one's (128 threads, kMath). 3xTF32: the one-wave kernel splits in registers, for
// there is no reuse that would repay splitting when staged; larger grids stage the operands split, once per block and
// tile, which loads each A fragment half as often.
template <class T, int kOneWaveMath, int kMath, bool kOneWave>
struct FfKernels {
  using Elem = T;
  static constexpr int kOneWaveM = kOneWaveMath, kM = kMath;
  static constexpr bool kHasOneWave = kOneWave;
};

template <class F>
auto WithFfKernels(const ConvParams& p, DType in, F&& f) {
  switch (in) {
    case DType::kBF16: return f(FfKernels<__nv_bfloat16, kFfTf32, kFfTf32, true>{});
    case DType::kF16: return f(FfKernels<__half, kFfTf32, kFfTf32, true>{});
    default:
      if (MathFor(p, in) == IgemmMath::kTF32) return f(FfKernels<float, kFfTf32, kFfTf32, false>{});
      return f(FfKernels<float, kFfSplitRegs, kFfSplitStaged, true>{});
  }
}

// The launch: a grid of one wave (batch-1 first layers: one tile per block) is latency-bound, so there 8 warps of 16
// channels per tile (WN 4) when every tile gets a block of its own at once; else persistent blocks of 4 warps of 32
// (WN 2), as many as fit the GPU at once per k block, each looping over tiles. wn 0: neither plan applies.
struct FfLaunch {
  int wn = 0;
  FusedFwdPlan plan;
  int64_t blocks = 0;  // per k block
};

template <class K>
FfLaunch ChooseFusedFwd(const Problem& pr) {
  using T = typename K::Elem;
  const size_t smem_max = static_cast<size_t>(pr.dev.smem_optin);
  if constexpr (K::kHasOneWave) {
    const FusedFwdPlan f = MakeFusedFwdPlan(pr.p, pr.in, K::kOneWaveM == kFfSplitStaged, smem_max);
    if (f.tiles > 0) {
      const int64_t resident = ResidentBlocksOn(pr.dev, FusedFwdKernel<T, K::kOneWaveM, 4>, 256, f.smem, f.kblocks);
      if (resident > 0 && f.tiles <= resident) return FfLaunch{4, f, f.tiles};
    }
  }
  const FusedFwdPlan f = MakeFusedFwdPlan(pr.p, pr.in, K::kM == kFfSplitStaged, smem_max);
  if (f.tiles == 0) return FfLaunch{};
  const int64_t resident = ResidentBlocksOn(pr.dev, FusedFwdKernel<T, K::kM, 2>, 128, f.smem, f.kblocks);
  if (resident == 0) return FfLaunch{};
  return FfLaunch{2, f, std::min(f.tiles, resident)};
}

template <class T, int kMath, int WN>
cudaError_t LaunchFusedFwd(const ConvParams& p, Geometry g, const FfLaunch& l, const void* x, const void* w,
                           const void* bias, void* y, cudaStream_t s) {
  const FusedFwdPlan& f = l.plan;
  g.qt = f.qt;
  g.wt = static_cast<int>(PatchWidth(p, f.qt));
  auto* kernel = FusedFwdKernel<T, kMath, WN>;
  constexpr int kThreads = 64 * WN;
  if (const cudaError_t e = AllowDynamicSmem(kernel, f.smem); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(l.blocks), static_cast<unsigned>(f.kblocks));
  const int row_count = static_cast<int>(f.tiles / CeilDiv(g.out[2], g.qt));
  const int k_total = static_cast<int>(p.k[0]), act = static_cast<int>(p.activation[0]);
  kernel<<<grid, kThreads, f.smem, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(w),
                                        static_cast<const T*>(bias), k_total, row_count, act, static_cast<T*>(y));
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

namespace variants::implicit_gemm_im2col_fused_fwd {

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::Im2colError(pr); !why.empty()) return why;
  if (pr.dev.arch < 80) return "the mma.sync kernels need sm_80 or newer";
  const cuda::FfLaunch l =
      cuda::WithFfKernels(pr.p, pr.in, [&](auto k) { return cuda::ChooseFusedFwd<decltype(k)>(pr); });
  if (l.wn == 0) return "its filter slice and patch do not fit shared memory (taps * c <= 160)";
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  if (!cuda::Aligned16(b.b)) return cudaErrorMisalignedAddress;  // the filter as 16-byte vectors of channels
  const cuda::Geometry g = cuda::GeometryOf(pr.p, pr.in);
  return cuda::WithFfKernels(pr.p, pr.in, [&](auto k) {
    using K = decltype(k);
    using T = typename K::Elem;
    const cuda::FfLaunch l = cuda::ChooseFusedFwd<K>(pr);
    if (l.wn == 4) return cuda::LaunchFusedFwd<T, K::kOneWaveM, 4>(pr.p, g, l, b.a, b.b, b.bias, b.out, s);
    if (l.wn == 2) return cuda::LaunchFusedFwd<T, K::kM, 2>(pr.p, g, l, b.a, b.b, b.bias, b.out, s);
    return cudaErrorNotSupported;
  });
}

}  // namespace variants::implicit_gemm_im2col_fused_fwd
}  // namespace jaxconv
