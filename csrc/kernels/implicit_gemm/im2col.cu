// The implicit_gemm family's route for first layers: few input channels (c * element size < 16 bytes) and a
// window of more than one tap. The conv kernels would zero-pad c to 16 bytes (a 7x7, 3-channel stem in bf16:
// 3 -> 8 channels, 5/8 of every MMA wasted, and 16-byte im2col rows that TMA loads slowly). Here the window is
// unrolled instead into cols (M, cr): M output pixels, cr = taps*c rounded up to the alignment, columns in the
// filter's own HWIO row order (t, r, s, c). The convolution then is a 1x1 problem on cols, which ImplicitGemmRun
// runs (Hopper GEMMs for 16-bit operands, else the conv kernels, 3xTF32 included):
//   fwd    y     = act(cols(x) @ w' + bias)
//   dgrad  dcols = dy @ w'^T, then dx = col2im(dcols): a gather, each dx element sums its own taps (no atomics)
//   wgrad  dw'   = cols(x)^T @ dy
// w' is the (cr, K) filter matrix: the HWIO filter's (taps*c, K) rows, plus zero rows up to cr.
// cols is built in chunks of whole images: the workspace stays bounded and a chunk is still in L2 when its GEMM
// reads it. wgrad sums the chunks' f32 partial filters in chunk order (deterministic). On sm_80+, fwd with taps*c
// <= 160 (FusedFwdKernel) and wgrad with 16-bit operands (FusedWgradKernel) instead run one fused kernel that
// unrolls each tile of the window in shared memory and never writes cols; forwards of one wave of warps gather
// their MMA fragments straight from global memory instead (FragFwdKernel).
#include <algorithm>
#include <climits>

#include "dispatch/rules.h"
#include "kernels/shared/common.cuh"
#include "kernels/implicit_gemm/igemm.h"
#include "kernels/shared/mma.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

constexpr int64_t kMaxRows = 2048;               // taps * c: the column table lives in shared memory
constexpr size_t kChunkBytes = size_t(32) << 20;  // cols per chunk: about two thirds of an H100's L2
constexpr size_t kMaxImageBytes = size_t(1) << 30;  // one image's cols at most (a chunk holds >= 1 image)
constexpr int64_t kMaxIndex = (int64_t(1) << 31) - 1;  // the kernels' 32-bit indices

size_t ElemBytes(DType in) { return in == DType::kF32 ? 4 : 2; }

struct Plan {
  int64_t rows = 0;       // taps * c: the filter matrix's real rows
  int64_t cr = 0;         // rows rounded up to the alignment: the 1x1 problem's input channels
  int64_t pixels = 0;     // output pixels per image
  int64_t images = 0;     // images per chunk (the last chunk may have fewer)
  int64_t chunks = 0;
  size_t filter = 0;      // fwd/dgrad: the padded filter w' (0 when rows == cr: w is used in place)
  size_t slices = 0;      // wgrad: the chunks' f32 partial filters
  size_t cols = 0;        // one chunk of cols (dgrad: dcols)
  size_t gemm = 0;        // the 1x1 problem's own workspace (the larger of a full and the last chunk's)
  size_t bytes() const { return filter + slices + cols + gemm; }
};

// The 1x1 problem of `images` images: x = cols (images, out spatial, cr), y = the conv's own y.
ConvParams OneByOne(const ConvParams& p, Op op, int64_t images, int64_t cr) {
  ConvParams q = p;
  q.layout[0] = kChannelsLast;
  q.n[0] = images;
  q.c[0] = cr;
  q.groups[0] = q.batch_groups[0] = 1;
  for (int d = 0; d < 3; ++d) {
    q.in[d] = p.out[d];
    q.win[d] = q.stride[d] = q.lhs_dil[d] = q.rhs_dil[d] = 1;
    q.pad_lo[d] = q.pad_hi[d] = 0;
  }
  if (op != Op::kFwd) q.activation[0] = kActNone, q.has_bias[0] = 0;
  q.poison[0] = 0;
  return q;
}

Plan MakePlan(const ConvParams& p, Op op, DType in, int64_t algo) {
  Plan pl;
  const int64_t align = ImplicitGemmAlign(static_cast<int>(ElemBytes(in)));
  pl.rows = SpatialCount(p.win) * p.c[0];
  pl.cr = (pl.rows + align - 1) / align * align;
  pl.pixels = SpatialCount(p.out);
  const size_t image_cols = static_cast<size_t>(pl.pixels * pl.cr) * ElemBytes(in);
  const int64_t image_x = SpatialCount(p.in) * p.c[0];  // per image; a chunk's x and dx stay below 2^31
  pl.images = std::max<int64_t>(1, std::min({p.n[0], static_cast<int64_t>(kChunkBytes / image_cols), kMaxIndex / image_x}));
  pl.chunks = CeilDiv(p.n[0], pl.images);
  const int64_t last = p.n[0] - (pl.chunks - 1) * pl.images;
  const int64_t kk = p.k[0];
  if (op != Op::kWgrad && pl.cr != pl.rows) pl.filter = AlignUp(static_cast<size_t>(pl.cr * kk) * ElemBytes(in));
  // Chunk i writes its (cr, K) partial filter at slice i * rows * K; the cr - rows padding rows' sums (not
  // needed) spill into slice i + 1, which chunk i + 1 then overwrites (the GEMMs run in stream order).
  if (op == Op::kWgrad) pl.slices = AlignUp(static_cast<size_t>(((pl.chunks - 1) * pl.rows + pl.cr) * kk) * 4);
  pl.cols = AlignUp(image_cols * static_cast<size_t>(pl.images));
  pl.gemm = std::max(ImplicitGemmWorkspaceBytes(OneByOne(p, op, pl.images, pl.cr), op, in, algo),
                     ImplicitGemmWorkspaceBytes(OneByOne(p, op, last, pl.cr), op, in, algo));
  return pl;
}

// Index arithmetic is 32-bit (Im2colGemmApplies bounds a chunk's columns and each image's elements below 2^31);
// element offsets are formed in 64 bits.
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

Geometry GeometryOf(const ConvParams& p, const Plan& pl, DType in) {
  Geometry g;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = static_cast<int>(p.in[d]);
    g.out[d] = static_cast<int>(p.out[d]);
    g.stride[d] = static_cast<int>(p.stride[d]);
    g.pad_lo[d] = static_cast<int>(p.pad_lo[d]);
    g.dil[d] = static_cast<int>(p.rhs_dil[d]);
  }
  g.c = static_cast<int>(p.c[0]);
  g.rows = static_cast<int>(pl.rows);
  g.cr = static_cast<int>(pl.cr);
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

