// depthwise.tma_sm90: the depthwise 3x3 forward (and its unit-stride data gradient) on Hopper (sm_90a builds on a 9.0
// device): channels-last 2-D (a 3-D problem whose D window is 1 folds D into the batch), stride 1 or 2 on both axes, no
// dilation, float32 / bfloat16 / float16 in, float32 accumulation, c * sizeof(T) a multiple of 16 bytes. The family's
// first choice where it applies, before the tensor-core 7x7 (mma.cu) and the register stencil (reg.cu).
//
// Why a second 3x3 kernel: the register stencil loads its source columns itself and then waits on them. On
// MobileNetV2's layers it moved 2.0-3.1 TB/s at about 33 instructions per output element, a
// third of them address arithmetic, zero fills and predicates for the padding, and hiding its load latency by hand
// cost registers that it did not have. Here the tensor memory accelerator brings each tile's source box into shared
// memory, `stages` tiles ahead of the compute: the padding is the box's out-of-bounds fill (zeros), no thread
// computes a global address or waits per load, and the compute loop has no predicates.
//
// Block = one channel tile (CB = 32 or 48 channels, or whole pixels of up to 256 channels; or, for some remainders of
// 4, 8 or 16 channels, that remainder of CB / rem consecutive images) x a persistent sequence of spatial tiles
// (tile_rows x tile_cols destination pixels of one image or image group; BlockRole, TileCursor). Item = (4 channels,
// kTh x kP destination pixels); consumer thread = one item of every tile (its channel vector's 9 filter taps in shared
// memory) which, per source row, reads its L source columns from shared memory once for up to kTh x kP x 3 FMAs.
// Pipeline (warp-specialised): a full (transaction) and an empty barrier per buffer; one lane of the last warp
// issues the boxes, each as soon as every consumer warp has released the buffer's previous tile, so consumer warps
// never wait on each other. The outputs go from registers to global memory (8- or 16-byte stores per pixel).
// Measured on MobileNetV2's 56^2 layers (fwd): 10-20 % faster than the register stencil in bf16, 4-7 % in float32,
// at unit stride and stride 2. ncu of an earlier version: 750 instructions per warp and tile for 288 FFMA,
// issue-bound at 0.55 instructions per scheduler and cycle.
//
// Built only with JAXCONV_IGEMM_SM90 (sm_90a; the TMA instructions do not exist before sm_90); otherwise the variant's
// predicate refuses every problem and its launch returns cudaErrorNotSupported.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/depthwise/plane.h"
#include "kernels/shared/common.cuh"
#include "kernels/shared/kernels.h"

#if defined(JAXCONV_IGEMM_SM90) && JAXCONV_IGEMM_SM90
#define JAXCONV_DW_TMA 1
#include <cuda.h>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cuda_host_adapter.hpp"
#else
#define JAXCONV_DW_TMA 0
#endif

