// integer.mma_s8: int8 operands with int32 accumulation on tensor cores (mma.sync.m16n8k32.s32.s8.s8.s32, sm_80 and
// later), the arithmetic of quantized inference. The forward as an implicit GEMM over channels-last tensors:
//
//   Y[m, kk] = sum_r A[m, r] * B[r, kk],   m = (n, od, oh, ow) an output position, r = (tap, c) a reduction index,
//   A[m, (tap, c)] = x at the tap's source position (0 for padding and dilation holes), B[(tap, c), kk] = w[tap, c, kk].
//
// Exact: int8 products summed in int32 wrap modulo 2^32 like the integer kernels' (csrc/cpu/conv_int.h), so an int32
// result is the exact sum modulo 2^32 and an int8 result (lax's default for int8 operands) its low byte.
//
// Tiles: a block of 128 threads computes 64 positions x 64 output channels, the reduction in chunks of 32 (two 16-byte
// channel vectors, each from one tap since c is a multiple of 16); each warp owns 32 x 32 outputs as 2 x 4 m16n8 MMA
// tiles. A chunk is staged in shared memory (rows padded to 48 bytes: the fragment reads hit 32 distinct banks), one
// 16-byte load per thread for each operand. Conditions (Applies): channels-last, no groups, c and k multiples of 16.
#include <cstdint>

#include "dispatch/variant.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kBM = 64, kBN = 64, kBK = 32;
constexpr int kRow = 48;  // bytes per shared-memory row of 32 int8 (padded)

struct MmaArgs {
  int64_t m;                 // output positions n * OD * OH * OW
  int64_t c, k, taps;        // channels, output channels, window taps
  int64_t in[3], win[3], out[3], stride[3], pad_lo[3], lhs_dil[3], rhs_dil[3];
  int out_int8;              // 1: int8 result (the low byte), 0: int32
};

__device__ __forceinline__ void MmaS8(int (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // Applies refuses GPUs before sm_80
#endif
}

__global__ void __launch_bounds__(kThreads) MmaS8FwdKernel(const MmaArgs a, const int8_t* __restrict__ x,
                                                           const int8_t* __restrict__ w, void* __restrict__ y) {
  __shared__ __align__(16) uint8_t As[kBM * kRow];  // [position][r within the chunk]
  __shared__ __align__(16) uint8_t Bs[kBN * kRow];  // [output channel][r within the chunk]
  __shared__ int64_t row_x[kBM];                    // x offset of the position's image, -1 past the end
  __shared__ int64_t row_base[3][kBM];              // o * stride - pad_lo per dim

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  const int64_t in_sp = a.in[0] * a.in[1] * a.in[2];
  for (int i = tid; i < kBM; i += kThreads) {
    const int64_t m = m0 + i;
    if (m < a.m) {
      int64_t rem = m;
      const int64_t o2 = rem % a.out[2]; rem /= a.out[2];
      const int64_t o1 = rem % a.out[1]; rem /= a.out[1];
      const int64_t o0 = rem % a.out[0];
      const int64_t n = rem / a.out[0];
      row_x[i] = n * in_sp * a.c;
      row_base[0][i] = o0 * a.stride[0] - a.pad_lo[0];
      row_base[1][i] = o1 * a.stride[1] - a.pad_lo[1];
      row_base[2][i] = o2 * a.stride[2] - a.pad_lo[2];
    } else {
      row_x[i] = -1;
      row_base[0][i] = row_base[1][i] = row_base[2][i] = 0;
    }
  }

  int acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0;

  const int64_t R = a.taps * a.c;
  const int wm = (warp % 2) * 32, wn = (warp / 2) * 32;  // the warp's 32 x 32 outputs within the tile
  const int g = lane / 4, t = lane % 4;                  // MMA fragment coordinates
  for (int64_t r0 = 0; r0 < R; r0 += kBK) {
    __syncthreads();  // the previous chunk's fragments are read (and, first time, the row tables are written)
    {  // A: thread -> (position, half of the chunk): 16 channels of one tap
      const int i = tid / 2, h = tid % 2;
      const int64_t r = r0 + 16 * h;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < R && row_x[i] >= 0) {
        const int64_t tap = r / a.c, ch = r - tap * a.c;
        const int64_t f2 = tap % a.win[2], f1 = (tap / a.win[2]) % a.win[1], f0 = tap / (a.win[2] * a.win[1]);
        const int64_t f[3] = {f0, f1, f2};
        int64_t src = 0;
        bool ok = true;
#pragma unroll
        for (int d = 0; d < 3; ++d) {
          const int64_t q = row_base[d][i] + f[d] * a.rhs_dil[d];
          const int64_t id = q >= 0 ? q / a.lhs_dil[d] : -1;
          ok = ok && q >= 0 && id * a.lhs_dil[d] == q && id < a.in[d];
          src = src * a.in[d] + (ok ? id : 0);
        }
        if (ok) v = __ldg(reinterpret_cast<const uint4*>(x + row_x[i] + src * a.c + ch));
      }
      *reinterpret_cast<uint4*>(As + i * kRow + 16 * h) = v;
    }
    {  // B: thread -> (reduction row rr, 16 output channels), stored transposed: Bs[channel][rr]
      const int rr = tid / 4, col = (tid % 4) * 16;
      const int64_t r = r0 + rr;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < R && n0 + col < a.k) v = __ldg(reinterpret_cast<const uint4*>(w + r * a.k + n0 + col));
      const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 16; ++j) Bs[(col + j) * kRow + rr] = static_cast<uint8_t>(words[j / 4] >> (8 * (j % 4)));
    }
    __syncthreads();
    unsigned af[2][4], bf[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* base = As + (wm + 16 * i) * kRow;
      af[i][0] = *reinterpret_cast<const unsigned*>(base + g * kRow + 4 * t);
      af[i][1] = *reinterpret_cast<const unsigned*>(base + (g + 8) * kRow + 4 * t);
      af[i][2] = *reinterpret_cast<const unsigned*>(base + g * kRow + 16 + 4 * t);
      af[i][3] = *reinterpret_cast<const unsigned*>(base + (g + 8) * kRow + 16 + 4 * t);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t* base = Bs + (wn + 8 * j + g) * kRow;
      bf[j][0] = *reinterpret_cast<const unsigned*>(base + 4 * t);
      bf[j][1] = *reinterpret_cast<const unsigned*>(base + 16 + 4 * t);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) MmaS8(acc[i][j], af[i], bf[j]);
  }

  // Epilogue: c0, c1 at (row g, cols 2t, 2t+1), c2, c3 at (row g + 8, same cols) of each m16n8 tile.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t m = m0 + wm + 16 * i + g + 8 * half;
      if (m >= a.m) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t kk = n0 + wn + 8 * j + 2 * t;
        if (kk >= a.k) continue;  // k is a multiple of 16, so kk + 1 < k too
        const int v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
        if (a.out_int8) {
          int8_t* p = static_cast<int8_t*>(y) + m * a.k + kk;
          p[0] = static_cast<int8_t>(v0);
          p[1] = static_cast<int8_t>(v1);
        } else {
          *reinterpret_cast<int2*>(static_cast<int*>(y) + m * a.k + kk) = make_int2(v0, v1);
        }
      }
    }
  }
}

}  // namespace
}  // namespace cuda