// Stages in shared memory the input patch that the taps of output row `row` (n, z, p over the images x starts
// at), pixels q0 .. q0 + qt - 1, read: win0*win1 rows of wt columns of c channels, zeros outside the image.
// Patch row tr = (t, r) is the contiguous run of wt * c elements of x row (d, h) from column w_lo on; the
// elements outside [0, W * c) of that row are padding (ncu, run 45: per-element divisions here had made the
// unroll kernel issue-bound). The caller synchronises before and after.
template <class E>
__device__ __forceinline__ void StagePatch(const Geometry& g, const E* __restrict__ x, int row, int q0,
                                           E* __restrict__ patch) {
  const int pp = row % g.out[1], zq = row / g.out[1];
  const int z = zq % g.out[0], n = zq / g.out[0];
  const E* xn = x + static_cast<int64_t>(n) * g.in[0] * g.in[1] * g.in[2] * g.c;
  const int w_lo = q0 * g.stride[2] - g.pad_lo[2], span = g.wt * g.c;
  const int e_lo = max(0, -w_lo * g.c), e_hi = min(span, (g.in[2] - w_lo) * g.c);
  for (int tr = 0; tr < g.win0 * g.win1; ++tr) {
    const int t = tr / g.win1, r = tr - t * g.win1;
    const int d = z * g.stride[0] - g.pad_lo[0] + t * g.dil[0], h = pp * g.stride[1] - g.pad_lo[1] + r * g.dil[1];
    const bool row_ok = static_cast<unsigned>(d) < static_cast<unsigned>(g.in[0]) &&
                        static_cast<unsigned>(h) < static_cast<unsigned>(g.in[1]);
    const E* src = row_ok ? xn + (static_cast<int64_t>(d) * g.in[1] + h) * g.in[2] * g.c + int64_t(w_lo) * g.c : xn;
    E* dst_row = patch + tr * span;
    for (int e = threadIdx.x; e < span; e += blockDim.x) dst_row[e] = row_ok && e >= e_lo && e < e_hi ? src[e] : E{};
  }
}

// cols[m, j] for the output rows (n, z, p) of `row_count` whole-image rows (x points at the chunk's first image).
// A block takes qt consecutive pixels of one output row: it stages their input patch (StagePatch), then writes
// their cols rows as 16-byte words of V columns (cr % V == 0), column j reading patch[table[j] + pixel * stride
// * c]. E moves the elements as bits.
template <class E>
__global__ void __launch_bounds__(256) Im2colKernel(const Geometry g, const E* __restrict__ x, E* __restrict__ cols,
                                                    int row_count) {
  constexpr int V = 16 / sizeof(E);
  extern __shared__ int4 smem4[];
  int* table = reinterpret_cast<int*>(smem4);
  E* patch = reinterpret_cast<E*>(table + ((g.rows + 3) / 4 * 4));
  for (int j = threadIdx.x; j < g.rows; j += blockDim.x) table[j] = PatchOffset(g, j);
  const int segs = (g.out[2] + g.qt - 1) / g.qt, groups = g.cr / V;
  for (int b = blockIdx.x; b < row_count * segs; b += gridDim.x) {
    const int row = b / segs, q0 = (b - row * segs) * g.qt, qn = min(g.qt, g.out[2] - q0);
    __syncthreads();  // the table is written; the previous tile's readers are done with the patch
    StagePatch(g, x, row, q0, patch);
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(cols + (static_cast<int64_t>(row) * g.out[2] + q0) * g.cr);
    for (int k = threadIdx.x; k < qn * groups; k += blockDim.x) {
      const int ml = k / groups, j0 = (k - ml * groups) * V, shift = ml * g.stride[2] * g.c;
      union {
        uint4 v;
        E e[V];
      } word;
#pragma unroll
      for (int i = 0; i < V; ++i) word.e[i] = j0 + i < g.rows ? patch[table[j0 + i] + shift] : E{};
      dst[k] = word.v;
    }
  }
}

// ---- wgrad with 16-bit operands: one fused kernel, the unrolled window never in memory ----
// dw[j, k] = sum over output pixels m of cols[m, j] * dy[m, k]. Why: the chunked route wrote and re-read cols,
// taps*c/c times the size of x (49x for a 7x7 stem), and took 1.6x lax's time on ResNet's stem at batch 128
// (resnet_step --profile-steps, DEVICE_RUNS run 49). A block owns one (JT-column tile of j, kFwK block of k)
// and a strided range of pixel tiles (the unroll kernel's: qt <= kFwPix pixels of one output row). Per tile it
// stages the x patch, the tile's dy rows and its cols in shared memory and runs mma.sync m16n8k16 with f32
// accumulators that stay in registers across all its tiles; at the end it writes its partial filter into slice
// blockIdx.x of the workspace, and ReduceSplits sums the slices in order (deterministic).
constexpr int kFwPix = 64;      // pixels per tile: the MMA's reduction depth per tile
constexpr int kFwK = 64;        // output channels per block
constexpr int kFwThreads = 128; // 4 warps: 2 along k (32 channels each) x 2 along j (JT / 2 columns each)
constexpr int kFwMaxJt = 160;   // a 7x7 stem's 147 columns in one tile
constexpr int kFwDyLd = kFwK + 8;  // smem row strides padded by 16 bytes: conflict-free ldmatrix
constexpr int kFwDyWords = kFwPix * kFwK / 8 / kFwThreads;  // 16-byte dy words per thread and tile
constexpr int kFwBatch = 8;        // patch elements a thread has in flight at once
constexpr int kNoRow = INT_MIN;
__host__ __device__ constexpr int FwColsLd(int jt) { return jt + 8; }

// The fused kernels' patch staging. Per patch row tr = (t, r) of the tile of output row `row` (n, z, p) from
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