namespace jaxconv {
namespace cuda {

#if JAXCONV_DW_TMA
namespace {

constexpr int kVc = 4;          // channels per item
constexpr int kCb = 32;         // channels per tile (the box's inner extent; CB in the kernel)
constexpr int kCb48 = 48;       // ... for some c that 48 divides and 32 does not (Launch)
constexpr int kK = 3;           // window (kK x kK)
constexpr int kTh = 2, kP = 4;  // destination rows x columns per item
constexpr int kBlockThreads = 256;              // at most: consumer warps and the producer warp
constexpr int kMaxThreads = kBlockThreads - 32;  // consumer threads (items per tile) at most
constexpr int kMaxStages = 4;

struct DwTmaArgs {
  int dst_rows, dst_cols, c;
  int tile_rows, tile_cols;   // destination pixels per tile: row_groups * kTh x strips * kP
  int row_tiles, col_tiles;   // tiles per image
  int tiles;                  // images * row_tiles * col_tiles
  int vt, strips, row_groups;  // per tile: channel vectors (cb / kVc), kP-column strips, kTh-row groups
  int box_cols, box_rows;     // the source box (its rows are box_cols * cb elements apart in shared memory)
  int org_h, org_w;           // the source coordinates of destination (0, 0)'s window (minus the pads)
  int stages;
  unsigned box_bytes, stage_bytes;  // stage_bytes: box_bytes rounded up to 128 (the TMA destination's alignment)
  int flip, act, has_bias;
  int64_t dst_img;            // elements per destination image (< 2^31, checked on the host)
  // Blocks: gf per whole-image channel tile (cf of them, the last maybe partial), then gp for the packed remainder
  // tiles (Launch): its rem channels (4, 8 or 16) of pack = kCb / rem consecutive images share one box.
  int n, cf, gf, gp, rem, pack, pack_tiles;
  int cb;                     // channels per tile: the kernel's CB, or c (CB == 0: whole pixels)
};

// A block's channel tile and its share of that tile's spatial tiles (block bx of blocks, each taking every
// blocks-th tile). The packed tile's spatial tiles are those of image groups, not of images.
struct BlockRole {
  bool packed;
  int ctile, bx, blocks, tiles, pack;  // pack: images per spatial tile (1 unless packed)
  __device__ explicit BlockRole(const DwTmaArgs& g) {
    const int b = static_cast<int>(blockIdx.x);
    packed = b >= g.cf * g.gf;
    ctile = packed ? g.cf : b / g.gf;
    bx = packed ? b - g.cf * g.gf : b % g.gf;
    blocks = packed ? g.gp : g.gf;
    tiles = packed ? g.pack_tiles : g.tiles;
    pack = packed ? g.pack : 1;
  }
  // Channel vector vv's first channel and its image within the group (0 unless packed); the box holds, per pixel,
  // pack runs of rem channels, so vector vv covers elements vv * kVc... of a kCb-element pixel.
  __device__ int Channel(const DwTmaArgs& g, int vv, int cb) const {
    return packed ? g.c - g.rem + vv * kVc % g.rem : ctile * cb + vv * kVc;
  }
  __device__ int Image(const DwTmaArgs& g, int vv) const { return packed ? vv * kVc / g.rem : 0; }
};

// The block's tiles bx + i * blocks, i = 0, 1, ..., as (image or image group n, tile row tr, tile column tc) with
// their buffer (stage s, barrier phase), stepped without dividing. The producer lane and every consumer thread walk
// the same sequence.
struct TileCursor {
  int tile, tiles, step, n, tr, tc, dn, dtr, dtc, s = 0, phase = 0;
  __device__ TileCursor(const DwTmaArgs& g, const BlockRole& r)
      : tile(r.bx),
        tiles(r.tiles),
        step(r.blocks),
        n(r.bx / g.col_tiles / g.row_tiles),
        tr(r.bx / g.col_tiles % g.row_tiles),
        tc(r.bx % g.col_tiles),
        dn(r.blocks / g.col_tiles / g.row_tiles),
        dtr(r.blocks / g.col_tiles % g.row_tiles),
        dtc(r.blocks % g.col_tiles) {}
  __device__ bool valid() const { return tile < tiles; }
  __device__ void next(const DwTmaArgs& g) {
    tile += step;
    if (++s == g.stages) s = 0, phase ^= 1;
    tc += dtc;
    tr += dtr;
    n += dn;
    if (tc >= g.col_tiles) tc -= g.col_tiles, ++tr;
    if (tr >= g.row_tiles) tr -= g.row_tiles, ++n;
  }
};

// p + i elements for an unsigned 32-bit i, by PTX mad.wide.u32 (two SASS instructions): left to itself nvcc adds i to
// the 64-bit element offset p was made from and scales the sum, four instructions per store.
template <class U> __device__ __forceinline__ U* OffsetU32(U* p, uint32_t i) {
  uint64_t r;
  asm("mad.wide.u32 %0, %1, %2, %3;"
      : "=l"(r)
      : "r"(i), "r"(static_cast<uint32_t>(sizeof(U))), "l"(reinterpret_cast<uint64_t>(p)));
  return reinterpret_cast<U*>(r);
}

// Launch bounds: two blocks per SM (at most 128 registers). Capped for three, 80 registers spilled and the 56^2 bf16
// forward was 19 % slower; uncapped, the stride-2 kernels took 135-147 registers and the stride-2 bf16 forward was 17 %
// slower.
template <class T, class TO, int S, int CB>
__global__ void __launch_bounds__(kBlockThreads, 2)
    DwTmaKernel(const __grid_constant__ CUtensorMap src_map, const __grid_constant__ CUtensorMap pack_map,
                const DwTmaArgs g, const T* __restrict__ w,
                const void* __restrict__ bias, TO* __restrict__ dst) {
  using Full = cutlass::arch::ClusterTransactionBarrier;
  using Empty = cutlass::arch::ClusterBarrier;
  constexpr int L = (kP - 1) * S + kK;   // source columns per item
  constexpr int R = (kTh - 1) * S + kK;  // source rows per item
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + g.stages * g.stage_bytes);
  uint64_t* empty = full + kMaxStages;
  float4* fsm = reinterpret_cast<float4*>(empty + kMaxStages);  // the filter slice, [tap][vt]
  const int cb = CB ? CB : g.cb;  // CB == 0: whole pixels (cb = c)
  const int items = g.vt * g.strips * g.row_groups;
  const int cwarps = (items + 31) / 32;  // consumer warps; warp cwarps is the producer
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BlockRole role(g);

