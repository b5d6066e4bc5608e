// The implicit_gemm family's first-layer variants (c * element size < 16 bytes, a window of more than one tap): what
// they share. The conv kernels would zero-pad c to 16 bytes (a 7x7, 3-channel stem in bf16: 3 -> 8 channels, 5/8 of
// every MMA wasted, and 16-byte im2col rows that TMA loads slowly). These variants unroll the window instead, into
// columns in the filter's own HWIO row order (t, r, s, c), so that the filter is a (taps*c, K) matrix:
//   im2col_frag.cu         forwards of one wave of warps gathering their MMA fragments straight from x
//   im2col_fused_fwd.cu    forwards staging each tile's input patch in shared memory, unrolled into the MMA
//   im2col_fused_wgrad.cu  16-bit filter gradients staging patch and dy tiles in shared memory
//   im2col_chunked.cu      every op: the unrolled (pixels, taps*c) matrix in chunks, then the family's 1x1 GEMMs
// Index arithmetic is 32-bit (Im2colGemmApplies bounds it); element offsets are formed in 64 bits.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"
#include "dispatch/rules.h"
#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/igemm.h"
#include "kernels/shared/common.cuh"
#include "kernels/shared/mma.cuh"

namespace jaxconv {
namespace cuda {
namespace {

using igemm::AlignUp;

constexpr int64_t kMaxRows = 2048;                     // taps * c: the column table lives in shared memory
constexpr size_t kMaxImageBytes = size_t(1) << 30;     // one image's cols at most (a chunk holds >= 1 image)
constexpr int64_t kMaxIndex = (int64_t(1) << 31) - 1;  // the kernels' 32-bit indices

size_t ElemBytes(DType in) { return in == DType::kF32 ? 4 : 2; }

struct Geometry {
  int in[3], out[3], stride[3], pad_lo[3], dil[3];
  int c, rows, cr, win0, win1, win2;
  int qt, wt;  // unroll tile: qt output pixels of one output row, whose taps read wt input columns
};

// The unroll kernel's tile: the largest qt <= 64 whose input patch (win0*win1 rows of wt columns of c channels)
// and column table fit kTileSmem; 0 when not even one pixel's does.
constexpr size_t kTileSmem = size_t(40) << 10;
int TableInts(int64_t rows) { return static_cast<int>((rows + 3) / 4 * 4); }  // keeps the patch 16-byte aligned
int64_t PatchWidth(const ConvParams& p, int64_t qt) { return (qt - 1) * p.stride[2] + (p.win[2] - 1) * p.rhs_dil[2] + 1; }
size_t TileSmem(const ConvParams& p, int64_t qt, size_t elem) {
  return static_cast<size_t>(TableInts(SpatialCount(p.win) * p.c[0])) * 4 +
         static_cast<size_t>(p.win[0] * p.win[1] * PatchWidth(p, qt) * p.c[0]) * elem;
}
int TileQ(const ConvParams& p, size_t elem) {
  for (int64_t qt = std::min<int64_t>(64, p.out[2]); qt >= 1; qt /= 2) {
    if (TileSmem(p, qt, elem) <= kTileSmem) return static_cast<int>(qt);
  }
  return 0;
}

// The geometry of the first layer p: rows = taps * c, cr = rows rounded up to the alignment (the chunked route's
// column count), the unroll kernel's tile (TileQ).
Geometry GeometryOf(const ConvParams& p, DType in) {
  const int64_t rows = SpatialCount(p.win) * p.c[0], align = ImplicitGemmAlign(in);
  Geometry g;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = static_cast<int>(p.in[d]);
    g.out[d] = static_cast<int>(p.out[d]);
    g.stride[d] = static_cast<int>(p.stride[d]);
    g.pad_lo[d] = static_cast<int>(p.pad_lo[d]);
    g.dil[d] = static_cast<int>(p.rhs_dil[d]);
  }
  g.c = static_cast<int>(p.c[0]);
  g.rows = static_cast<int>(rows);
  g.cr = static_cast<int>((rows + align - 1) / align * align);
  g.win0 = static_cast<int>(p.win[0]);
  g.win1 = static_cast<int>(p.win[1]);
  g.win2 = static_cast<int>(p.win[2]);
  g.qt = TileQ(p, ElemBytes(in));
  g.wt = static_cast<int>(PatchWidth(p, g.qt));
  return g;
}

// Column j's offset in the staged patch (StagePatch) of a tile's first pixel; pixel i of the tile reads
// patch[offset + i * stride * c].
__device__ __forceinline__ int PatchOffset(const Geometry& g, int j) {
  const int ch = j % g.c, tap = j / g.c, s = tap % g.win2, tr = tap / g.win2;  // tr = t * win1 + r
  return (tr * g.wt + s * g.dil[2]) * g.c + ch;
}

// ---- the fused kernels' patch staging (im2col_fused_fwd.cu, im2col_fused_wgrad.cu) ----
constexpr int kFwThreads = 128;  // the fused filter gradient's block (4 warps), the staging helpers' default
constexpr int kFwBatch = 8;      // patch elements a thread has in flight at once
constexpr int kNoRow = INT_MIN;

// Per patch row tr = (t, r) of the tile of output row `row` (n, z, p) from
// pixel q0 on: the offset of x element (d, h, w_lo, 0) in its image, kNoRow outside it. Returns n and w_lo.
struct TileOrigin {
  int n, w_lo;
};
template <int kThreads = kFwThreads>
__device__ __forceinline__ TileOrigin FillRowTable(const Geometry& g, int row, int q0, int* __restrict__ rowtab) {
  const int pp = row % g.out[1], zq = row / g.out[1];
  const int z = zq % g.out[0], w_lo = q0 * g.stride[2] - g.pad_lo[2];
  for (int tr = threadIdx.x; tr < g.win0 * g.win1; tr += kThreads) {
    const int t = tr / g.win1, r = tr - t * g.win1;
    const int d = z * g.stride[0] - g.pad_lo[0] + t * g.dil[0], h = pp * g.stride[1] - g.pad_lo[1] + r * g.dil[1];
    const bool ok = static_cast<unsigned>(d) < static_cast<unsigned>(g.in[0]) &&
                    static_cast<unsigned>(h) < static_cast<unsigned>(g.in[1]);
    rowtab[tr] = ok ? ((d * g.in[1] + h) * g.in[2] + w_lo) * g.c : kNoRow;
  }
  return TileOrigin{zq / g.out[0], w_lo};
}

// Patch elements i0 + u * kThreads (u < N) into val, as StagePatch stages them (rows of wt * c elements, zeros
// outside the image and past the patch), from the row table (written before a barrier). All N loads are issued
// before any use: they are latency-bound (one round trip per element had the fused filter gradient as slow as the
// chunked route).
template <int N, int kThreads = kFwThreads, class E>
__device__ __forceinline__ void LoadPatchElems(const Geometry& g, const E* __restrict__ x, TileOrigin o,
                                               const int* __restrict__ rowtab, int i0, E (&val)[N]) {
  const int span = g.wt * g.c, patch_elems = g.win0 * g.win1 * span;
  const E* xn = x + static_cast<int64_t>(o.n) * g.in[0] * g.in[1] * g.in[2] * g.c;
  const int e_lo = max(0, -o.w_lo * g.c), e_hi = min(span, (g.in[2] - o.w_lo) * g.c);
  int tr = i0 / span, e = i0 - tr * span;
#pragma unroll
  for (int u = 0; u < N; ++u) val[u] = E{};
#pragma unroll
  for (int u = 0; u < N; ++u) {
    if (i0 + u * kThreads >= patch_elems) break;  // small patches (batch-1 tiles) skip the idle slots' stepping
    const int ro = rowtab[tr];
    if (ro != kNoRow && e >= e_lo && e < e_hi) val[u] = xn[ro + e];
    for (e += kThreads; e >= span; e -= span) ++tr;
  }
}

// Stages the tile's patch, elements `begin` on, put(i, value) storing element i, kFwBatch loads per thread in flight.
template <int kThreads = kFwThreads, class E, class Put>
__device__ __forceinline__ void LoadPatch(const Geometry& g, const E* __restrict__ x, TileOrigin o,
                                          const int* __restrict__ rowtab, Put put, int begin = 0) {
  const int patch_elems = g.win0 * g.win1 * g.wt * g.c;
  for (int i0 = begin + threadIdx.x; i0 < patch_elems; i0 += kFwBatch * kThreads) {
    E val[kFwBatch];
    LoadPatchElems<kFwBatch, kThreads>(g, x, o, rowtab, i0, val);
#pragma unroll
    for (int u = 0; u < kFwBatch; ++u) {
      if (i0 + u * kThreads < patch_elems) put(i0 + u * kThreads, val[u]);
    }
  }
}

// ---- float32 operands on the MMA (im2col_fused_fwd.cu, im2col_frag.cu) ----
constexpr int kFfMaxRows = 160;  // taps * c of the fused forward's filter slice: a 7x7 stem's 147
// How f32 operands enter the MMAs (16-bit operands take kFfTf32, which leaves them as they are): TF32, rounded when
// staged; 3xTF32 split when staged, each value once per block or tile (the MMA loop takes 98 instructions per k step
// so, and took 190 splitting its fragments with cvt.rna: SASS); 3xTF32 split in registers, per fragment.
enum FfMath { kFfTf32 = 0, kFfSplitStaged = 1, kFfSplitRegs = 2 };

__device__ __forceinline__ uint32_t Tf32Bits(float v) {
  uint32_t r = __float_as_uint(v);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
#endif
  return r;
}

// v = big + small for 3xTF32: big is v rounded to TF32 (to nearest, ties away, as cvt.rna, which sm_90 emulates in
// four instructions; NaN excepted: small carries it), small = v - big exactly, which the MMA truncates to TF32
// (error below 2^-21 |v|). The small x small product is dropped.
__device__ __forceinline__ float2 SplitTf32(float v) {
  const float big = __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
  return make_float2(big, v - big);
}

__device__ __forceinline__ void MmaTf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The routing predicate of the first-layer variants (pure host code): 16-bit or f32 operands, c * element size under
// 16 bytes with more than one tap, taps * c <= kMaxRows, one image's unrolled columns within kMaxImageBytes, 32-bit
// per-image x offsets, and an unroll tile that fits (TileQ).
bool Im2colGemmApplies(const ConvParams& p, DType in) {
  if (in != DType::kF32 && in != DType::kBF16 && in != DType::kF16) return false;
  const int64_t bytes = static_cast<int64_t>(ElemBytes(in));
  if (p.c[0] * bytes >= 16 || SpatialCount(p.win) < 2) return false;  // c < 8 (16-bit) or < 4 (f32): padded
  const int64_t rows = SpatialCount(p.win) * p.c[0];
  if (rows > kMaxRows) return false;
  const int64_t cr = (rows + 16 / bytes - 1) / (16 / bytes) * (16 / bytes);
  return static_cast<size_t>(SpatialCount(p.out) * cr * bytes) <= kMaxImageBytes &&
         SpatialCount(p.in) * p.c[0] <= kMaxIndex && TileQ(p, static_cast<size_t>(bytes)) > 0;
}

// The gate of every first-layer variant: the family's (ImplicitGemmError), then Im2colGemmApplies.
std::string Im2colError(const Problem& pr) {
  if (std::string why = ImplicitGemmError(pr.p, pr.in, pr.out); !why.empty()) return why;
  if (!Im2colGemmApplies(pr.p, pr.in)) {
    return "it takes first layers: c under 16 bytes, more than one tap, taps * c <= 2048, a tile's patch in 40 KiB";
  }
  return {};
}

}  // namespace
}  // namespace cuda
}  // namespace jaxconv
