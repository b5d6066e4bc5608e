// implicit_gemm.im2col_fused_wgrad: the filter gradient of 16-bit first layers (im2col.cuh) in one fused kernel,
// the unrolled window never in memory.
// dw[j, k] = sum over output pixels m of cols[m, j] * dy[m, k]. Why: the chunked route wrote and re-read cols,
// taps*c/c times the size of x (49x for a 7x7 stem), and took 1.6x lax's time on ResNet's stem at batch 128. A block
// owns one (JT-column tile of j, kFwK block of k) and a strided range of pixel tiles (the unroll kernel's: qt <=
// kFwPix pixels of one output row). Per tile it stages the x patch, the tile's dy rows and its cols in shared memory
// and runs mma.sync m16n8k16 with f32 accumulators that stay in registers across all its tiles; at the end it writes
// its partial filter into slice blockIdx.x of the workspace, and ReduceSplits sums the slices in order
// (deterministic).
#include <algorithm>
#include <string>

#include "dispatch/variant.h"
#include "kernels/implicit_gemm/im2col.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kFwPix = 64;      // pixels per tile: the MMA's reduction depth per tile
constexpr int kFwK = 64;        // output channels per block
// kFwThreads (im2col.cuh): 4 warps, 2 along k (32 channels each) x 2 along j (JT / 2 columns each)
constexpr int kFwMaxJt = 160;   // a 7x7 stem's 147 columns in one tile
constexpr int kFwDyLd = kFwK + 8;  // smem row strides padded by 16 bytes: conflict-free ldmatrix
constexpr int kFwDyWords = kFwPix * kFwK / 8 / kFwThreads;  // 16-byte dy words per thread and tile
__host__ __device__ constexpr int FwColsLd(int jt) { return jt + 8; }

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

}  // namespace
}  // namespace cuda

namespace variants::implicit_gemm_im2col_fused_wgrad {

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::Im2colError(pr); !why.empty()) return why;
  if (pr.dev.arch < 80) return "the mma.sync kernels need sm_80 or newer";
  if (cuda::MakeFusedPlan(pr.p, pr.in).splits == 0) return "it takes 16-bit operands within its grid and slice limits";
  return {};
}

size_t Workspace(const Problem& pr) { return cuda::MakeFusedPlan(pr.p, pr.in).bytes; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const ConvParams& p = pr.p;
  const cuda::FusedPlan f = cuda::MakeFusedPlan(p, pr.in);
  if (f.splits == 0) return cudaErrorNotSupported;
  if (b.ws == nullptr || b.ws_bytes < f.bytes) return cudaErrorInvalidValue;
  if (!cuda::Aligned16(b.b)) return cudaErrorMisalignedAddress;  // dy as 16-byte words
  const cuda::Geometry g = cuda::GeometryOf(p, pr.in);
  float* partial = static_cast<float*>(b.ws);
  const int rows = static_cast<int>(p.n[0] * p.out[0] * p.out[1]), kk32 = static_cast<int>(p.k[0]);
  const cudaError_t e = pr.in == DType::kBF16 ? cuda::FusedWgrad<true>(g, f, b.a, b.b, kk32, rows, partial, s)
                                              : cuda::FusedWgrad<false>(g, f, b.a, b.b, kk32, rows, partial, s);
  if (e != cudaSuccess) return e;
  return cuda::ReduceSplits(pr.in, pr.out, partial, f.splits, g.rows * p.k[0], b.out, s);  // fixed split order
}

}  // namespace variants::implicit_gemm_im2col_fused_wgrad
}  // namespace jaxconv