// NT: n8 MMA tiles per warp along j, JT = 16 * NT columns per block. x, dy: 16-bit elements as bits; dy rows have
// k_total elements (k_total % 8 == 0: ImplicitGemmApplies). partial: f32 (splits, rows, k_total).
template <bool kBF16, int NT>
__global__ void __launch_bounds__(kFwThreads, 3) FusedWgradKernel(const Geometry g, const uint16_t* __restrict__ x,
                                                                  const uint16_t* __restrict__ dy, int k_total,
                                                                  int row_count, int kblocks,
                                                                  float* __restrict__ partial) {
  constexpr int JT = 16 * NT, CLD = FwColsLd(JT);
  static_assert(NT % 2 == 0 && JT <= kFwMaxJt, "tile");
  extern __shared__ int4 smem4[];
  uint16_t* dys = reinterpret_cast<uint16_t*>(smem4);  // [kFwPix][kFwDyLd]: dy rows of the tile, this k block
  uint16_t* colss = dys + kFwPix * kFwDyLd;            // [kFwPix][CLD]: the tile's cols, this j tile
  int* table = reinterpret_cast<int*>(colss + kFwPix * CLD);  // [JT]: column jl's patch offset, -1 past rows
  const int rows_tr = g.win0 * g.win1;
  int* rowtab = table + JT;                                        // [rows_tr, rounded up to 4]
  uint16_t* patch = reinterpret_cast<uint16_t*>(rowtab + (rows_tr + 3) / 4 * 4);
  const int tid = threadIdx.x, lane = tid & 31, wm = (tid >> 5) & 1, wn = tid >> 6;
  const int k0 = (blockIdx.y % kblocks) * kFwK, j0 = (blockIdx.y / kblocks) * JT;
  for (int jl = tid; jl < JT; jl += kFwThreads) table[jl] = j0 + jl < g.rows ? PatchOffset(g, j0 + jl) : -1;
  float acc[2][NT][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;
    }
  }
  const int segs = (g.out[2] + g.qt - 1) / g.qt, sc = g.stride[2] * g.c;
  for (int b = blockIdx.x; b < row_count * segs; b += gridDim.x) {
    const int row = b / segs, q0 = (b - row * segs) * g.qt, qn = min(g.qt, g.out[2] - q0);
    // The previous tile's readers of rowtab passed the barrier after its staging.
    const TileOrigin o = FillRowTable(g, row, q0, rowtab);
    __syncthreads();  // rowtab written; the previous tile's MMAs are done with dys, colss and the patch
    // All of a thread's global loads of the tile are issued before their shared-memory stores: the dy words
    // first, then the patch.
    const uint16_t* dyr = dy + (static_cast<int64_t>(row) * g.out[2] + q0) * k_total + k0;
    uint4 dyw[kFwDyWords];
#pragma unroll
    for (int u = 0; u < kFwDyWords; ++u) {
      const int i = tid + u * kFwThreads, ml = i / (kFwK / 8), v = (i % (kFwK / 8)) * 8;
      dyw[u] = ml < qn && k0 + v < k_total ? *reinterpret_cast<const uint4*>(dyr + static_cast<int64_t>(ml) * k_total + v)
                                           : make_uint4(0, 0, 0, 0);
    }
    LoadPatch(g, x, o, rowtab, [&](int i, uint16_t v) { patch[i] = v; });
#pragma unroll
    for (int u = 0; u < kFwDyWords; ++u) {
      const int i = tid + u * kFwThreads;
      *reinterpret_cast<uint4*>(dys + i / (kFwK / 8) * kFwDyLd + (i % (kFwK / 8)) * 8) = dyw[u];
    }
    __syncthreads();
    // cols[ml, jl] = patch[table[jl] + ml * stride * c]; work items of one column and 8 pixels (JT * 8 of them,
    // a multiple of the block: every thread gets the same share).
    for (int item = tid; item < JT * (kFwPix / 8); item += kFwThreads) {
      const int jl = item % JT, m0 = item / JT * 8, o = table[jl];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int ml = m0 + i;
        colss[ml * CLD + jl] = o >= 0 && ml < qn ? patch[o + ml * sc] : 0;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kFwPix; kk += 16) {
      // A = dy^T (k x pixels), B = cols (pixels x j): both stored pixel-major, so both load transposed. Lane l
      // addresses row l % 8 of 8x8 matrix l / 8: A's four are (k 0-7 | 8-15) x (pixels 0-7 | 8-15), B's are
      // (pixels 0-7 | 8-15) x (j 0-7 | 8-15) of two n8 tiles.
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        LdMatrix<4, true>(a[mi], dys + (kk + (lane & 7) + ((lane >> 4) << 3)) * kFwDyLd + wm * 32 + mi * 16 +
                                     (((lane >> 3) & 1) << 3));
      }
#pragma unroll
      for (int ni = 0; ni < NT; ni += 2) {
        uint32_t bq[4];
        LdMatrix<4, true>(bq, colss + (kk + (lane & 7) + (((lane >> 3) & 1) << 3)) * CLD + wn * (JT / 2) + ni * 8 +
                                  ((lane >> 4) << 3));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          Mma16816<kBF16>(acc[mi][ni], a[mi], bq[0], bq[1]);
          Mma16816<kBF16>(acc[mi][ni + 1], a[mi], bq[2], bq[3]);
        }
      }
    }
  }
  // Accumulator r of tile (mi, ni): k row lane / 4 (+ 8 for r >= 2), j column 2 * (lane % 4) (+ 1 for odd r).
  float* out = partial + static_cast<int64_t>(blockIdx.x) * g.rows * k_total;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int k = k0 + wm * 32 + mi * 16 + (lane >> 2) + (r >> 1) * 8;
        const int j = j0 + wn * (JT / 2) + ni * 8 + (lane & 3) * 2 + (r & 1);
        if (k < k_total && j < g.rows) out[static_cast<int64_t>(j) * k_total + k] = acc[mi][ni][r];
      }
    }
  }
}

// ---- fwd: one fused kernel, the unrolled window never in memory ----
// y[m, k] = act(sum_j cols[m, j] * w'[j, k] + bias[k]). Why: the chunked route wrote and re-read cols (49x the size
// of x for a 7x7 stem) and ran ResNet's stem at 0.99x lax in bf16 and 0.68-0.74x in TF32 (DEVICE_RUNS 109-110). A
// block keeps its kFfK-channel slice of w' (all rows, zero-padded to jp) in shared memory for the whole launch and
// loops over pixel tiles (qt <= kFfPix pixels of one output row): it stores the tile's patch (loaded into registers
// during the previous tile's MMAs: a tile's own loads, issued after its barrier, left the warps waiting on them),
// unrolls its cols into shared memory (16-bit; see the kernel for f32), runs mma.sync with f32 accumulators and
// applies the epilogue from the registers. Operands: bf16/f16 (m16n8k16); f32 as TF32 (m16n8k8), rounded once when
// staged; f32 as 3xTF32 (each value split into big and small TF32 parts, three products; FfMath).
constexpr int kFfPix = 64;        // pixels per tile (MMA M): 2 rows of warps, 32 pixels each
constexpr int kFfK = 64;          // output channels per block (MMA N): WN columns of warps, 64 / WN channels each
constexpr int kFfMaxRows = 160;   // taps * c of the filter slice: a 7x7 stem's 147
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

// T: __nv_bfloat16, __half or float (y in T). w: the HWIO filter as a (rows, k_total) matrix; bias: k_total elements
// or null; tiles: row_count output rows of segs = ceil(out[2] / qt) tiles each; blockIdx.y: the k block.
// f32 operands skip cols: the MMAs load their A fragments from the patch itself (the unroll had been half the
// kernel's instructions, and cols' shared memory halved its occupancy: DEVICE_RUNS 113), so the patch is double
// buffered (3xTF32 split when staged: one buffer for its big parts, one for its small parts, and a barrier per tile).
// Either way columns past rows read a zero tail behind the patch (FfPatchElems) and rows past qn are never stored.
//
// How f32 operands enter the MMAs (16-bit operands take kFfTf32, which leaves them as they are): TF32, rounded when
// staged; 3xTF32 split when staged, each value once per block or tile (the MMA loop takes 98 instructions per k step
// so, and took 190 splitting its fragments with cvt.rna: SASS); 3xTF32 split in registers, per fragment.
enum FfMath { kFfTf32 = 0, kFfSplitStaged = 1, kFfSplitRegs = 2 };
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
  // The first tile's patch loads go out before the filter slice's, so the two round trips overlap (32x32 3->64
  // batch 1: 4.25 -> 4.18 µs bf16, 4.80 -> 4.69 f32 HIGHEST; run 185).
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
  // The slice as 16-byte vectors of kVw channels (k_total % kVw == 0 and w 16-byte aligned: FusedFwd), kFfWBatch
  // loads in flight per thread: element by element, one round trip each, it was half the stem's time at batch 1
  // (ncu, DEVICE_RUNS 139). Vector slot i is row j, channels n..n+kVw-1. 16-bit copies rows as they are; f32
  // transposes them into k-major rows with scalar stores, so a warp takes 16 rows x 2 vectors (32-byte runs of
  // each row) and its lanes' stores fall in distinct banks (a warp along one row had them 8-way conflicted: 84 % of
  // the shared-store wavefronts on the stem b1, ncu run 144).
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

