// depthwise.mma: the depthwise 7x7 forward, unit-stride data gradient and (below, "the filter gradient") filter
// gradient on tensor cores (mma.sync, sm_80+): channels-last 2-D (a 3-D problem whose D window is 1 folds D into the
// batch), bfloat16 / float16 in, float32 accumulation, stride 1, no dilation, c a multiple of 8. The table tries it
// after the Hopper 3x3 kernel (tma_sm90.cu) and before the register stencil (reg.cu); for the filter gradient first.
//
// Why: the register stencil spends an FFMA per output and tap; on ConvNeXt's 7x7 layer (56^2 x 96, b32) it ran at
// 3.0x its FP32-FMA floor. A window row is a Toeplitz matrix product,
//   out[x0 + n] = sum_k src[x0 + k] T[k][n],  T[k][n] = w[k - n] (zero unless 0 <= k - n < K),
// so one mma.sync m16n8k16 gives 16 "slots" x 8 destination columns from 16 source columns and one window row;
// K / 16 of its products count. Slot (image m, row group i, column block j) of a tile is the destination rows K i + e
// (e < K) and columns 8 j + n of image m. With the row groups K apart, one A tile (source rows K i + s of 16 slots)
// serves every (e, dy) with e + dy = s: 2K - 1 ldmatrix.x4 and K^2 MMAs per channel and M tile of 16 slots.
// Data: a block owns 16 channels (one 32-byte sector per pixel) of one tile. Its source goes from channels-last
// global memory into one shared-memory plane per channel (pixel pairs transposed in registers); the destinations come
// back through planes as channels-last 16-byte vectors.
// Non-finite data: a zero of T times an inf or NaN in a neighbouring column is NaN where the window's sum need not
// be, so a warp with a non-finite output recomputes its outputs with FMAs over the real taps.
// Measured against the register stencil (bf16 fwd; float16 and the data gradients alike): 1.3-1.9x faster on
// ConvNeXt-T's 7x7 layers at b32 (56^2 x 96 to 7^2 x 768) and 1.5x at b1, about twice lax on 56^2 x 96. The kernel is
// written for any K <= 9, but 5x5 lost to the register stencil (a third of the MMA products count, and the staging
// costs what it costs at 7x7), so only K = 7 is built.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/depthwise/plane.h"
#include "kernels/shared/common.cuh"
#include "kernels/shared/kernels.h"
#include "kernels/shared/mma.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kCt = 16;         // channels per block
constexpr int kSlots = 16;      // the MMA's M: slots per M tile
constexpr int kFiltRow = 64;    // 16-bit elements per (channel, window row): two copies of 32 (FilterRows)
constexpr size_t kMaxSmem = 100 * 1024;  // at least two blocks per SM

struct DwMmaArgs {
  int64_t n;                   // images
  int c, src_rows, src_cols, dst_rows, dst_cols;
  int ph, pw;                  // pads on the source's low side
  int nimg, ri, xj;            // a tile: nimg images x ri row groups (K rows each) x xj column blocks (8 columns)
  int slots, mtiles;           // nimg * ri * xj slots in mtiles M tiles of 16 (the last padded with dummies)
  int ty, tx;                  // destination rows / columns per image of a tile: K ri, 8 xj
  int sr, sc, pitch;           // source rows / columns per image (ty + K - 1, tx + 8); a plane row's pitch (elements)
  int plane;                   // elements per source plane: nimg * sr * pitch
  int out_plane;               // TO elements between two channels' destination planes (nimg * ty rows of tx)
  int out_offset, filt_offset, table_offset;  // bytes into shared memory (the destination planes alias the
                                              // source's where they fit)
  int row_tiles, col_tiles, ctiles;
  int flip, act, has_bias;
};

// The filter rows of the block's channels in shared memory, flipped for the data gradient: row (channel, dy) holds
// w[dy][k - 8] at element k of its first copy and w[dy][k - 7] at element k of its second, zero elsewhere. A lane's
// B fragment wants the pairs (w[a], w[a + 1]) and (w[a + 8], w[a + 9]) with a = 2 (lane % 4) - lane / 4: in the first
// copy they start at an even element when lane / 4 is even, in the second when it is odd, so both are aligned
// 32-bit words (FragmentWord).
template <class T, int K>
__device__ __forceinline__ void FilterRows(const DwMmaArgs& g, const T* __restrict__ w, int c0, uint4* filt) {
  for (int e = threadIdx.x; e < kCt * K; e += kThreads) {
    const int cl = e % kCt, dy = e / kCt, ch = c0 + cl;
    unsigned short tap[K];
#pragma unroll
    for (int dx = 0; dx < K; ++dx) {
      const int t = g.flip ? K * K - 1 - (dy * K + dx) : dy * K + dx;
      tap[dx] = ch < g.c ? __ldg(reinterpret_cast<const unsigned short*>(w) + static_cast<int64_t>(t) * g.c + ch) : 0;
    }
#pragma unroll
    for (int copy = 0; copy < 2; ++copy) {
      unsigned wd[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        unsigned v = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int dx = 2 * i + h - 8 + copy;
          if (dx >= 0 && dx < K) v |= static_cast<unsigned>(tap[dx]) << (16 * h);
        }
        wd[i] = v;
      }
      uint4* row = filt + (cl * K + dy) * (kFiltRow / 8) + copy * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) row[i] = make_uint4(wd[4 * i], wd[4 * i + 1], wd[4 * i + 2], wd[4 * i + 3]);
    }
  }
}