  for (int i = threadIdx.x; i < kK * kK * g.vt; i += blockDim.x) {
    const int tap = i / g.vt, vv = i - tap * g.vt;
    const int ch = role.Channel(g, vv, cb);
    float f[kVc] = {0.f, 0.f, 0.f, 0.f};
    if (ch < g.c) LdGlobalAcc<T, float, kVc>(w + static_cast<int64_t>(g.flip ? kK * kK - 1 - tap : tap) * g.c + ch, f);
    fsm[i] = make_float4(f[0], f[1], f[2], f[3]);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < g.stages; ++s) {
      Full::init(&full[s], 1);
      Empty::init(&empty[s], cwarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp == cwarps) {  // producer: one lane issues the boxes, `stages` tiles ahead of the slowest consumer warp
    if (lane == 0) {
      const CUtensorMap* map = role.packed ? &pack_map : &src_map;
      cute::prefetch_tma_descriptor(map);
      constexpr auto kHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
      for (TileCursor cur(g, role); cur.valid(); cur.next(g)) {
        // The buffer's previous tile released (passes at once the first round).
        Empty::wait(&empty[cur.s], cur.phase ^ 1);
        Full::arrive_and_expect_tx(&full[cur.s], g.box_bytes);
        void* buf = smem + cur.s * g.stage_bytes;
        const int x = cur.tc * g.tile_cols * S + g.org_w, y = cur.tr * g.tile_rows * S + g.org_h;
        if (role.packed) {  // (channel, image, column, row): see EncodeSource
          cute::SM90_TMA_LOAD_4D::copy(map, &full[cur.s], kHint, buf, g.c - g.rem, cur.n * role.pack, x, y);
        } else {
          cute::SM90_TMA_LOAD_4D::copy(map, &full[cur.s], kHint, buf, role.ctile * cb, x, y, cur.n);
        }
      }
    }
    return;
  }

  // Consumer: this thread's item of every tile (fixed: its channel vector, strip and row group).
  const int v = threadIdx.x % g.vt;
  const bool active = threadIdx.x < items;
  const int rest = threadIdx.x / g.vt;
  const int strip = rest % g.strips, rg = rest / g.strips;
  const int ch = role.Channel(g, v, cb), img = role.Image(g, v);
  const bool live = active && ch < g.c;  // the last channel tile may be partial (its box reads zeros past c)
  float b[kVc] = {0.f, 0.f, 0.f, 0.f};
  if (live && g.has_bias) {
#pragma unroll
    for (int i = 0; i < kVc; ++i) {
      b[i] = std::is_same<TO, float>::value ? static_cast<const float*>(bias)[ch + i]
                                            : ToAcc(static_cast<const T*>(bias)[ch + i]);
    }
  }
  const int ioff = (rg * kTh * S * g.box_cols + strip * kP * S) * cb + v * kVc;  // elements into the box
  const int row_elems = g.box_cols * cb;
  const float4* wv = fsm + v;
  // Instructions count here (ncu, MobileNetV2 56^2 bf16 forward: 714 warp instructions per consumer warp and
  // tile for 288 FFMA; 40 % of the stall samples were issue-slot waits, selected or not selected). So the bias is the
  // first FMA's addend (it had cost 32 moves per tile), whole items store without per-pixel checks, and each store
  // address is one 32-bit offset from a per-tile pointer.
  // Destination offsets: rows kTh apart by row_c elements, pixels by c, within a destination image (< 2^31).
  const int row_c = g.dst_cols * g.c;
  for (TileCursor cur(g, role); cur.valid(); cur.next(g)) {
    float acc[kTh][kP][kVc];  // each starts as its first product plus the bias (no separate initialisation)
    Full::wait(&full[cur.s], cur.phase);
    if (active) {
      const T* ib = reinterpret_cast<const T*>(smem + cur.s * g.stage_bytes) + ioff;
#pragma unroll
      for (int m = 0; m < R; ++m) {
        // The row's L vectors as raw words first, then unpacked: all loads ahead of the first FMA.
        using Raw = std::conditional_t<sizeof(T) * kVc == 16, uint4, uint2>;
        Raw raw[L];
#pragma unroll
        for (int l = 0; l < L; ++l) raw[l] = *reinterpret_cast<const Raw*>(ib + m * row_elems + l * cb);
        float sv[L][kVc];
        UnpackVectors<T>(raw, sv);
#pragma unroll
        for (int j = 0; j < kTh; ++j) {
          const int r = m - j * S;  // the window row joining source row m to destination row j
          if (r < 0 || r >= kK) continue;
#pragma unroll
          for (int t = 0; t < kK; ++t) {
            const float4 f4 = wv[(r * kK + t) * g.vt];
            const float f[kVc] = {f4.x, f4.y, f4.z, f4.w};
            const bool first = r == 0 && t == 0;  // known at compile time once unrolled
#pragma unroll
            for (int p = 0; p < kP; ++p)
#pragma unroll
              for (int i = 0; i < kVc; ++i) {
                acc[j][p][i] = fmaf(f[i], sv[p * S + t][i], first ? b[i] : acc[j][p][i]);
              }
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) Empty::arrive(&empty[cur.s]);  // this warp is done with the buffer
    const int n = cur.n * role.pack + img;  // the last group of packed images may be short (zeros read)
    if (live && n < g.n) {
      const int y0 = cur.tr * g.tile_rows + rg * kTh, x0 = cur.tc * g.tile_cols + strip * kP;
      TO* d = dst + n * g.dst_img + ch;
      const int o = (y0 * g.dst_cols + x0) * g.c;
      // Whole items (all but the image's last row or column tile) store without per-pixel checks.
      const auto store = [&](auto act_c, auto whole_c) {
        constexpr int kAct = decltype(act_c)::value;
#pragma unroll
        for (int j = 0; j < kTh; ++j) {
#pragma unroll
          for (int p = 0; p < kP; ++p) {
            if (!decltype(whole_c)::value && (y0 + j >= g.dst_rows || x0 + p >= g.dst_cols)) continue;
            float out[kVc];
#pragma unroll
            for (int i = 0; i < kVc; ++i) out[i] = Activate(acc[j][p][i], kAct);
            StGlobal<TO, float, kVc>(OffsetU32(d, o + j * row_c + p * g.c), out);
          }
        }
      };
      const bool whole = y0 + kTh <= g.dst_rows && x0 + kP <= g.dst_cols;
      WithActivation(g.act, [&](auto act_c) {
        if (whole) {
          store(act_c, std::true_type{});
        } else {
          store(act_c, std::false_type{});
        }
      });
    }
  }
}

// The problem as the kernel sees it (plane.h): 3x3, the same stride 1 or 2 on both axes (the data gradient:
// unit stride, as the flipped forward), c * sizeof(T) a multiple of 16 bytes (the box's rows).
bool MakeTmaProblem(const ConvParams& p, Op op, DType in, DwPlane* tp) {
  DwPlane t;
  if (op == Op::kWgrad || !DwPlaneOf(p, op, &t)) return false;
  const int64_t esize = in == DType::kF32 ? 4 : 2;
  if ((t.c * esize) % 16 != 0 || t.kh != kK || t.kw != kK || t.sh != t.sw || (t.sh != 1 && t.sh != 2)) return false;
  if (op == Op::kDgrad && !t.flip) return false;
  // 32-bit offsets within a destination image; the tensor map's coordinates are 32-bit too.
  // Tile indices (at most the destination pixels) in 32 bits with room for the persistent grid's steps.
  if (t.dst_rows * t.dst_cols * t.c > INT32_MAX || t.src_rows * t.src_cols * t.c > INT32_MAX ||
      t.n * t.dst_rows * t.dst_cols > INT32_MAX / 2) {
    return false;
  }
  *tp = t;
  return true;
}

// Tile shape. A consumer thread takes one item, so a tile has at most kMaxThreads items; its box is at most 36 KiB
// (16-bit) or 48 KiB (float32). Among the (strips, row groups) that fit: tiles of at least 128 items first (fewer
// only where none fits, as for float32 at stride 2: a quarter of the outputs per box byte), then the fewest box
// pixels per destination pixel (the halo, and the columns past the image in the last column tile). Buffers: two to
// four within 72 KiB (16-bit: up to three blocks per SM, resident warps for the unpacking) or 150 KiB (float32: bytes
// in flight). Measured: bf16 at stride 2 18 % faster with boxes within 36 KiB than within 48; float32 at stride 2
// 2 % faster with three 47 KiB buffers than with two.
struct TmaPlan {
  DwTmaArgs a{};
  int threads = 0;
  size_t smem = 0;
  double cost = 0.0;  // box pixels per destination pixel (times S^2)
};

TmaPlan MakePlan(const DwPlane& t, size_t esize, int cb) {
  const size_t max_box = esize == 2 ? 36 * 1024 : 48 * 1024, budget = esize == 2 ? 72 * 1024 : 150 * 1024;
  const int S = static_cast<int>(t.sh), vt = cb / kVc;
  const int64_t all_strips = CeilDiv(t.dst_cols, kP), all_groups = CeilDiv(t.dst_rows, kTh);
  int best_ns = 1, best_rg = 1, best_items = 0;
  double best_cost = 0.0;
  for (int64_t max_ns = std::min<int64_t>(all_strips, kMaxThreads / vt); max_ns >= 1; --max_ns) {
    const int ns = static_cast<int>(CeilDiv(all_strips, CeilDiv(all_strips, max_ns)));  // balanced column tiles
    if (ns != max_ns) continue;
    const int64_t box_cols = (ns * kP - 1) * S + kK;
    if (box_cols > 256) continue;  // a box extent's limit
    const int64_t col_tiles = CeilDiv(t.dst_cols, ns * kP);
    for (int rg = 1; rg <= all_groups && vt * ns * rg <= kMaxThreads; ++rg) {
      const int64_t box_rows = (rg * kTh - 1) * S + kK;
      if (static_cast<size_t>(box_rows * box_cols * cb) * esize > max_box) break;
      const int64_t row_tiles = CeilDiv(t.dst_rows, rg * kTh);
      // box pixels over destination pixels (times S^2: each destination pixel needs S^2 source pixels)
      const double cost = static_cast<double>(box_rows * box_cols * row_tiles * col_tiles) /
                          (static_cast<double>(t.dst_rows * t.dst_cols) * S * S);
      const int items = vt * ns * rg;
      const bool big = items >= 128, best_big = best_items >= 128;
      if (best_items == 0 || (big && !best_big) || (big == best_big && (big ? cost < best_cost : items > best_items))) {
        best_ns = ns, best_rg = rg, best_items = items, best_cost = cost;
      }
    }
  }
  TmaPlan pl;
  pl.cost = best_cost;
  DwTmaArgs& a = pl.a;
  a.dst_rows = static_cast<int>(t.dst_rows);
  a.dst_cols = static_cast<int>(t.dst_cols);
  a.c = static_cast<int>(t.c);
  a.vt = vt;
  a.strips = best_ns;
  a.row_groups = best_rg;
  a.tile_cols = best_ns * kP;
  a.tile_rows = best_rg * kTh;
  a.box_cols = (a.tile_cols - 1) * S + kK;
  a.box_rows = (a.tile_rows - 1) * S + kK;
  a.box_bytes = static_cast<unsigned>(static_cast<size_t>(a.box_rows) * a.box_cols * cb * esize);
  a.stage_bytes = static_cast<unsigned>(CeilDiv(a.box_bytes, 128) * 128);
  a.stages = static_cast<int>(std::max<size_t>(2, std::min<size_t>(kMaxStages, budget / a.stage_bytes)));
  a.row_tiles = static_cast<int>(CeilDiv(t.dst_rows, a.tile_rows));
  a.col_tiles = static_cast<int>(CeilDiv(t.dst_cols, a.tile_cols));
  a.tiles = static_cast<int>(t.n * a.row_tiles * a.col_tiles);
  a.org_h = static_cast<int>(-t.ph);
  a.org_w = static_cast<int>(-t.pw);
  a.flip = t.flip;
  a.dst_img = t.dst_rows * t.dst_cols * t.c;
  a.cb = cb;
  pl.threads = static_cast<int>(CeilDiv(vt * a.strips * a.row_groups, 32) * 32 + 32);  // consumers + producer warp
  pl.smem = static_cast<size_t>(a.stages) * a.stage_bytes + 2 * kMaxStages * sizeof(uint64_t) +
            kK * kK * vt * sizeof(float4);
  return pl;
}

// The source as a 4-D tensor (c, cols, rows, images), box (cb, box_cols, box_rows, 1); out-of-bounds elements read
// as zero. For the packed remainder tiles (rem > 0) the dimensions are ordered (c, images, cols, rows) and the box is
// (rem, pack, box_cols, box_rows): in shared memory each pixel's pack runs of rem channels, one per image, sit where a
// whole tile's kCb channels would, so the consumer reads the box as it reads any other. Images past n read as zero.
cudaError_t EncodeSource(const DwPlane& t, const DwTmaArgs& a, int cb, int rem, DType in, const void* src,
                         CUtensorMap* map) {
  const size_t esize = in == DType::kF32 ? 4 : 2;
  const CUtensorMapDataType dtype = in == DType::kF32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                    : in == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // One entry per tensor dimension: its extent, its stride in bytes and the box's extent along it.
  struct Dim {
    int64_t size, stride, box;
  };
  const int64_t pix = t.c * static_cast<int64_t>(esize), row = t.src_cols * pix;
  const Dim ch{t.c, static_cast<int64_t>(esize), rem ? rem : cb}, cols{t.src_cols, pix, a.box_cols},
      rows{t.src_rows, row, a.box_rows}, imgs{t.n, t.src_rows * row, rem ? cb / rem : 1};
  const Dim whole[4] = {ch, cols, rows, imgs}, packed[4] = {ch, imgs, cols, rows};
  const Dim* order = rem ? packed : whole;
  cuuint64_t dims[4], strides[3];  // strides of dimensions 1-3 (dimension 0's elements are contiguous)
  cuuint32_t box[4];
  for (int i = 0; i < 4; ++i) {
    dims[i] = static_cast<cuuint64_t>(order[i].size);
    box[i] = static_cast<cuuint32_t>(order[i].box);
    if (i > 0) strides[i - 1] = static_cast<cuuint64_t>(order[i].stride);
  }
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, dtype, 4, const_cast<void*>(src), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Blocks per channel tile. Every block is resident at once and walks its tiles in rounds. A remainder of rem
// channels (4, 8 or 16: rem divides kCb) would take a whole channel tile per image with kCb - rem of every 32 lanes
// idle, as many rounds as a whole tile. Packing kCb / rem images' remainders into one box shrinks that tile's rounds
// by as much: the blocks are shared out so both kinds of tile need the fewest rounds.
void ShareBlocks(int64_t resident, int64_t ctiles, DwTmaArgs* a) {
  const bool packed = a->rem > 0;
  const int64_t tiles = a->tiles, pack_tiles = a->pack_tiles;
  const int64_t cf = packed ? ctiles - 1 : ctiles;
  if (!packed) {
    a->cf = static_cast<int>(cf), a->gf = static_cast<int>(std::max<int64_t>(1, std::min(tiles, resident / cf)));
    a->gp = 0;
    return;
  }
  // The fewest rounds whose blocks are all resident (if none are, as for thousands of channels, one tile per block).
  const int64_t most = std::max(tiles, pack_tiles);
  int64_t rounds = std::min(most, CeilDiv(cf * tiles + pack_tiles, resident));
  while (rounds < most && cf * CeilDiv(tiles, rounds) + CeilDiv(pack_tiles, rounds) > resident) ++rounds;
  a->cf = static_cast<int>(cf);
  a->gf = static_cast<int>(CeilDiv(tiles, rounds));
  a->gp = static_cast<int>(CeilDiv(pack_tiles, rounds));
}

template <class T, class TO>
cudaError_t Launch(const DwPlane& t, int act, bool has_bias, DType in, const void* src, const void* w,
                   const void* bias, void* dst, cudaStream_t s) {
  // 48-channel tiles where 48 divides c and 32 does not, at stride 2 or as the only tile. Measured (bf16 / float32
  // HIGHEST fwd, 48 against 32, 56^2 b32): 144 channels at stride 2 and 48 channels 6-19 % faster; but at unit stride
  // 144 channels and 28^2 x 240 channels up to 5 % slower (more halo per output: 12 channel vectors leave room for at
  // most 18 pixel items in a tile). Where 32 also divides c, stride 2 was mixed (112^2 x 96 slower).
  int cb = t.c % kCb != 0 && t.c % kCb48 == 0 && (t.sh == 2 || t.c == kCb48) ? kCb48 : kCb;
  // A remainder that divides the tile, over more than one image, after at most two whole tiles takes the packed
  // tile (ShareBlocks). Measured (56^2 b32 unless named, bf16 / float32 HIGHEST fwd, packed against not): 40 and 80
  // channels up to 12 % faster, 16 channels 26-28 % faster; but 144 channels and 28^2 x 240 within a few per cent
  // either way, float32 up to 6 % slower in the data gradient: the rounds it saves (8 against 9 for 144) are not what
  // bounds those layers.
  const int rem = static_cast<int>(t.c % kCb);
  const bool packed = cb == kCb && t.n > 1 && t.c / kCb <= 2 &&
                      (rem == 4 || rem == 8 || rem == 16) && rem * sizeof(T) % 16 == 0;
  TmaPlan pl = MakePlan(t, sizeof(T), cb);
  // Whole pixels (one channel tile of c <= 256 channels; each box row one contiguous run, each source byte read by one
  // block) where the channel tiles would leave a partial last one: the partial tile costs as much as a full one, and
  // the tiles' blocks read parts of the same 128-byte lines at different times (at 112^2 x 144, beyond L2, the
  // 32-channel tiles moved 2.3 TB/s and whole pixels 3.4). But a whole-pixel tile is fewer pixels (at most 224 items
  // of c / 4 channel vectors), so more halo per output: taken where it reads at most 1.1x the box pixels per output
  // of the channel tiles, or at most 1.35x when the source (16 MiB or more) does not stay in L2 between the tiles'
  // blocks. Measured (fwd, whole against 32-channel tiles; bf16, float32 HIGHEST): 32 x 56^2 with 24 to 144 channels
  // (1.0-1.33x the box pixels) 2-24 % faster, 32 x 112^2 x 144 (1.32x) 27-34 % faster; but 32 x 28^2 x 144 (1.31x;
  // a source that stays in L2) and 1 x 56^2 x 144 5-10 % slower.
  bool whole = false;
  if (t.c % cb != 0 && t.c <= 256 && !packed) {
    const TmaPlan wp = MakePlan(t, sizeof(T), static_cast<int>(t.c));
    const double src_bytes = static_cast<double>(t.n * t.src_rows * t.src_cols * t.c) * sizeof(T);
    const double halo = wp.cost / pl.cost;
    const bool beyond_l2 = src_bytes >= 16.0 * (1 << 20);
    if (wp.a.vt * wp.a.strips * wp.a.row_groups >= 128 && (halo <= 1.1 || (halo <= 1.35 && beyond_l2))) {
      pl = wp, whole = true, cb = static_cast<int>(t.c);
    }
  }
  DwTmaArgs& a = pl.a;
  a.act = act;
  a.has_bias = has_bias;
  a.n = static_cast<int>(t.n);
  a.rem = packed ? rem : 0;
  a.pack = packed ? kCb / rem : 1;
  a.pack_tiles = packed ? static_cast<int>(CeilDiv(t.n, a.pack) * a.row_tiles * a.col_tiles) : 0;
  CUtensorMap map, pack_map;
  if (const cudaError_t e = EncodeSource(t, a, cb, 0, in, src, &map); e != cudaSuccess) return e;
  if (!packed) {
    pack_map = map;  // unused
  } else if (const cudaError_t e = EncodeSource(t, a, cb, a.rem, in, src, &pack_map); e != cudaSuccess) {
    return e;
  }
  const int64_t ctiles = CeilDiv(t.c, cb);
  auto go = [&](auto kern) {
    if (const cudaError_t e = AllowDynamicSmem(kern, pl.smem); e != cudaSuccess) return e;
    int64_t resident = 0;
    if (const cudaError_t e = ResidentBlocks(kern, pl.threads, pl.smem, 1, &resident); e != cudaSuccess) return e;
    ShareBlocks(resident, ctiles, &a);
    const int64_t grid = static_cast<int64_t>(a.cf) * a.gf + a.gp;
    kern<<<static_cast<unsigned>(grid), pl.threads, pl.smem, s>>>(map, pack_map, a, static_cast<const T*>(w), bias,
                                                                  static_cast<TO*>(dst));
    return cudaGetLastError();
  };
  if (whole) return t.sh == 1 ? go(DwTmaKernel<T, TO, 1, 0>) : go(DwTmaKernel<T, TO, 2, 0>);
  if (cb == kCb48) return t.sh == 1 ? go(DwTmaKernel<T, TO, 1, kCb48>) : go(DwTmaKernel<T, TO, 2, kCb48>);
  return t.sh == 1 ? go(DwTmaKernel<T, TO, 1, kCb>) : go(DwTmaKernel<T, TO, 2, kCb>);
}

// The problem as the kernel sees it for pr, or why the kernel does not take it.
std::string TmaError(const Problem& pr, DwPlane* t) {
  if (!DepthwiseApplies(pr.p)) return "it takes depthwise convolutions (groups == c == k, batch_groups == 1)";
  if (pr.dev.arch != 90) return "it needs a compute capability 9.0 device";
  if (!IsF32AccPair(pr.in, pr.out) || !MakeTmaProblem(pr.p, pr.op, pr.in, t)) {
    return "it takes channels-last 2-D 3x3 windows at equal strides of 1 or 2 (data gradients: 1), no dilation, c a "
           "multiple of 16 bytes";
  }
  return {};
}

}  // namespace
#endif  // JAXCONV_DW_TMA

}  // namespace cuda

namespace variants::depthwise_tma_sm90 {

#if JAXCONV_DW_TMA
std::string Applies(const Problem& pr) {
  cuda::DwPlane t;
  return cuda::TmaError(pr, &t);
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  cuda::DwPlane t;
  if (!cuda::TmaError(pr, &t).empty()) return cudaErrorNotSupported;
  const bool fwd = pr.op == Op::kFwd;
  const void* bias = fwd && pr.p.has_bias[0] ? b.bias : nullptr;
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b) || !cuda::Aligned16(b.out) ||
      (bias != nullptr && !cuda::Aligned16(bias))) {
    return cudaErrorMisalignedAddress;
  }
  const int act = fwd ? static_cast<int>(pr.p.activation[0]) : kActNone;
  return cuda::WithF32AccTypes(pr.in, pr.out, [&](auto ti, auto to) {
    using T = decltype(ti);
    using TO = decltype(to);
    return cuda::Launch<T, TO>(t, act, bias != nullptr, pr.in, b.a, b.b, bias, b.out, s);
  });
}
#else
std::string Applies(const Problem&) { return "jaxconv was built without sm_90a kernels"; }

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem&, const Buffers&, cudaStream_t) { return cudaErrorNotSupported; }
#endif

}  // namespace variants::depthwise_tma_sm90
}  // namespace jaxconv