// ---- the register-gathered forward: one wave of independent warps, no shared memory ----
// A warp computes 16 consecutive output pixels (flattened over n, z, p, q) x 8 * NI channels: it gathers each
// MMA fragment element of x straight from global memory (the column table below maps a fragment column
// j = (t, r, s, ci) to its offset and tap), so nothing waits on a barrier or a staging copy. On grids of about one
// wave (batch-1 first layers) the fused forward's chain of row table, staged patch and filter, barriers and unroll
// was most of the time; here a warp's gathers are a few round trips, each a 32-column chunk ahead of its MMAs.
// A warp whose 16 pixels all have their whole window inside x (most tiles of a large image) gathers without the
// bounds tests, which were about 40 % of its instructions per chunk (SASS).
// The MMA's column g of n tile ni is output channel n0 + NI * g + ni: a lane's filter values of one row are then
// NI consecutive channels (one vector load), and its results 2 * NI consecutive channels of a pixel.
constexpr int kFgWarps = 4;        // warps per block, each with its own tiles
constexpr int kFgMaxRows = kFfMaxRows;  // taps * c: the column table covers every window the fused forward takes
constexpr int kFgChunk = 32;       // columns gathered per step: the next chunk's loads go out before these MMAs

struct FgArgs {
  int in[3], out[3], stride[3], pad[3];
  int c, rows, k_total, act, nblocks, tiles, x_image;  // nblocks of 8 * NI channels; tiles: 16-pixel tiles x nblocks
  int reach[3];                   // (win - 1) * dilation: a pixel is interior when base..base + reach lies in x
  int64_t pixels;                 // output pixels (n * out spatial)
  // Column j < rows: {element offset of (tap, ci) from the pixel's base, the tap's offsets along d0, d1, d2};
  // columns past rows carry an offset along d0 that no pixel reaches, so the bounds-tested gathers read zeros there
  // (the interior loop tests j < rows instead; their offset 0 stays inside x for an interior pixel).
  int4 col[kFgMaxRows];
};
constexpr int kFgFar = -(1 << 30);

template <class R, int N>
struct alignas(sizeof(R) * N) FgVec {
  R v[N];
};

// *p when ok, else zeros, as a load that stays where it is written (asm volatile): ptxas otherwise sank read-only
// loads next to their use, or issued them again there, to save registers, so the gathers meant to run a chunk ahead
// became round trips right before the MMAs (SASS; the batch-1 stem bf16 took 11.9 us so in run 227, 8.8 pinned).
template <class V>
__device__ __forceinline__ V LdgPinned(const V* p, bool ok) {
  V r;
  const int on = ok;
  if constexpr (sizeof(V) == 2) {
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n mov.b16 %0, 0;\n @q ld.global.nc.b16 %0, [%1];\n}\n"
                 : "=h"(*reinterpret_cast<uint16_t*>(&r)) : "l"(p), "r"(on));
  } else if constexpr (sizeof(V) == 4) {
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n mov.b32 %0, 0;\n @q ld.global.nc.b32 %0, [%1];\n}\n"
                 : "=r"(*reinterpret_cast<uint32_t*>(&r)) : "l"(p), "r"(on));
  } else if constexpr (sizeof(V) == 8) {
    uint32_t* u = reinterpret_cast<uint32_t*>(&r);
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %3, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n"
                 " @q ld.global.nc.v2.b32 {%0, %1}, [%2];\n}\n"
                 : "=r"(u[0]), "=r"(u[1]) : "l"(p), "r"(on));
  } else {
    static_assert(sizeof(V) == 16, "2, 4, 8 or 16 bytes");
    uint32_t* u = reinterpret_cast<uint32_t*>(&r);
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
                 " mov.b32 %3, 0;\n @q ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];\n}\n"
                 : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p), "r"(on));
  }
  return r;
}

// kMath as the fused forward's (FfMath): 16-bit operands as they are (kFfTf32), f32 rounded to TF32 (kFfTf32) or
// split for 3xTF32 in registers (kFfSplitRegs).
template <class T, int kMath, int NI>
__global__ void __launch_bounds__(32 * kFgWarps) FragFwdKernel(const __grid_constant__ FgArgs g,
                                                               const T* __restrict__ x, const T* __restrict__ w,
                                                               const T* __restrict__ bias, T* __restrict__ y) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr int kKs = k16 ? 16 : 8;         // MMA k
  constexpr int kJq = k16 ? 4 : 2;          // fragment columns per lane and k step
  constexpr int kSteps = kFgChunk / kKs;    // k steps per chunk
  using Raw = std::conditional_t<k16, uint16_t, float>;
  using Vec = FgVec<Raw, NI>;
  const Raw* xr = reinterpret_cast<const Raw*>(x);
  const Raw* wr = reinterpret_cast<const Raw*>(w);
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  // Lane's columns within a k step: 16-bit 2t, 2t + 1, 2t + 8, 2t + 9; f32 t, t + 4 (the PTX fragment layouts).
  int jo[kJq];