// The 32-bit word of a filter row holding this lane's b0 pair; b1's is 4 words on.
__device__ __forceinline__ int FragmentWord(int lane) {
  const int grp = lane / 4, a = 2 * (lane % 4) - grp, parity = grp & 1;
  return parity * 16 + (a + 8 - parity) / 2;
}

// A tile of a channels-last tensor (16 channels from c0, one 32-byte sector per pixel) staged as one shared-memory
// plane per channel (channel k's at planes + k * plane): image m < nimg of the tile (n0 + m < n), its rows sy0..
// sy0 + sr - 1 and columns sx0.. sx0 + sc - 1 (sc even), zero outside the tensor and past c. Plane row r of image m
// starts at word (m sr + r) pitch. kOverlap false: word j holds columns (2j, 2j + 1); true (the filter gradient's
// source): word i holds columns (i, i + 1), so that the pair starting at any column is one aligned 32-bit word. A
// thread takes column pairs (2j, 2j + 1), plus column 2j + 2 when overlapping: two 16-byte loads per pixel, whose
// 16-bit channel values it pairs across the pixels into 32-bit words, one store per channel (two adjacent words when
// overlapping). The loads of kBatch pairs are issued before their stores, to keep several in flight per thread.
struct StageGeom {
  int64_t n;          // images in the tensor
  int c, rows, cols;  // its channels, rows, columns
  int nimg, sr, sc;   // the tile: images x rows x columns
  int pitch, plane;   // 32-bit words per plane row and per plane
};

template <class T, bool kOverlap, int kNT>
__device__ __forceinline__ void StageTile(const StageGeom& s, const T* __restrict__ src, int64_t n0, int c0, int sy0,
                                          int sx0, unsigned* planes) {
  constexpr int kPix = kOverlap ? 3 : 2, kBatch = kOverlap ? 2 : 4;
  const int half_cols = s.sc / 2, img_pairs = s.sr * half_cols, pairs = s.nimg * img_pairs;
  const bool hi_half = c0 + 8 < s.c;
  for (int base = threadIdx.x; base < pairs; base += kBatch * kNT) {
    uint4 v[kBatch][kPix][2];  // [pair][pixel][channel half]
    int word[kBatch];          // the pair's first word in a plane
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int e = base + b * kNT;
      const int m = e / img_pairs, rq = e - m * img_pairs, r = rq / half_cols, j = rq - r * half_cols;
      word[b] = (m * s.sr + r) * s.pitch + (kOverlap ? 2 * j : j);
      const int y = sy0 + r;
      const bool row_in = e < pairs && n0 + m < s.n && static_cast<unsigned>(y) < static_cast<unsigned>(s.rows);
      const T* row = src + ((n0 + m) * s.rows + y) * s.cols * s.c + c0;
#pragma unroll
      for (int p = 0; p < kPix; ++p) {
        const int x = sx0 + 2 * j + p;
        const bool in = row_in && static_cast<unsigned>(x) < static_cast<unsigned>(s.cols);
        const uint4* px = reinterpret_cast<const uint4*>(row + static_cast<int64_t>(x) * s.c);
        v[b][p][0] = in ? __ldg(px) : make_uint4(0, 0, 0, 0);
        v[b][p][1] = in && hi_half ? __ldg(px + 1) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kNT >= pairs) break;
      unsigned* dst = planes + word[b];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned p0[4] = {v[b][0][h].x, v[b][0][h].y, v[b][0][h].z, v[b][0][h].w};
        const unsigned p1[4] = {v[b][1][h].x, v[b][1][h].y, v[b][1][h].z, v[b][1][h].w};
        const unsigned p2[4] = {v[b][kPix - 1][h].x, v[b][kPix - 1][h].y, v[b][kPix - 1][h].z, v[b][kPix - 1][h].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          unsigned* lo = dst + (8 * h + 2 * k) * s.plane;  // channel 8h + 2k: the low halves
          unsigned* hi = lo + s.plane;                     // channel 8h + 2k + 1: the high halves
          if constexpr (kOverlap) {
            *reinterpret_cast<uint2*>(lo) =
                make_uint2(__byte_perm(p0[k], p1[k], 0x5410), __byte_perm(p1[k], p2[k], 0x5410));
            *reinterpret_cast<uint2*>(hi) =
                make_uint2(__byte_perm(p0[k], p1[k], 0x7632), __byte_perm(p1[k], p2[k], 0x7632));
          } else {
            *lo = __byte_perm(p0[k], p1[k], 0x5410);
            *hi = __byte_perm(p0[k], p1[k], 0x7632);
          }
        }
      }
    }
  }
}