namespace variants::integer_mma_s8 {

std::string Applies(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (pr.op != Op::kFwd) return "integer convolutions have a forward op only (lax has no integer gradients)";
  if (pr.in != DType::kI8 || (pr.out != DType::kI32 && pr.out != DType::kI8)) {
    return "it takes int8 operands with an int32 or int8 result";
  }
  if (pr.dev.arch < 80) return "int8 mma.sync needs sm_80 or later";
  if (p.layout[0] != kChannelsLast) return "it takes channels-last layouts";
  if (p.groups[0] != 1 || p.batch_groups[0] != 1) return "it takes no feature or batch groups";
  if (p.has_bias[0] != 0 || p.activation[0] != kActNone) return "it fuses no bias or activation";
  if (p.c[0] < 16 || p.c[0] % 16 != 0 || p.k[0] < 16 || p.k[0] % 16 != 0) {
    return "it needs c and k multiples of 16 (16-byte channel vectors)";
  }
  for (int d = 0; d < 3; ++d) {
    if (p.in[d] < 1 || p.win[d] < 1 || p.out[d] < 1) return "empty spatial extent";
  }
  if (p.n[0] < 1) return "empty batch";
  // Grid: positions / 64 in x (below 2^31), output channels / 64 in y (below 65536).
  const int64_t m = p.n[0] * SpatialCount(p.out);
  if (cuda::CeilDiv(m, cuda::kBM) >= (int64_t(1) << 31) || cuda::CeilDiv(p.k[0], cuda::kBN) >= 65536) {
    return "more positions or output channels than its grid holds";
  }
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const ConvParams& p = pr.p;
  cuda::MmaArgs a;
  a.m = p.n[0] * SpatialCount(p.out);
  a.c = p.c[0];
  a.k = p.k[0];
  a.taps = SpatialCount(p.win);
  for (int d = 0; d < 3; ++d) {
    a.in[d] = p.in[d];
    a.win[d] = p.win[d];
    a.out[d] = p.out[d];
    a.stride[d] = p.stride[d];
    a.pad_lo[d] = p.pad_lo[d];
    a.lhs_dil[d] = p.lhs_dil[d];
    a.rhs_dil[d] = p.rhs_dil[d];
  }
  a.out_int8 = pr.out == DType::kI8;
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b)) return cudaErrorMisalignedAddress;
  const dim3 grid(static_cast<unsigned>(cuda::CeilDiv(a.m, cuda::kBM)),
                  static_cast<unsigned>(cuda::CeilDiv(a.k, cuda::kBN)));
  cuda::MmaS8FwdKernel<<<grid, cuda::kThreads, 0, s>>>(a, static_cast<const int8_t*>(b.a),
                                                       static_cast<const int8_t*>(b.b), b.out);
  return cudaGetLastError();
}

}  // namespace variants::integer_mma_s8
}  // namespace jaxconv