#pragma unroll
  for (int q = 0; q < kJq; ++q) jo[q] = k16 ? 2 * tq + (q & 1) + (q >> 1) * 8 : tq + 4 * q;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kFgWarps;
  for (int64_t wt = static_cast<int64_t>(blockIdx.x) * kFgWarps + (threadIdx.x >> 5); wt < g.tiles; wt += warps) {
    const int64_t ptile = wt / g.nblocks;
    const int n0 = static_cast<int>(wt - ptile * g.nblocks) * 8 * NI;
    // B: channels n0 + NI * gq + [0, NI) of each row (k_total % NI == 0: all valid or none).
    const bool b_ok = n0 + NI * gq < g.k_total;
    const Raw* wq[kJq];  // the lane's filter row q of k step 0: one wide multiply-add per vector load
#pragma unroll
    for (int q = 0; q < kJq; ++q) wq[q] = wr + (n0 + NI * gq + static_cast<int64_t>(jo[q]) * g.k_total);
    // Results: channels c0 + [0, 2 NI) of each of the lane's pixels, and their bias, loaded after the first gathers
    // and kept as loaded until the epilogue (converting them at once waited a round trip before any gather: SASS).
    const int c0 = n0 + 2 * NI * tq;
    Raw bias_r[2 * NI];
    // This lane's pixels (h = 0: row gq of the tile, h = 1: row gq + 8): base coordinates and element offset.
    // Offsets are 32-bit (x and the pixel count are below 2^31: ImplicitGemmApplies) and unsigned: a pixel's base
    // may lie before x, and only the sums of valid columns are read.
    int bc[2][3];
    uint32_t xb[2];
    bool pix_ok[2], inner = true;  // inner: both pixels' windows lie in x
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t pix = ptile * 16 + gq + 8 * h;
      pix_ok[h] = pix < g.pixels;
      uint32_t r = pix_ok[h] ? static_cast<uint32_t>(pix) : 0u;
      int o[3];
#pragma unroll
      for (int d = 2; d >= 0; --d) {
        const uint32_t q = r / static_cast<uint32_t>(g.out[d]);
        o[d] = static_cast<int>(r - q * static_cast<uint32_t>(g.out[d]));
        r = q;
      }
      uint32_t off = 0;
#pragma unroll
      for (int d = 0; d < 3; ++d) {
        bc[h][d] = o[d] * g.stride[d] - g.pad[d];
        off = off * static_cast<uint32_t>(g.in[d]) + static_cast<uint32_t>(bc[h][d]);
        inner = inner && bc[h][d] >= 0 && static_cast<int64_t>(bc[h][d]) + g.reach[d] < g.in[d];
      }
      xb[h] = r * static_cast<uint32_t>(g.x_image) + off * static_cast<uint32_t>(g.c);
      inner = inner && pix_ok[h];
    }
    // Tiles whose 16 pixels all have their whole window in x (most of a large image) gather without bounds tests.
    const bool interior = __all_sync(0xffffffffu, inner);
    Raw av[2][kSteps][2][kJq];  // [buffer][step][pixel h][column q]
    Vec bv[2][kSteps][kJq];     // [buffer][step][row q]
    const auto gather = [&](auto inner_c, int buf, int j0) {
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
#pragma unroll
        for (int q = 0; q < kJq; ++q) {
          const int j = j0 + st * kKs + jo[q];
          const int4 e = g.col[j];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (decltype(inner_c)::value) {  // columns past rows: offset 0, in x for an interior pixel
              av[buf][st][h][q] = LdgPinned(xr + (xb[h] + static_cast<uint32_t>(e.x)), j < g.rows);
            } else {
              const auto in_dim = [&](int d, int ed) {  // unsigned sums: no overflow, and below 0 is past in
                return static_cast<unsigned>(bc[h][d]) + static_cast<unsigned>(ed) < static_cast<unsigned>(g.in[d]);
              };
              const bool ok = pix_ok[h] && in_dim(0, e.y) && in_dim(1, e.z) && in_dim(2, e.w);
              av[buf][st][h][q] = LdgPinned(xr + (xb[h] + static_cast<uint32_t>(e.x)), ok);
            }
          }
          const uint32_t row0 = static_cast<uint32_t>(j0 + st * kKs) * static_cast<uint32_t>(g.k_total);  // uniform
          bv[buf][st][q] = LdgPinned(reinterpret_cast<const Vec*>(wq[q] + row0), b_ok && j < g.rows);
        }
      }
    };
    float acc[NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[ni][r] = 0.f;
    }
    const auto mma = [&](int buf) {
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const Raw(&a)[2][kJq] = av[buf][st];
        const Vec(&b)[kJq] = bv[buf][st];
        if constexpr (k16) {
          const auto pack = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); };
          const uint32_t af[4] = {pack(a[0][0], a[0][1]), pack(a[1][0], a[1][1]), pack(a[0][2], a[0][3]),
                                  pack(a[1][2], a[1][3])};
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            Mma16816<std::is_same_v<T, __nv_bfloat16>>(acc[ni], af, pack(b[0].v[ni], b[1].v[ni]),
                                                       pack(b[2].v[ni], b[3].v[ni]));
          }
        } else {
          const float av4[4] = {a[0][0], a[1][0], a[0][1], a[1][1]};  // (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
          uint32_t ab[4], as[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            if constexpr (kMath == kFfSplitRegs) {
              const float2 v = SplitTf32(av4[r]);
              ab[r] = __float_as_uint(v.x);
              as[r] = __float_as_uint(v.y);
            } else {
              ab[r] = Tf32Bits(av4[r]);
            }
          }
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            if constexpr (kMath == kFfSplitRegs) {
              const float2 b0 = SplitTf32(b[0].v[ni]), b1 = SplitTf32(b[1].v[ni]);
              const uint32_t bb0 = __float_as_uint(b0.x), bb1 = __float_as_uint(b1.x);
              MmaTf32(acc[ni], as, bb0, bb1);
              MmaTf32(acc[ni], ab, __float_as_uint(b0.y), __float_as_uint(b1.y));
              MmaTf32(acc[ni], ab, bb0, bb1);
            } else {
              MmaTf32(acc[ni], ab, Tf32Bits(b[0].v[ni]), Tf32Bits(b[1].v[ni]));
            }
          }
        }
      }
    };
    // Chunks of kFgChunk columns, double-buffered: chunk i + 1's gathers are issued before chunk i's MMAs.
    const int chunks = (g.rows + kFgChunk - 1) / kFgChunk;
    const auto run = [&](auto inner_c) {
      gather(inner_c, 0, 0);
#pragma unroll
      for (int i = 0; i < 2 * NI; ++i) {
        bias_r[i] = LdgPinned(reinterpret_cast<const Raw*>(bias) + c0 + i, bias != nullptr && c0 + i < g.k_total);
      }
#pragma unroll 1
      for (int i = 0; i < chunks; i += 2) {
        if (i + 1 < chunks) gather(inner_c, 1, (i + 1) * kFgChunk);
        mma(0);
        if (i + 1 >= chunks) break;
        if (i + 2 < chunks) gather(inner_c, 0, (i + 2) * kFgChunk);
        mma(1);
      }
    };
    if (interior) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
    // Accumulator r of n tile ni: pixel row gq (+ 8 for r >= 2), column 2 tq + (r & 1), i.e. channel
    // c0 + NI * (r & 1) + ni: each pixel's 2 NI channels as two vectors of NI.
    const auto epilogue = [&](auto act_c) {
      constexpr int kAct = decltype(act_c)::value;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!pix_ok[h]) continue;
        T* yp = y + (ptile * 16 + gq + 8 * h) * g.k_total + c0;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (c0 + NI * half >= g.k_total) continue;
          FgVec<T, NI> o;
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            T b;  // the loaded bits as T, converted like every other operand
            memcpy(&b, &bias_r[NI * half + ni], sizeof(T));
            o.v[ni] = FromAcc<T>(Activate(acc[ni][2 * h + half] + ToAcc(b), kAct));
          }
          *reinterpret_cast<FgVec<T, NI>*>(yp + NI * half) = o;
        }
      }
    };
    WithActivation(g.act, epilogue);
  }
}

// dx[n, d, h, w, :] = sum over the taps (t, r, s) that reach (d, h, w) from an output pixel (z, p, q) of
// dcols[n, z, p, q, (t, r, s, :)], for `count` input pixels of whole images; one thread per pixel, all c < 8
// channels (contiguous dcols reads per tap), f32 sums in tap order.
template <class T>
__global__ void __launch_bounds__(256) Col2imKernel(const Geometry g, const T* __restrict__ dcols,
                                                    T* __restrict__ dx, int count) {
  constexpr int kMaxC = 8;
  for (int m = blockIdx.x * blockDim.x + threadIdx.x; m < count; m += gridDim.x * blockDim.x) {
    const int w = m % g.in[2], hq = m / g.in[2];
    const int h = hq % g.in[1], dq = hq / g.in[1];
    const int d = dq % g.in[0], n = dq / g.in[0];
    const T* dn = dcols + static_cast<int64_t>(n) * g.out[0] * g.out[1] * g.out[2] * g.cr;
    float acc[kMaxC];
#pragma unroll
    for (int ch = 0; ch < kMaxC; ++ch) acc[ch] = 0.f;
    for (int t = 0; t < g.win0; ++t) {
      const int zz = d + g.pad_lo[0] - t * g.dil[0];
      if (zz < 0) break;
      const int z = zz / g.stride[0];
      if (z * g.stride[0] != zz || z >= g.out[0]) continue;
      for (int r = 0; r < g.win1; ++r) {
        const int pp = h + g.pad_lo[1] - r * g.dil[1];
        if (pp < 0) break;
        const int p = pp / g.stride[1];
        if (p * g.stride[1] != pp || p >= g.out[1]) continue;
        for (int s = 0; s < g.win2; ++s) {
          const int qq = w + g.pad_lo[2] - s * g.dil[2];
          if (qq < 0) break;
          const int q = qq / g.stride[2];
          if (q * g.stride[2] != qq || q >= g.out[2]) continue;
          const T* src = dn + static_cast<int64_t>((z * g.out[1] + p) * g.out[2] + q) * g.cr +
                         ((t * g.win1 + r) * g.win2 + s) * g.c;
#pragma unroll
          for (int ch = 0; ch < kMaxC; ++ch) {
            if (ch < g.c) acc[ch] += ToAcc(src[ch]);
          }
        }
      }
    }
    T* dst = dx + static_cast<int64_t>(m) * g.c;
#pragma unroll
    for (int ch = 0; ch < kMaxC; ++ch) {
      if (ch < g.c) dst[ch] = FromAcc<T>(acc[ch]);
    }
  }
}