// The destination planes (channel cl's at outp + cl * out_plane, image m's rows from m * ty, rows of tx) to
// channels-last global memory: a thread takes a pixel pair and stores each pixel's 16 channels as 16-byte vectors.
template <class TO>
__device__ __forceinline__ void StoreTile(const DwMmaArgs& g, const TO* outp, int64_t n0, int c0, int y0, int x0,
                                          TO* __restrict__ dst) {
  const int half_cols = g.tx / 2, img_pairs = g.ty * half_cols, pairs = g.nimg * img_pairs;
  for (int e = threadIdx.x; e < pairs; e += kThreads) {
    const int m = e / img_pairs, rq = e - m * img_pairs, r = rq / half_cols, q = 2 * (rq - r * half_cols);
    const int y = y0 + r, x = x0 + q;
    if (n0 + m >= g.n || y >= g.dst_rows || x >= g.dst_cols) continue;
    const bool second = x + 1 < g.dst_cols;
    TO* px = dst + (((n0 + m) * g.dst_rows + y) * g.dst_cols + x) * g.c + c0;
    const TO* op = outp + (m * g.ty + r) * g.tx + q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (c0 + 8 * h >= g.c) break;
      if constexpr (sizeof(TO) == 2) {
        unsigned wv[8];  // channel 8h + k of both pixels
#pragma unroll
        for (int k = 0; k < 8; ++k) wv[k] = *reinterpret_cast<const unsigned*>(op + (8 * h + k) * g.out_plane);
        uint4 p0, p1;
        p0.x = __byte_perm(wv[0], wv[1], 0x5410), p1.x = __byte_perm(wv[0], wv[1], 0x7632);
        p0.y = __byte_perm(wv[2], wv[3], 0x5410), p1.y = __byte_perm(wv[2], wv[3], 0x7632);
        p0.z = __byte_perm(wv[4], wv[5], 0x5410), p1.z = __byte_perm(wv[4], wv[5], 0x7632);
        p0.w = __byte_perm(wv[6], wv[7], 0x5410), p1.w = __byte_perm(wv[6], wv[7], 0x7632);
        *reinterpret_cast<uint4*>(px + 8 * h) = p0;
        if (second) *reinterpret_cast<uint4*>(px + g.c + 8 * h) = p1;
      } else {
        float2 fv[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) fv[k] = *reinterpret_cast<const float2*>(op + (8 * h + k) * g.out_plane);
        float4* d0 = reinterpret_cast<float4*>(px + 8 * h);
        d0[0] = make_float4(fv[0].x, fv[1].x, fv[2].x, fv[3].x);
        d0[1] = make_float4(fv[4].x, fv[5].x, fv[6].x, fv[7].x);
        if (second) {
          float4* d1 = reinterpret_cast<float4*>(px + g.c + 8 * h);
          d1[0] = make_float4(fv[0].y, fv[1].y, fv[2].y, fv[3].y);
          d1[1] = make_float4(fv[4].y, fv[5].y, fv[6].y, fv[7].y);
        }
      }
    }
  }
}

template <class T, class TO, int K>
__global__ void __launch_bounds__(kThreads) DwMmaKernel(const DwMmaArgs g, const T* __restrict__ src,
                                                        const T* __restrict__ w, const TO* __restrict__ bias,
                                                        TO* __restrict__ dst) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* planes = reinterpret_cast<T*>(smem);
  TO* outp = reinterpret_cast<TO*>(smem + g.out_offset);
  uint4* filt = reinterpret_cast<uint4*>(smem + g.filt_offset);
  // Per slot: its source rows' offset in a plane, and its destination rows' in a destination plane (-1: a dummy).
  int2* table = reinterpret_cast<int2*>(smem + g.table_offset);

  int64_t b = blockIdx.x;  // channel tile fastest: neighbouring blocks read the other sectors of the same pixels
  const int ct = static_cast<int>(b % g.ctiles);
  b /= g.ctiles;
  const int tc = static_cast<int>(b % g.col_tiles);
  b /= g.col_tiles;
  const int tr = static_cast<int>(b % g.row_tiles);
  const int64_t n0 = b / g.row_tiles * g.nimg;
  const int c0 = ct * kCt, y0 = tr * g.ty, x0 = tc * g.tx;

  for (int sl = threadIdx.x; sl < g.mtiles * kSlots; sl += kThreads) {
    int2 t = make_int2(0, -1);
    if (sl < g.slots) {
      const int per_img = g.ri * g.xj, m = sl / per_img, ij = sl - m * per_img, i = ij / g.xj, j = ij - i * g.xj;
      t = make_int2((m * g.sr + K * i) * g.pitch + 8 * j, (m * g.ty + K * i) * g.tx + 8 * j);
    }
    table[sl] = t;
  }
  FilterRows<T, K>(g, w, c0, filt);
  const StageGeom sg{g.n, g.c, g.src_rows, g.src_cols, g.nimg, g.sr, g.sc, g.pitch / 2, g.plane / 2};
  StageTile<T, false, kThreads>(sg, src, n0, c0, y0 - g.ph, x0 - g.pw, reinterpret_cast<unsigned*>(planes));
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tq = lane % 4;
  // ldmatrix.x4 row of this lane: slot (lane % 8) + 8 (lane / 8 % 2) of the M tile, source columns + 8 (lane / 16).
  const int am = (lane & 7) + ((lane >> 3) & 1) * 8, acol = 8 * (lane >> 4);
  const int bw = FragmentWord(lane);
  constexpr bool kBF16 = std::is_same_v<T, __nv_bfloat16>;

  for (int cl = warp; cl < kCt && c0 + cl < g.c; cl += kWarps) {
    const T* plane = planes + cl * g.plane;
    const unsigned* frow = reinterpret_cast<const unsigned*>(filt + cl * K * (kFiltRow / 8));
    uint32_t bf[K][2];
#pragma unroll
    for (int dy = 0; dy < K; ++dy) {
      bf[dy][0] = frow[dy * (kFiltRow / 2) + bw];
      bf[dy][1] = frow[dy * (kFiltRow / 2) + bw + 4];
    }
    const float bv = g.has_bias ? ToAcc(bias[c0 + cl]) : 0.f;
    TO* op = outp + cl * g.out_plane;
    float d[K][4];
    for (int mt = 0; mt < g.mtiles; ++mt) {
      const int a_off = table[mt * kSlots + am].x + acol;
      const int2 ds[2] = {table[mt * kSlots + grp], table[mt * kSlots + grp + 8]};  // this lane's D rows
#pragma unroll
      for (int e = 0; e < K; ++e) d[e][0] = d[e][1] = d[e][2] = d[e][3] = 0.f;
#pragma unroll
      for (int s = 0; s < 2 * K - 1; ++s) {
        uint32_t a[4];
        LdMatrix<4>(a, plane + a_off + s * g.pitch);
#pragma unroll
        for (int dy = 0; dy < K; ++dy) {
          if (s - dy >= 0 && s - dy < K) Mma16816<kBF16>(d[s - dy], a, bf[dy][0], bf[dy][1]);
        }
      }
      // inf * 0 and NaN * 0 are NaN: one FMA chain tells whether any accumulator is not finite.
      float chk = 0.f;
#pragma unroll
      for (int e = 0; e < K; ++e)
#pragma unroll
        for (int r = 0; r < 4; ++r) chk = fmaf(d[e][r], 0.f, chk);
      if (!__all_sync(0xffffffffu, chk == 0.f)) {
        const T* taps = reinterpret_cast<const T*>(filt + cl * K * (kFiltRow / 8));
#pragma unroll
        for (int e = 0; e < K; ++e) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const T* at = plane + ds[r / 2].x + e * g.pitch + 2 * tq + (r & 1);
            float v = 0.f;
            for (int dy = 0; dy < K; ++dy)
              for (int dx = 0; dx < K; ++dx) {
                v = fmaf(ToAcc(at[dy * g.pitch + dx]), ToAcc(taps[dy * kFiltRow + dx + 8]), v);
              }
            d[e][r] = v;
          }
        }
      }
      __syncwarp();  // this channel's plane is read; its destinations may overwrite it (aliased: one M tile only)
      WithActivation(g.act, [&](auto act_c) {
        constexpr int kAct = decltype(act_c)::value;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (ds[h].y < 0) continue;
#pragma unroll
          for (int e = 0; e < K; ++e) {
            StorePair<TO>(op + ds[h].y + e * g.tx + 2 * tq, Activate(d[e][2 * h] + bv, kAct),
                          Activate(d[e][2 * h + 1] + bv, kAct));
          }
        }
      });
    }
  }
  __syncthreads();
  StoreTile<TO>(g, outp, n0, c0, y0, x0, dst);
}