unsigned Blocks(int64_t work) { return GridX(std::min<int64_t>(CeilDiv(work, 256), kPlanSms * 16)); }

// row_count: output rows (n, z, p) of the chunk.
cudaError_t Im2col(DType in, const Geometry& g, const void* x, void* cols, int row_count, cudaStream_t s) {
  const int64_t tiles = static_cast<int64_t>(row_count) * CeilDiv(g.out[2], g.qt);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, kPlanSms * 8));
  const size_t smem = static_cast<size_t>(TableInts(g.rows)) * 4 +
                      static_cast<size_t>(g.win0 * g.win1 * g.wt * g.c) * ElemBytes(in);
  if (in == DType::kF32) {
    Im2colKernel<uint32_t><<<grid, 256, smem, s>>>(g, static_cast<const uint32_t*>(x), static_cast<uint32_t*>(cols),
                                                   row_count);
  } else {
    Im2colKernel<uint16_t><<<grid, 256, smem, s>>>(g, static_cast<const uint16_t*>(x), static_cast<uint16_t*>(cols),
                                                   row_count);
  }
  return cudaGetLastError();
}

cudaError_t Col2im(DType in, const Geometry& g, const void* dcols, void* dx, int count, cudaStream_t s) {
  const unsigned grid = Blocks(count);
  switch (in) {
    case DType::kF32:
      Col2imKernel<float><<<grid, 256, 0, s>>>(g, static_cast<const float*>(dcols), static_cast<float*>(dx), count);
      break;
    case DType::kBF16:
      Col2imKernel<__nv_bfloat16><<<grid, 256, 0, s>>>(g, static_cast<const __nv_bfloat16*>(dcols),
                                                       static_cast<__nv_bfloat16*>(dx), count);
      break;
    default:
      Col2imKernel<__half><<<grid, 256, 0, s>>>(g, static_cast<const __half*>(dcols), static_cast<__half*>(dx),
                                                count);
  }
  return cudaGetLastError();
}

// The fused filter gradient's launch; splits == 0 when it does not apply (f32 operands, or grid limits).
struct FusedPlan {
  int jt = 0;               // columns per block: 32, 64, ..., kFwMaxJt
  int64_t jtiles = 0, kblocks = 0, splits = 0;
  size_t smem = 0, bytes = 0;  // bytes: the splits' f32 partial filters
};

constexpr size_t kMaxFusedSlices = size_t(256) << 20;

FusedPlan MakeFusedPlan(const ConvParams& p, DType in) {
  FusedPlan f;
  if (in == DType::kF32) return f;
  const int64_t rows = SpatialCount(p.win) * p.c[0], qt = TileQ(p, 2);
  const int64_t tiles = p.n[0] * p.out[0] * p.out[1] * CeilDiv(p.out[2], qt);
  const int jt = rows >= kFwMaxJt ? kFwMaxJt : static_cast<int>(CeilDiv(rows, 32) * 32);
  const int64_t jtiles = CeilDiv(rows, jt), kblocks = CeilDiv(p.k[0], kFwK);
  const size_t slice = static_cast<size_t>(rows * p.k[0]) * 4;
  if (tiles > kMaxIndex || jtiles * kblocks > 65535 || slice > kMaxFusedSlices) return f;
  f.jt = jt;
  f.jtiles = jtiles;
  f.kblocks = kblocks;
  // About three blocks per SM (the kernel's occupancy), each with at least one tile.
  f.splits = std::min({CeilDiv(kPlanSms * 3, jtiles * kblocks), tiles, static_cast<int64_t>(kMaxFusedSlices / slice)});
  f.smem = static_cast<size_t>(kFwPix * (kFwDyLd + FwColsLd(jt))) * 2 +
           static_cast<size_t>(jt + CeilDiv(p.win[0] * p.win[1], 4) * 4) * 4 +
           static_cast<size_t>(p.win[0] * p.win[1] * PatchWidth(p, qt) * p.c[0]) * 2;
  f.bytes = AlignUp(static_cast<size_t>(f.splits) * slice);
  return f;
}

template <bool kBF16, int NT>
cudaError_t LaunchFusedWgrad(const Geometry& g, const FusedPlan& f, const void* x, const void* dy, int k_total,
                             int row_count, float* partial, cudaStream_t s) {
  auto* kernel = FusedWgradKernel<kBF16, NT>;
  if (const cudaError_t e = AllowDynamicSmem(kernel, f.smem); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(f.splits), static_cast<unsigned>(f.jtiles * f.kblocks));
  kernel<<<grid, kFwThreads, f.smem, s>>>(g, static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(dy),
                                          k_total, row_count, static_cast<int>(f.kblocks), partial);
  return cudaGetLastError();
}

template <bool kBF16>
cudaError_t FusedWgrad(const Geometry& g, const FusedPlan& f, const void* x, const void* dy, int k_total,
                       int row_count, float* partial, cudaStream_t s) {
  switch (f.jt) {
    case 32: return LaunchFusedWgrad<kBF16, 2>(g, f, x, dy, k_total, row_count, partial, s);
    case 64: return LaunchFusedWgrad<kBF16, 4>(g, f, x, dy, k_total, row_count, partial, s);
    case 96: return LaunchFusedWgrad<kBF16, 6>(g, f, x, dy, k_total, row_count, partial, s);
    case 128: return LaunchFusedWgrad<kBF16, 8>(g, f, x, dy, k_total, row_count, partial, s);
    case kFwMaxJt: return LaunchFusedWgrad<kBF16, kFwMaxJt / 16>(g, f, x, dy, k_total, row_count, partial, s);
    default: return cudaErrorInvalidValue;
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

// Persistent blocks: as many as fit on the GPU at once (per k block), each looping over tiles, when the plan
// applies (*launched); with one_wave, only when that gives every tile a block of its own.
template <class T, int kMath, int WN>
cudaError_t LaunchFusedFwd(const ConvParams& p, Geometry g, DType in, const void* x, const void* w, const void* bias,
                           void* y, cudaStream_t s, bool one_wave, bool* launched) {
  const FusedFwdPlan f = MakeFusedFwdPlan(p, in, kMath == kFfSplitStaged, SharedMemPerBlockOptin());
  if (f.tiles == 0) return cudaSuccess;
  g.qt = f.qt;
  g.wt = static_cast<int>(PatchWidth(p, f.qt));
  auto* kernel = FusedFwdKernel<T, kMath, WN>;
  constexpr int kThreads = 64 * WN;
  cudaError_t e = AllowDynamicSmem(kernel, f.smem);
  if (e != cudaSuccess) return e;
  int64_t resident = 0;
  if ((e = ResidentBlocks(kernel, kThreads, f.smem, f.kblocks, &resident)) != cudaSuccess) return e;
  if (one_wave && f.tiles > resident) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(std::min(f.tiles, resident)), static_cast<unsigned>(f.kblocks));
  const int row_count = static_cast<int>(f.tiles / CeilDiv(g.out[2], g.qt));
  const int k_total = static_cast<int>(p.k[0]), act = static_cast<int>(p.activation[0]);
  kernel<<<grid, kThreads, f.smem, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(w),
                                        static_cast<const T*>(bias), k_total, row_count, act, static_cast<T*>(y));
  *launched = true;
  return cudaGetLastError();
}

// A grid of one wave (batch-1 first layers: one tile per block) is latency-bound: there 8 warps of 16 channels per tile
// (kOneWaveMath), else persistent blocks of 4 warps of 32 (kMath). Run 211 (3xTF32, the one-wave kernel splitting in
// registers): 32x32 3->64 b1 4.37 us, the stem b1 14.8 (4 warps: 4.68-4.83, 14.8); run 224 (bf16): the stem b1 9.0 ->
// 8.2 us, the 32x32 layer 4.1 -> 4.0.
template <class T, int kOneWaveMath, int kMath>
cudaError_t OneWaveOrPersistent(const ConvParams& p, const Geometry& g, DType in, const void* x, const void* w,
                                const void* bias, void* y, cudaStream_t s, bool* launched) {
  const cudaError_t e = LaunchFusedFwd<T, kOneWaveMath, 4>(p, g, in, x, w, bias, y, s, true, launched);
  if (e != cudaSuccess || *launched) return e;
  return LaunchFusedFwd<T, kMath, 2>(p, g, in, x, w, bias, y, s, false, launched);
}

// The register-gathered forward's arguments (NI n8 tiles per warp); false where it does not apply: more than
// kFgMaxRows columns, or offsets past 32 bits.
bool MakeFgArgs(const ConvParams& p, int ni, FgArgs* out) {
  const int64_t rows = SpatialCount(p.win) * p.c[0];
  if (rows > kFgMaxRows) return false;
  FgArgs g{};
  for (int d = 0; d < 3; ++d) {
    g.in[d] = static_cast<int>(p.in[d]);
    g.out[d] = static_cast<int>(p.out[d]);
    g.stride[d] = static_cast<int>(p.stride[d]);
    g.pad[d] = static_cast<int>(p.pad_lo[d]);
    const int64_t reach = (p.win[d] - 1) * p.rhs_dil[d];
    if (reach > kMaxIndex) return false;
    g.reach[d] = static_cast<int>(reach);
  }
  g.c = static_cast<int>(p.c[0]);
  g.rows = static_cast<int>(rows);
  g.k_total = static_cast<int>(p.k[0]);
  g.act = static_cast<int>(p.activation[0]);
  g.pixels = p.n[0] * SpatialCount(p.out);
  g.x_image = static_cast<int>(SpatialCount(p.in) * p.c[0]);  // < 2^31: ImplicitGemmApplies
  g.nblocks = static_cast<int>(CeilDiv(p.k[0], 8 * ni));
  const int64_t tiles = CeilDiv(g.pixels, 16) * g.nblocks;
  if (tiles > kMaxIndex) return false;
  g.tiles = static_cast<int>(tiles);
  for (int j = 0; j < kFgMaxRows; ++j) {
    if (j >= rows) {
      g.col[j] = make_int4(0, kFgFar, 0, 0);
      continue;
    }
    const int64_t ci = j % p.c[0], tap = j / p.c[0];
    const int64_t f[3] = {tap / (p.win[1] * p.win[2]), tap / p.win[2] % p.win[1], tap % p.win[2]};
    int64_t e[3], delta = 0;
    for (int d = 0; d < 3; ++d) {
      e[d] = f[d] * p.rhs_dil[d];
      delta = delta * p.in[d] + e[d];
    }
    delta = delta * p.c[0] + ci;
    if (delta > kMaxIndex || e[0] > kMaxIndex || e[1] > kMaxIndex || e[2] > kMaxIndex) return false;
    g.col[j] = make_int4(static_cast<int>(delta), static_cast<int>(e[0]), static_cast<int>(e[1]),
                         static_cast<int>(e[2]));
  }
  *out = g;
  return true;
}

// Launches FragFwdKernel when every warp tile gets a warp of its own at once (*launched), else nothing.
template <class T, int kMath, int NI>
cudaError_t LaunchFragFwd(const ConvParams& p, const void* x, const void* w, const void* bias, void* y,
                          cudaStream_t s, bool* launched) {
  FgArgs g;
  if (!Aligned16(y) || !MakeFgArgs(p, NI, &g)) return cudaSuccess;  // vector stores (w: FusedFwd's caller checks)
  auto* kernel = FragFwdKernel<T, kMath, NI>;
  int64_t resident = 0;
  if (const cudaError_t e = ResidentBlocks(kernel, 32 * kFgWarps, 0, 1, &resident); e != cudaSuccess) return e;
  const int64_t blocks = CeilDiv(g.tiles, kFgWarps);
  if (blocks > resident) return cudaSuccess;
  kernel<<<GridX(blocks), 32 * kFgWarps, 0, s>>>(g, static_cast<const T*>(x), static_cast<const T*>(w),
                                                  static_cast<const T*>(bias), static_cast<T*>(y));
  *launched = true;
  return cudaGetLastError();
}

template <class T, int kMath>
cudaError_t FragFwdAs(const ConvParams& p, const void* x, const void* w, const void* bias, void* y, cudaStream_t s,
                      bool* launched) {
  return p.k[0] >= 32 ? LaunchFragFwd<T, kMath, 4>(p, x, w, bias, y, s, launched)
                      : LaunchFragFwd<T, kMath, 2>(p, x, w, bias, y, s, launched);
}

// The register-gathered forward where it beat the fused forward (*launched), else nothing: grids of one wave with
// one chunk of columns, or 3xTF32 (runs 226-233, H200, busy us against the fused forward's: 32x32 3 -> 64
// batch 1 2.5 vs 4.0 bf16, 3.1 vs 4.4 f32 HIGHEST; the batch-1 stem's 147 columns 10.9 vs 15.1 f32 HIGHEST, but
// 7.9-8.0 vs 8.1-8.3 bf16, too close to switch; the batch-32 stem, many waves: 203 vs 118 bf16, 281 vs 215 f32).
cudaError_t FragFwd(const ConvParams& p, DType in, const void* x, const void* w, const void* bias, void* y,
                    cudaStream_t s, bool* launched) {
  const bool split = in == DType::kF32 && MathFor(p, in) == IgemmMath::k3xTF32;
  if (!split && SpatialCount(p.win) * p.c[0] > kFgChunk) return cudaSuccess;
  switch (in) {
    case DType::kBF16: return FragFwdAs<__nv_bfloat16, kFfTf32>(p, x, w, bias, y, s, launched);
    case DType::kF16: return FragFwdAs<__half, kFfTf32>(p, x, w, bias, y, s, launched);
    default:
      return split ? FragFwdAs<float, kFfSplitRegs>(p, x, w, bias, y, s, launched)
                   : FragFwdAs<float, kFfTf32>(p, x, w, bias, y, s, launched);
  }
}