// The problem as the kernels see it (plane.h): 7x7, unit strides, c a multiple of 8 (16-byte pixel
// vectors); the data gradient as the flipped forward, the filter gradient in the forward's geometry.
constexpr int kK = 7;

bool MakeMmaProblem(const ConvParams& p, Op op, DType in, DwPlane* tp) {
  DwPlane t;
  if ((in != DType::kBF16 && in != DType::kF16) || !DwPlaneOf(p, op, &t)) return false;
  if (t.kh != kK || t.kw != kK || t.sh != 1 || t.sw != 1 || t.c % 8 != 0) return false;
  if (op == Op::kDgrad && !t.flip) return false;
  *tp = t;
  return true;
}

// WithF32AccTypes for the 16-bit inputs only: f(T(), TO()) is not instantiated for float32 inputs, which no caller
// passes (MakeMmaProblem takes 16-bit data only).
template <class F>
cudaError_t With16BitTypes(DType in, DType out, F&& f) {
  return WithF32AccTypes(in, out, [&](auto ti, auto to) -> cudaError_t {
    if constexpr (std::is_same_v<decltype(ti), float>) {
      return cudaSuccess;  // not reached
    } else {
      return f(ti, to);
    }
  });
}

// Tile shape: nimg images x ri row groups x xj column blocks. Among those whose shared memory fits two blocks per SM,
// with at most kMaxMtiles M tiles: the least work, counted as the source pixels staged plus the destination pixels
// computed (the halo, the rows, columns and images past the destination in the last tiles, the dummy slots), times
// the blocks or two waves' worth of them, whichever is more (fewer blocks would leave SMs idle).
constexpr int kMaxMtiles = 4;

struct MmaPlan {
  DwMmaArgs a{};
  size_t smem = 0;
  int64_t blocks = 0;  // per channel tile
};

bool MakePlan(const DwPlane& t, int k, size_t out_size, int64_t ctiles, MmaPlan* out) {
  double best = -1.0;
  const int64_t max_ri = CeilDiv(t.dst_rows, k), max_xj = CeilDiv(t.dst_cols, 8);
  for (int xj = 1; xj <= kSlots && xj < 2 * max_xj; xj *= 2) {
    for (int ri = 1; ri <= max_ri && ri * xj <= kMaxMtiles * kSlots; ++ri) {
      for (int nimg = 1; nimg <= t.n && nimg * ri * xj <= kMaxMtiles * kSlots; nimg *= 2) {
        const int slots = nimg * ri * xj, mtiles = static_cast<int>(CeilDiv(slots, kSlots));
        const int ty = k * ri, tx = 8 * xj, sr = ty + k - 1, sc = tx + 8;
        // pitch in 16-byte units odd, so that the 8 rows of an ldmatrix matrix spread over the banks
        const int units = sc / 8 + (sc / 8 % 2 == 0 ? 1 : 0);
        const int pitch = 8 * units, plane = nimg * sr * pitch;
        const size_t src_bytes = static_cast<size_t>(kCt) * plane * 2;
        const size_t out_bytes = static_cast<size_t>(nimg) * ty * tx * out_size;
        const bool alias = mtiles == 1 && out_bytes <= static_cast<size_t>(plane) * 2;
        const size_t filt_offset = src_bytes + (alias ? 0 : kCt * out_bytes);
        const size_t table_offset = filt_offset + static_cast<size_t>(kCt) * k * kFiltRow * 2;
        const size_t smem = table_offset + static_cast<size_t>(mtiles) * kSlots * sizeof(int2);
        if (smem > kMaxSmem) continue;
        const int64_t img_tiles = CeilDiv(t.n, nimg), row_tiles = CeilDiv(t.dst_rows, ty);
        const int64_t col_tiles = CeilDiv(t.dst_cols, tx), blocks = img_tiles * row_tiles * col_tiles;
        const double work = static_cast<double>(nimg) * sr * sc + static_cast<double>(mtiles) * kSlots * k * 8;
        const double cost = work * static_cast<double>(std::max<int64_t>(blocks * ctiles, 2 * kPlanSms));
        if (best >= 0.0 && cost >= best) continue;
        best = cost;
        DwMmaArgs& a = out->a;
        a.nimg = nimg, a.ri = ri, a.xj = xj, a.slots = slots, a.mtiles = mtiles;
        a.ty = ty, a.tx = tx, a.sr = sr, a.sc = sc, a.pitch = pitch, a.plane = plane;
        a.out_plane = alias ? static_cast<int>(static_cast<size_t>(plane) * 2 / out_size) : nimg * ty * tx;
        a.out_offset = alias ? 0 : static_cast<int>(src_bytes);
        a.filt_offset = static_cast<int>(filt_offset);
        a.table_offset = static_cast<int>(table_offset);
        a.row_tiles = static_cast<int>(row_tiles), a.col_tiles = static_cast<int>(col_tiles);
        out->smem = smem;
        out->blocks = blocks;
      }
    }
  }
  return best >= 0.0;
}

// The forward / data-gradient plan of pr (its tile shape for the output dtype), or why the kernel does not take it.
std::string FwdError(const Problem& pr, DwPlane* t, MmaPlan* pl) {
  if (!DepthwiseApplies(pr.p)) return "it takes depthwise convolutions (groups == c == k, batch_groups == 1)";
  if (pr.dev.arch < 80) return "it needs sm_80 or newer";
  if (!IsF32AccPair(pr.in, pr.out) || !MakeMmaProblem(pr.p, pr.op, pr.in, t)) {
    return "it takes 16-bit channels-last 2-D 7x7 windows at unit strides, no dilation, c a multiple of 8";
  }
  const int64_t ctiles = CeilDiv(t->c, kCt);
  if (!MakePlan(*t, kK, static_cast<size_t>(DTypeBytes(pr.out)), ctiles, pl)) return "no tile fits its shared memory";
  if (pl->blocks * ctiles > INT_MAX) return "more blocks than one grid holds";
  return {};
}