// The register-gathered forward where it is taken, else the fused forward when its plan applies (*launched), else
// nothing.
cudaError_t FusedFwd(const ConvParams& p, const Geometry& g, DType in, const void* x, const void* w, const void* bias,
                     void* y, cudaStream_t s, bool* launched) {
  if (const cudaError_t e = FragFwd(p, in, x, w, bias, y, s, launched); e != cudaSuccess || *launched) return e;
  switch (in) {
    case DType::kBF16: return OneWaveOrPersistent<__nv_bfloat16, kFfTf32, kFfTf32>(p, g, in, x, w, bias, y, s, launched);
    case DType::kF16: return OneWaveOrPersistent<__half, kFfTf32, kFfTf32>(p, g, in, x, w, bias, y, s, launched);
    default: {
      if (MathFor(p, in) == IgemmMath::kTF32) {
        return LaunchFusedFwd<float, kFfTf32, 2>(p, g, in, x, w, bias, y, s, false, launched);
      }
      // 3xTF32: the one-wave kernel splits in registers, for there is no reuse that would repay splitting when staged
      // (run 211: split when staged 4.75 / 16.0 us); larger grids stage the operands split, once per block and tile,
      // which loads each A fragment half as often (the stem b32: 215 us in run 210, 247 in run 205 with the fragments
      // split in registers by cvt.rna).
      return OneWaveOrPersistent<float, kFfSplitRegs, kFfSplitStaged>(p, g, in, x, w, bias, y, s, launched);
    }
  }
}

}  // namespace

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

// wgrad: the fused kernel's slices or, on GPUs before sm_80 (known at run time only), the chunked route's needs.
size_t Im2colGemmWorkspaceBytes(const ConvParams& p, Op op, DType in, int64_t algo) {
  const size_t chunked = MakePlan(p, op, in, algo).bytes();
  return op == Op::kWgrad ? std::max(chunked, MakeFusedPlan(p, in).bytes) : chunked;
}

cudaError_t Im2colGemmRun(const ConvParams& p, Op op, DType in, DType out, int64_t algo, const void* a, const void* b,
                          const void* bias, void* out_buf, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  const Plan pl = MakePlan(p, op, in, algo);
  if (workspace == nullptr) return cudaErrorNotSupported;
  char* filter = static_cast<char*>(workspace);
  float* slices = reinterpret_cast<float*>(filter + pl.filter);
  char* cols = filter + pl.filter + pl.slices;
  char* gemm_ws = cols + pl.cols;
  const size_t eb = ElemBytes(in);
  const int64_t kk = p.k[0], in_pixels = SpatialCount(p.in);
  const Geometry g = GeometryOf(p, pl, in);
  cudaError_t e = cudaSuccess;
  if (const FusedPlan f = MakeFusedPlan(p, in); op == Op::kWgrad && f.splits > 0 && DeviceArch() >= 80) {
    if (workspace_bytes < f.bytes) return cudaErrorNotSupported;
    float* partial = static_cast<float*>(workspace);
    const int rows = static_cast<int>(p.n[0] * p.out[0] * p.out[1]), kk32 = static_cast<int>(kk);
    e = in == DType::kBF16 ? FusedWgrad<true>(g, f, a, b, kk32, rows, partial, s)
                        : FusedWgrad<false>(g, f, a, b, kk32, rows, partial, s);
    if (e != cudaSuccess) return e;
    return ReduceSplits(in, out, partial, f.splits, pl.rows * kk, out_buf, s);  // fixed split order
  }
  // The fused forward reads the filter as 16-byte vectors of output channels.
  if (op == Op::kFwd && out == in && Aligned16(b) && kk % static_cast<int64_t>(16 / eb) == 0 &&
      DeviceArch() >= 80) {
    bool launched = false;
    if ((e = FusedFwd(p, g, in, a, b, bias, out_buf, s, &launched)) != cudaSuccess || launched) return e;
  }
  if (workspace_bytes < pl.bytes()) return cudaErrorNotSupported;
  const void* wmat = b;  // fwd/dgrad: the (cr, K) filter matrix
  if (pl.filter > 0) {
    const size_t real = static_cast<size_t>(pl.rows * kk) * eb;
    if ((e = cudaMemcpyAsync(filter, b, real, cudaMemcpyDeviceToDevice, s)) != cudaSuccess) return e;
    if ((e = cudaMemsetAsync(filter + real, 0, static_cast<size_t>((pl.cr - pl.rows) * kk) * eb, s)) != cudaSuccess) {
      return e;
    }
    wmat = filter;
  }
  for (int64_t i = 0; i < pl.chunks; ++i) {
    const int64_t n0 = i * pl.images, images = std::min(pl.images, p.n[0] - n0);
    const ConvParams q = OneByOne(p, op, images, pl.cr);
    const char* x = static_cast<const char*>(a) + static_cast<size_t>(n0 * in_pixels * p.c[0]) * eb;
    const char* dy = static_cast<const char*>(op == Op::kDgrad ? a : b) +
                     static_cast<size_t>(n0 * pl.pixels * kk) * eb;
    switch (op) {
      case Op::kFwd: {
        if ((e = Im2col(in, g, x, cols, static_cast<int>(images * p.out[0] * p.out[1]), s)) != cudaSuccess) return e;
        char* y = static_cast<char*>(out_buf) + static_cast<size_t>(n0 * pl.pixels * kk) * eb;
        e = ImplicitGemmRun(q, op, in, out, algo, cols, wmat, bias, y, gemm_ws, pl.gemm, s);
        break;
      }
      case Op::kDgrad: {
        if ((e = ImplicitGemmRun(q, op, in, in, algo, dy, wmat, nullptr, cols, gemm_ws, pl.gemm, s)) != cudaSuccess) {
          return e;
        }
        char* dx = static_cast<char*>(out_buf) + static_cast<size_t>(n0 * in_pixels * p.c[0]) * eb;
        e = Col2im(in, g, cols, dx, static_cast<int>(images * in_pixels), s);
        break;
      }
      default: {
        if ((e = Im2col(in, g, x, cols, static_cast<int>(images * p.out[0] * p.out[1]), s)) != cudaSuccess) return e;
        e = ImplicitGemmRun(q, op, in, DType::kF32, algo, cols, dy, nullptr, slices + i * pl.rows * kk, gemm_ws,
                            pl.gemm, s);
      }
    }
    if (e != cudaSuccess) return e;
  }
  if (op != Op::kWgrad) return cudaSuccess;
  return ReduceSplits(in, out, slices, pl.chunks, pl.rows * kk, out_buf, s);  // fixed chunk order
}

}  // namespace cuda
}  // namespace jaxconv