template <class T, class TO>
cudaError_t Launch(const DwPlane& t, MmaPlan pl, int act, bool has_bias, const void* src, const void* w,
                   const void* bias, void* dst, cudaStream_t s) {
  DwMmaArgs& a = pl.a;
  a.ctiles = static_cast<int>(CeilDiv(t.c, kCt));
  const int64_t blocks = pl.blocks * a.ctiles;
  a.n = t.n;
  a.c = static_cast<int>(t.c);
  a.src_rows = static_cast<int>(t.src_rows), a.src_cols = static_cast<int>(t.src_cols);
  a.dst_rows = static_cast<int>(t.dst_rows), a.dst_cols = static_cast<int>(t.dst_cols);
  a.ph = static_cast<int>(t.ph), a.pw = static_cast<int>(t.pw);
  a.flip = t.flip, a.act = act, a.has_bias = has_bias;
  const auto kern = DwMmaKernel<T, TO, kK>;
  if (const cudaError_t e = AllowDynamicSmem(kern, pl.smem); e != cudaSuccess) return e;
  kern<<<static_cast<unsigned>(blocks), kThreads, pl.smem, s>>>(a, static_cast<const T*>(src), static_cast<const T*>(w),
                                                                static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}


// ---- the filter gradient ----
// dw[ky][kx] = sum over (image, r, c) of X[r + ky - ph][c + kx - pw] * DY[r][c], the pairs with X outside the image
// left out. Per channel, pair of source rows (y, y - 1) and 16 cotangent columns c0 + k, one mma.sync m16n8k16:
//   A[kx][k]     = X[y][c0 + k + kx - pw]       (rows 0..7: a Hankel matrix of source row y; kx = 7 is spare)
//   A[8 + kx][k] = X[y - 1][c0 + k + kx - pw]   (rows 8..15: of row y - 1)
//   B[k][n]      = DY[y + ph - n][c0 + k]       (n = 0..7, one ldmatrix.x2 of 8 cotangent rows)
// D[kx][n] collects the pairs with ky = n, D[8 + kx][n] those with ky = n - 1: 98 of the 128 outputs count (77 % of
// the products; a Hankel matrix of the cotangent instead would leave 9 of 16 source rows idle). The Hankel fragments
// are plain 32-bit loads from a source plane that holds every column pair as one aligned word (StageTile's
// overlap), so a lane's a0 / a2 pair at any column is one load.
// A tile is rb source rows (even; rows past the image are zero) x 16 nb cotangent columns of one image: each
// (source row, cotangent column) belongs to one tile, so every pair is counted once. A block (channel tile, split)
// stages a tile, computes on it, and walks the tiles split, split + splits, ... keeping each channel's sums in
// registers; then per split either dw or float32 partials for ReduceSplits (a fixed order: deterministic).
// Non-finite data: the MMA multiplies source columns by cotangent columns past the image (zeros) and source pixels of
// the padding (zeros) by cotangents, where inf * 0 is NaN. A warp whose tile sum of a channel is not finite
// recomputes it with FMAs over the real pairs only, as the register stencil counts them.
// Measured (bf16, ConvNeXt-T's layers at b32, with the split sum): 2.4-4.6x faster than the register stencil and
// 1.2-1.6x faster than lax from 56^2 x 96 to 14^2 x 384. At 7^2 x 768 (7 of 16 columns count) it was slower than
// the stencil, so images narrower than 12 columns keep the stencil. Tried and not kept: lanes l and l + 16 loading
// the two halves of a pixel's sector; 16 warps of one block per SM keeping the next tile's loads in flight while
// computing (more instructions per tile than MMA work at 14^2, slower there; no gain at 56^2: ncu showed 0.42
// instructions issued per cycle and scheduler, short- and long-scoreboard and MIO stalls alike).
constexpr int kWgThreads = 256;
constexpr int kWgWarps = kWgThreads / 32;
constexpr int kWgChannels = kCt / kWgWarps;  // channels per warp
constexpr size_t kWgMaxSmem = 112 * 1024;     // two blocks per SM (228 KB, 1 KB of it reserved per block)
constexpr int64_t kWgMinCols = 12;

struct DwMmaWgradArgs {
  int64_t n, tiles, welems;
  int c, src_rows, src_cols, dst_rows, dst_cols, ph, pw;
  int rb, nb;              // a tile: rb source rows x 16 nb cotangent columns
  int xpitch, xplane;      // words per source plane row (16 nb + 8 column pairs) and per plane (rb rows)
  int dpitch, dplane;      // 16-bit elements per cotangent plane row (16 nb + 8: ldmatrix rows spread over the
                           // banks) and per plane (rb + 6 rows: y + ph - 7 .. y + ph for the tile's pairs)
  int row_tiles, col_tiles, ctiles, splits;
};

// The tile's sum for tap (ky, kx) of one channel over its real pairs only, from the planes (a fixed order).
template <class T>
__device__ float ExactTap(const DwMmaWgradArgs& g, const unsigned* xp, const T* dp, int y0, int xt, int ky, int kx) {
  float v = 0.f;
  for (int r = 0; r < g.rb && y0 + r < g.src_rows; ++r) {
    const int dr = y0 + r + g.ph - ky;
    if (dr < 0 || dr >= g.dst_rows) continue;
    const T* xrow = reinterpret_cast<const T*>(xp + r * g.xpitch);  // word i's low half: source column xt - pw + i
    const T* drow = dp + (r + 6 - ky) * g.dpitch;
    for (int k = 0; k < 16 * g.nb && xt + k < g.dst_cols; ++k) {
      const int xc = xt + k + kx - g.pw;
      if (xc >= 0 && xc < g.src_cols) v = fmaf(ToAcc(xrow[2 * (k + kx)]), ToAcc(drow[k]), v);
    }
  }
  return v;
}

template <class T, class TO>
__global__ void __launch_bounds__(kWgThreads, 2) DwMmaWgradKernel(const DwMmaWgradArgs g, const T* __restrict__ x,
                                                                  const T* __restrict__ dy, TO* __restrict__ dw,
                                                                  float* __restrict__ scratch) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned* xplanes = reinterpret_cast<unsigned*>(smem);
  T* dplanes = reinterpret_cast<T*>(smem + static_cast<size_t>(kCt) * g.xplane * 4);
  const int ct = static_cast<int>(blockIdx.x % g.ctiles), split = static_cast<int>(blockIdx.x / g.ctiles);
  const int c0 = ct * kCt;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tq = lane % 4;
  constexpr bool kBF16 = std::is_same_v<T, __nv_bfloat16>;
  const StageGeom xs{g.n, g.c, g.src_rows, g.src_cols, 1, g.rb, 16 * g.nb + 8, g.xpitch, g.xplane};
  const StageGeom ds{g.n, g.c, g.dst_rows, g.dst_cols, 1, g.rb + 6, 16 * g.nb, g.dpitch / 2, g.dplane / 2};
  // This lane's A words (row y of the first pair, column pair 2 tq + grp) and ldmatrix row (cotangent row n = lane % 8
  // of the first pair, columns + 8 for lanes 8..15).
  const int a_word = g.xpitch + 2 * tq + grp;
  const int b_elem = (7 - (lane & 7)) * g.dpitch + 8 * ((lane >> 3) & 1);
  float acc[kWgChannels][4] = {};
  for (int64_t tile = split; tile < g.tiles; tile += g.splits) {
    const int tc = static_cast<int>(tile % g.col_tiles);
    const int64_t q = tile / g.col_tiles;
    const int y0 = static_cast<int>(q % g.row_tiles) * g.rb, xt = tc * 16 * g.nb;
    const int64_t n0 = q / g.row_tiles;
    __syncthreads();  // the previous tile's planes are read
    StageTile<T, true, kWgThreads>(xs, x, n0, c0, y0, xt - g.pw, xplanes);
    StageTile<T, false, kWgThreads>(ds, dy, n0, c0, y0 + g.ph - 6, xt, reinterpret_cast<unsigned*>(dplanes));
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kWgChannels; ++i) {
      const int cl = warp + kWgWarps * i;
      if (c0 + cl >= g.c) break;
      const unsigned* xa = xplanes + cl * g.xplane + a_word;
      const T* bl = dplanes + cl * g.dplane + b_elem;
      // Two accumulators (even and odd pairs), so that consecutive MMAs do not wait on each other.
      float d[2][4] = {};
      auto mma = [&](int pi, float (&acc4)[4], int b) {
        const unsigned* xr = xa + 2 * pi * g.xpitch + 16 * b;
        const uint32_t a[4] = {xr[0], xr[-g.xpitch], xr[8], xr[8 - g.xpitch]};
        uint32_t f[2];
        LdMatrix<2>(f, bl + 2 * pi * g.dpitch + 16 * b);
        Mma16816<kBF16>(acc4, a, f[0], f[1]);
      };
      const int pairs = g.rb / 2;
      int pi = 0;
      for (; pi + 1 < pairs; pi += 2) {
        for (int b = 0; b < g.nb; ++b) {
          mma(pi, d[0], b);
          mma(pi + 1, d[1], b);
        }
      }
      if (pi < pairs) {
        for (int b = 0; b < g.nb; ++b) mma(pi, d[0], b);
      }
      float t[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) t[r] = d[0][r] + d[1][r];
      // Lane (grp, tq) holds (ky, kx) = (2 tq, grp), (2 tq + 1, grp) from rows 0..7 and (2 tq - 1, grp), (2 tq, grp)
      // from rows 8..15; kx = 7, ky = 7 and ky = -1 are spare. inf * 0 and NaN * 0 are NaN: one FMA chain tells
      // whether a counted sum is not finite.
      float chk = 0.f;
      if (grp < 7) {
        chk = fmaf(t[0], 0.f, fmaf(t[3], 0.f, chk));
        if (tq < 3) chk = fmaf(t[1], 0.f, chk);
        if (tq > 0) chk = fmaf(t[2], 0.f, chk);
      }
      if (!__all_sync(0xffffffffu, chk == 0.f)) {
        const unsigned* xp = xplanes + cl * g.xplane;
        const T* dp = dplanes + cl * g.dplane;
        t[0] = grp < 7 ? ExactTap<T>(g, xp, dp, y0, xt, 2 * tq, grp) : 0.f;
        t[1] = grp < 7 && tq < 3 ? ExactTap<T>(g, xp, dp, y0, xt, 2 * tq + 1, grp) : 0.f;
        t[2] = t[3] = 0.f;
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][r] += t[r];
    }
  }
  // dw[ky][kx] = rows 0..7's (ky, kx) + rows 8..15's (ky + 1 there): (2 tq, grp) is this lane's t0 + t3, (2 tq + 1,
  // grp) its t1 + the next lane's t2.
#pragma unroll
  for (int i = 0; i < kWgChannels; ++i) {
    const int ch = c0 + warp + kWgWarps * i;
    const float next2 = __shfl_down_sync(0xffffffffu, acc[i][2], 1);
    if (ch >= g.c || grp >= 7) continue;
    const float v[2] = {acc[i][0] + acc[i][3], acc[i][1] + next2};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h == 1 && tq == 3) break;
      const int64_t off = static_cast<int64_t>((2 * tq + h) * kK + grp) * g.c + ch;
      if (g.splits == 1) dw[off] = FromAcc<TO>(v[h]);
      else scratch[split * g.welems + off] = v[h];
    }
  }
}

// Tile shape (rb, nb) and splits: among the tiles whose planes fit two blocks per SM, the fewest cost units on the
// busiest block (its tiles: ceil(tiles / splits), with splits two blocks per SM over the channel tiles). A tile costs
// its MMAs (3 units per source pixel: 6 shared-memory wavefronts per MMA of 2 x 16 pixels), the pixels it loads (1
// unit each: the source with its column halo, the cotangent with its 6 halo rows) and a fixed 500.
struct WgradPlan {
  DwMmaWgradArgs a{};
  size_t smem = 0;
};

bool MakeWgradPlan(const DwPlane& t, WgradPlan* out) {
  const int64_t ctiles = CeilDiv(t.c, kCt);
  const int64_t max_nb = std::min<int64_t>(8, CeilDiv(t.dst_cols, 16));
  const int64_t max_rb = std::min<int64_t>(CeilDiv(t.src_rows, 2) * 2, 1 << 12);
  double best = -1.0;
  for (int nb = 1; nb <= max_nb; ++nb) {
    const int pitch = 16 * nb + 8;
    for (int rb = 2; rb <= max_rb; rb += 2) {
      const size_t smem = static_cast<size_t>(kCt) * (static_cast<size_t>(rb) * pitch * 4 + (rb + 6) * pitch * 2);
      if (smem > kWgMaxSmem) break;
      const int64_t row_tiles = CeilDiv(t.src_rows, rb), col_tiles = CeilDiv(t.dst_cols, 16 * nb);
      const int64_t tiles = t.n * row_tiles * col_tiles;
      const int64_t splits = std::min<int64_t>({tiles, std::max<int64_t>(1, 2 * kPlanSms / ctiles), 1024});
      const double per_tile = 3.0 * rb * 16 * nb + rb * pitch + (rb + 6) * 16.0 * nb + 500.0;
      const double cost = static_cast<double>(CeilDiv(tiles, splits)) * per_tile;
      if (best >= 0.0 && cost >= best) continue;
      best = cost;
      DwMmaWgradArgs& a = out->a;
      a.rb = rb, a.nb = nb, a.xpitch = pitch, a.xplane = rb * pitch, a.dpitch = pitch, a.dplane = (rb + 6) * pitch;
      a.row_tiles = static_cast<int>(row_tiles), a.col_tiles = static_cast<int>(col_tiles);
      a.tiles = tiles, a.splits = static_cast<int>(splits), a.ctiles = static_cast<int>(ctiles);
      out->smem = smem;
    }
  }
  return best >= 0.0;
}

// The filter gradient's plan when the kernel takes the problem: 16-bit data (every output dtype the handlers pair
// with it), cotangent rows at least kWgMinCols wide.
bool WgradPlanOf(const ConvParams& p, DType in, WgradPlan* pl) {
  DwPlane t;
  if (!MakeMmaProblem(p, Op::kWgrad, in, &t) || t.dst_cols < kWgMinCols || !MakeWgradPlan(t, pl)) {
    return false;
  }
  DwMmaWgradArgs& a = pl->a;
  a.n = t.n;
  a.welems = WElements(p);
  a.c = static_cast<int>(t.c);
  a.src_rows = static_cast<int>(t.src_rows), a.src_cols = static_cast<int>(t.src_cols);
  a.dst_rows = static_cast<int>(t.dst_rows), a.dst_cols = static_cast<int>(t.dst_cols);
  a.ph = static_cast<int>(t.ph), a.pw = static_cast<int>(t.pw);
  return static_cast<int64_t>(a.ctiles) * a.splits <= INT_MAX;
}

// The filter gradient's plan for pr, or why the kernel does not take it.
std::string WgradError(const Problem& pr, WgradPlan* pl) {
  if (!DepthwiseApplies(pr.p)) return "it takes depthwise convolutions (groups == c == k, batch_groups == 1)";
  if (pr.dev.arch < 80) return "it needs sm_80 or newer";
  if (!IsF32AccPair(pr.in, pr.out) || !WgradPlanOf(pr.p, pr.in, pl)) {
    return "it takes 16-bit channels-last 2-D 7x7 windows at unit strides, no dilation, c a multiple of 8 and "
           "outputs at least 12 columns wide";
  }
  return {};
}

size_t WgradWorkspace(const Problem& pr) {
  WgradPlan pl;
  if (!WgradError(pr, &pl).empty() || pl.a.splits <= 1) return 0;
  return static_cast<size_t>(pl.a.splits) * WElements(pr.p) * sizeof(float);
}

cudaError_t Wgrad(const Problem& pr, const Buffers& b, cudaStream_t s) {
  WgradPlan pl;
  if (!WgradError(pr, &pl).empty()) return cudaErrorNotSupported;
  if (!Aligned16(b.a) || !Aligned16(b.b)) return cudaErrorMisalignedAddress;
  DwMmaWgradArgs& a = pl.a;
  if (a.splits > 1 && (b.ws == nullptr || b.ws_bytes < WgradWorkspace(pr))) return cudaErrorInvalidValue;
  const cudaError_t e = With16BitTypes(pr.in, pr.out, [&](auto ti, auto to) {
    using T = decltype(ti);
    using TO = decltype(to);
    const auto kern = DwMmaWgradKernel<T, TO>;
    if (const cudaError_t e = AllowDynamicSmem(kern, pl.smem); e != cudaSuccess) return e;
    kern<<<static_cast<unsigned>(static_cast<int64_t>(a.ctiles) * a.splits), kWgThreads, pl.smem, s>>>(
        a, static_cast<const T*>(b.a), static_cast<const T*>(b.b), static_cast<TO*>(b.out),
        static_cast<float*>(b.ws));
    return cudaGetLastError();
  });
  if (e != cudaSuccess || a.splits == 1) return e;
  return ReduceSplits(pr.in, pr.out, b.ws, a.splits, WElements(pr.p), b.out, s);
}

}  // namespace
}  // namespace cuda

namespace variants::depthwise_mma {

std::string Applies(const Problem& pr) {
  if (pr.op == Op::kWgrad) {
    cuda::WgradPlan pl;
    return cuda::WgradError(pr, &pl);
  }
  cuda::DwPlane t;
  cuda::MmaPlan pl;
  return cuda::FwdError(pr, &t, &pl);
}

size_t Workspace(const Problem& pr) { return pr.op == Op::kWgrad ? cuda::WgradWorkspace(pr) : 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  if (pr.op == Op::kWgrad) return cuda::Wgrad(pr, b, s);
  cuda::DwPlane t;
  cuda::MmaPlan pl;
  if (!cuda::FwdError(pr, &t, &pl).empty()) return cudaErrorNotSupported;
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
  const bool fwd = pr.op == Op::kFwd;
  const int act = fwd ? static_cast<int>(pr.p.activation[0]) : kActNone;
  const void* bias = fwd && pr.p.has_bias[0] ? b.bias : nullptr;
  return cuda::With16BitTypes(pr.in, pr.out, [&](auto ti, auto to) {
    return cuda::Launch<decltype(ti), decltype(to)>(t, pl, act, bias != nullptr, b.a, b.b, bias, b.out, s);
  });
}

}  // namespace variants::depthwise_mma
}  // namespace jaxconv
