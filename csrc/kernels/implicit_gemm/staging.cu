// The implicit_gemm family's staging kernels and the staged run of a conv kernel set (staging.h).
#include "kernels/implicit_gemm/staging.h"

#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/implicit_gemm/family.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda::igemm {
namespace {

// out[b*obs + j*ors + i] = in[b*ibs + i*irs + j] for i < rows, j < cols, b < batch: a batch of 2-D transposes
// through a padded shared tile (coalesced reads and writes), with a dtype conversion.
constexpr int kTile = 32, kTileRows = 8;  // blocks of kTile x kTileRows threads
template <class TI, class TO>
__global__ void __launch_bounds__(kTile * kTileRows)
    BatchedTransposeKernel(const TI* __restrict__ in, TO* __restrict__ out, int64_t rows, int64_t cols, int64_t batch,
                           int64_t ibs, int64_t irs, int64_t obs, int64_t ors) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTile, j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    // All loads before the shared stores (as BatchedTranspose16x4Kernel): one DRAM latency per tile, not per row.
    float v[kTile / kTileRows];
#pragma unroll
    for (int u = 0; u < kTile / kTileRows; ++u) {
      const int64_t i = i0 + threadIdx.y + u * kTileRows, j = j0 + threadIdx.x;
      v[u] = i < rows && j < cols ? ToAcc(in[b * ibs + i * irs + j]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kTile / kTileRows; ++u) tile[threadIdx.y + u * kTileRows][threadIdx.x] = v[u];
    __syncthreads();
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t j = j0 + r, i = i0 + threadIdx.x;
      if (i < rows && j < cols) out[b * obs + j * ors + i] = FromAcc<TO>(tile[threadIdx.x][r]);
    }
    __syncthreads();
  }
}

// The float-to-float case with 16-byte accesses (every extent, stride and pointer a multiple of 4 floats), kVecBatch
// batches per block: each thread issues one 16-byte load of each batch before storing any, so more bytes are in
// flight. The swapped TF32 filter gradient transposes whole activations with it (swapped_wgrad_sm90.cu), faster than
// the scalar kernel moved them.
constexpr int kVecBatch = 4;
__global__ void __launch_bounds__(256) BatchedTransposeF32x4Kernel(const float* __restrict__ in,
                                                                   float* __restrict__ out, int64_t rows,
                                                                   int64_t cols, int64_t batch, int64_t ibs,
                                                                   int64_t irs, int64_t obs, int64_t ors) {
  __shared__ float tile[kVecBatch][kTile][kTile + 1];
  const int r = threadIdx.x >> 3, q = (threadIdx.x & 7) * 4;  // a tile row (load) or column (store); 4 elements
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTile, j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t b0 = static_cast<int64_t>(blockIdx.z) * kVecBatch; b0 < batch;
       b0 += static_cast<int64_t>(gridDim.z) * kVecBatch) {
    float4 v[kVecBatch];
#pragma unroll
    for (int u = 0; u < kVecBatch; ++u) {
      const int64_t b = b0 + u, i = i0 + r, j = j0 + q;
      v[u] = b < batch && i < rows && j < cols ? *reinterpret_cast<const float4*>(in + b * ibs + i * irs + j)
                                               : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kVecBatch; ++u) {
      tile[u][r][q] = v[u].x;
      tile[u][r][q + 1] = v[u].y;
      tile[u][r][q + 2] = v[u].z;
      tile[u][r][q + 3] = v[u].w;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kVecBatch; ++u) {
      const int64_t b = b0 + u, j = j0 + r, i = i0 + q;
      if (b < batch && j < cols && i < rows) {
        __stwb(reinterpret_cast<float4*>(out + b * obs + j * ors + i),  // __stwb: a plain store was split in four
               make_float4(tile[u][q][r], tile[u][q + 1][r], tile[u][q + 2][r], tile[u][q + 3][r]));
      }
    }
    __syncthreads();
  }
}

// 16-bit to the same 16-bit type with 8-byte accesses (every extent, stride and pointer a multiple of 4 elements),
// 64x64 tiles, each thread moving 4 elements a row: the filter staging of 16-bit convolutions (FilterToKtrsc), where
// the scalar kernel took more than twice lax's own transpose.
constexpr int kTile16 = 64;
__global__ void __launch_bounds__(256) BatchedTranspose16x4Kernel(const unsigned short* __restrict__ in,
                                                                  unsigned short* __restrict__ out, int64_t rows,
                                                                  int64_t cols, int64_t batch, int64_t ibs,
                                                                  int64_t irs, int64_t obs, int64_t ors) {
  __shared__ unsigned short tile[kTile16][kTile16 + 2];  // +2: the column reads below see 2-way bank conflicts
  const int r0 = threadIdx.x >> 4, q = (threadIdx.x & 15) * 4;  // 16 threads x 4 elements a 64-wide row
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTile16, j0 = static_cast<int64_t>(blockIdx.x) * kTile16;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    // Rows i = i0 + r0 + 16u of the input, 4 consecutive j each. Every load is issued before the first shared
    // store: a store right after its load holds the warp (in-order issue) for a whole DRAM latency, four times over.
    // The elements travel as 32-bit words and leave with __stwb: the compiler split plain ushort4 (uint2) stores into
    // 16-bit (32-bit) ones, 4x (2x) the store sectors (ncu).
    uint2 v[kTile16 / 16];
#pragma unroll
    for (int u = 0; u < kTile16 / 16; ++u) {
      const int64_t i = i0 + r0 + 16 * u, j = j0 + q;  // cols % 4 == 0: j + 3 < cols when j < cols
      v[u] = i < rows && j < cols ? *reinterpret_cast<const uint2*>(in + b * ibs + i * irs + j) : make_uint2(0, 0);
    }
#pragma unroll
    for (int u = 0; u < kTile16 / 16; ++u) {
      uint32_t* row = reinterpret_cast<uint32_t*>(&tile[r0 + 16 * u][q]);  // 4-byte aligned: 132-byte rows, q % 4 == 0
      row[0] = v[u].x;
      row[1] = v[u].y;
    }
    __syncthreads();
    for (int r = r0; r < kTile16; r += 16) {  // rows j of the output, 4 consecutive i each
      const int64_t j = j0 + r, i = i0 + q;
      if (j < cols && i < rows) {
        const uint2 w = make_uint2(tile[q][r] | uint32_t(tile[q + 1][r]) << 16,
                                   tile[q + 2][r] | uint32_t(tile[q + 3][r]) << 16);
        __stwb(reinterpret_cast<uint2*>(out + b * obs + j * ors + i), w);
      }
    }
    __syncthreads();
  }
}

template <class TI, class TO>
cudaError_t BatchedTranspose(const void* in, void* out, int64_t rows, int64_t cols, int64_t batch, int64_t ibs,
                             int64_t irs, int64_t obs, int64_t ors, cudaStream_t s) {
  if (rows == 0 || cols == 0 || batch == 0) return cudaSuccess;
  const int64_t gx = CeilDiv(cols, kTile), gy = CeilDiv(rows, kTile);
  if (gx > (int64_t(1) << 31) - 1 || gy > 65535) return cudaErrorInvalidValue;  // ImplicitGemmApplies bounds
  // The vector kernels move 4 elements at a time: every extent and stride a multiple of 4.
  [[maybe_unused]] const bool by4 =
      rows % 4 == 0 && cols % 4 == 0 && ibs % 4 == 0 && irs % 4 == 0 && obs % 4 == 0 && ors % 4 == 0;
  if constexpr (std::is_same_v<TI, float> && std::is_same_v<TO, float>) {
    if (by4 && Aligned16(in) && Aligned16(out)) {
      const int64_t gz = CeilDiv(batch, kVecBatch);
      const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                      static_cast<unsigned>(gz < 65535 ? gz : 65535));
      BatchedTransposeF32x4Kernel<<<grid, 256, 0, s>>>(static_cast<const float*>(in), static_cast<float*>(out), rows,
                                                      cols, batch, ibs, irs, obs, ors);
      return cudaGetLastError();
    }
  }
  if constexpr (sizeof(TI) == 2 && std::is_same_v<TI, TO>) {
    const bool aligned = reinterpret_cast<uintptr_t>(in) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
    const int64_t gx16 = CeilDiv(cols, kTile16), gy16 = CeilDiv(rows, kTile16);
    if (by4 && aligned) {
      const dim3 grid(static_cast<unsigned>(gx16), static_cast<unsigned>(gy16),
                      static_cast<unsigned>(batch < 65535 ? batch : 65535));
      BatchedTranspose16x4Kernel<<<grid, 256, 0, s>>>(static_cast<const unsigned short*>(in),
                                                      static_cast<unsigned short*>(out), rows, cols, batch, ibs, irs,
                                                      obs, ors);
      return cudaGetLastError();
    }
  }
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                  static_cast<unsigned>(batch < 65535 ? batch : 65535));
  BatchedTransposeKernel<TI, TO><<<grid, dim3(kTile, kTileRows), 0, s>>>(
      static_cast<const TI*>(in), static_cast<TO*>(out), rows, cols, batch, ibs, irs, obs, ors);
  return cudaGetLastError();
}

}  // namespace

cudaError_t FilterToKtrsc(const ConvParams& p, DType in, int64_t cp, const void* w, void* dst, cudaStream_t s) {
  const int64_t taps = SpatialCount(p.win), c = p.c[0], k = p.k[0];
  if (cp != c) {
    if (cudaError_t e = cudaMemsetAsync(dst, 0, static_cast<size_t>(k * taps * cp) * InBytes(in), s); e != cudaSuccess) {
      return e;
    }
  }
  if (in == DType::kF32) return BatchedTranspose<float, float>(w, dst, c, k, taps, c * k, k, cp, taps * cp, s);
  if (in == DType::kBF16) {
    return BatchedTranspose<__nv_bfloat16, __nv_bfloat16>(w, dst, c, k, taps, c * k, k, cp, taps * cp, s);
  }
  return BatchedTranspose<__half, __half>(w, dst, c, k, taps, c * k, k, cp, taps * cp, s);
}

cudaError_t GradFromKtrsc(const ConvParams& p, DType out, int64_t cp, const void* src, void* dw, cudaStream_t s) {
  const int64_t taps = SpatialCount(p.win), c = p.c[0], k = p.k[0];
  switch (out) {
    case DType::kF32: return BatchedTranspose<float, float>(src, dw, k, c, taps, cp, taps * cp, c * k, k, s);
    case DType::kBF16: return BatchedTranspose<float, __nv_bfloat16>(src, dw, k, c, taps, cp, taps * cp, c * k, k, s);
    case DType::kF16: return BatchedTranspose<float, __half>(src, dw, k, c, taps, cp, taps * cp, c * k, k, s);
    default: return cudaErrorInvalidValue;
  }
}

namespace {
// CopyChannels' elements, moved as 16-bit or 32-bit words.
template <class T>
__global__ void CopyChannelsKernel(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t iw,
                                   int64_t ow, int64_t width) {
  const int64_t count = rows * ow;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / ow, j = e - r * ow;
    out[e] = j < width ? in[r * iw + j] : T(0);
  }
}
}  // namespace

cudaError_t CopyChannels(DType in, const void* src, void* dst, int64_t rows, int64_t iw, int64_t ow, int64_t width,
                         cudaStream_t s) {
  const int64_t count = rows * ow;
  if (count == 0) return cudaSuccess;
  const unsigned grid = GridX(std::min<int64_t>(CeilDiv(count, 256), kPlanSms * 16));
  if (in == DType::kF32) {
    CopyChannelsKernel<<<grid, 256, 0, s>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), rows,
                                            iw, ow, width);
  } else {
    CopyChannelsKernel<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), rows,
                                            iw, ow, width);
  }
  return cudaGetLastError();
}

cudaError_t TransposeF32(const void* in, void* out, int64_t rows, int64_t cols, int64_t batch, int64_t ibs,
                         int64_t irs, int64_t obs, int64_t ors, cudaStream_t s) {
  return BatchedTranspose<float, float>(in, out, rows, cols, batch, ibs, irs, obs, ors, s);
}

namespace {
// Phase blockIdx.y of PhaseFilters; one thread per 16-byte unit of a row (row16 units: K * element size % 16 == 0),
// 32-bit index arithmetic (taps * c * row16 < 2^31, checked by the launcher).
__global__ void PhaseFilterKernel(const uint4* __restrict__ w, uint4* __restrict__ out, PhaseFilters f, int c,
                                  int row16) {
  const int ph = blockIdx.y;
  const int* first = f.first[ph];
  const int* count = f.count[ph];
  const int taps = count[0] * count[1] * count[2], units = taps * c * row16;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < units; e += gridDim.x * blockDim.x) {
    const int row = e / row16, j = e - row * row16;
    const int s = row % count[2], r = row / count[2] % count[1], t = row / (count[1] * count[2]) % count[0];
    const int cc = row / taps;
    const int ts = first[0] + (count[0] - 1 - t) * f.step[0], rs = first[1] + (count[1] - 1 - r) * f.step[1],
              ss = first[2] + (count[2] - 1 - s) * f.step[2];
    const int64_t src = ((int64_t(ts) * f.win[1] + rs) * f.win[2] + ss) * c + cc;
    out[(f.offset[ph] + row) * row16 + j] = w[src * row16 + j];
  }
}

}  // namespace

cudaError_t LaunchPhaseFilters(const ConvParams& p, const PhaseFilters& f, int phases, int64_t row_bytes,
                               const void* w, void* out, cudaStream_t s) {
  const int64_t units = SpatialCount(p.win) * p.c[0] * (row_bytes / 16);  // all phases: each tap is in one
  if (units > INT32_MAX || row_bytes % 16 != 0) return cudaErrorNotSupported;
  const dim3 grid(GridX(std::min<int64_t>(CeilDiv(CeilDiv(units, phases), 256), kPlanSms * 8)), unsigned(phases));
  PhaseFilterKernel<<<grid, 256, 0, s>>>(static_cast<const uint4*>(w), static_cast<uint4*>(out), f, int(p.c[0]),
                                         int(row_bytes / 16));
  return cudaGetLastError();
}

cudaError_t RunStaged(const Problem& pr, const Buffers& b, ConvKernelRun run, cudaStream_t s) {
  const ConvParams& p = pr.p;
  const Op op = pr.op;
  const DType in = pr.in;
  const IgemmProblem ip = ToProblem(p, in);
  const IgemmMath math = MathFor(p, in);
  const Staging st = StagingOf(p, op, in);
  if (b.ws == nullptr || b.ws_bytes < st.bytes()) return cudaErrorInvalidValue;
  char* filter = static_cast<char*>(b.ws);
  char* act = filter + st.filter;  // padded x (fwd, wgrad) or dx (dgrad) when c is not aligned
  char* out = act + st.act;        // y (fwd) or dy (dgrad, wgrad) with the padded k, when k is not aligned
  char* bias = out + st.out;       // fwd's bias padded to k, when k is not aligned and there is a bias
  const bool padded = ip.c != p.c[0], padded_k = ip.k != p.k[0];
  const bool has_bias = op == Op::kFwd && p.has_bias[0] && b.bias != nullptr;
  const int64_t pixels = p.n[0] * SpatialCount(p.in), out_pixels = p.n[0] * SpatialCount(p.out);
  IgemmArgs args;
  args.workspace = filter + st.bytes();
  args.workspace_bytes = b.ws_bytes - st.bytes();
  args.out_type = IgemmOut::kSame;
  // x is fwd's and wgrad's first operand, dy dgrad's first and wgrad's second.
  args.a = op != Op::kDgrad && padded ? static_cast<const void*>(act) : op == Op::kDgrad && padded_k ? out : b.a;
  args.b = op == Op::kWgrad ? (padded_k ? static_cast<const void*>(out) : b.b) : filter;
  args.out = op == Op::kWgrad                 ? static_cast<void*>(filter)
             : op == Op::kDgrad && padded     ? act
             : op == Op::kFwd && padded_k     ? out
                                              : b.out;
  if (op == Op::kFwd) {  // both kernel sets fuse y = act(acc + bias) into the fprop epilogue
    args.bias = has_bias && padded_k ? bias : b.bias;
    args.act = p.activation[0];
  }
  // The kernels' 16-byte accesses to the caller's buffers they read or write directly.
  if (!Aligned16(args.a) || !Aligned16(args.b) || !Aligned16(args.out) || !Aligned16(args.bias)) {
    return cudaErrorMisalignedAddress;
  }
  cudaError_t e = cudaSuccess;
  if (op != Op::kDgrad && padded) {
    if ((e = CopyChannels(in, b.a, act, pixels, p.c[0], ip.c, p.c[0], s)) != cudaSuccess) return e;
  }
  if (op != Op::kFwd && padded_k) {  // dy's padding channels zeroed: they meet the padding rows of the filter
    const void* dy = op == Op::kDgrad ? b.a : b.b;
    if ((e = CopyChannels(in, dy, out, out_pixels, p.k[0], ip.k, p.k[0], s)) != cudaSuccess) return e;
  }
  if (op == Op::kWgrad) {  // the f32 gradient's rows past k (the padding channels of dy) are not read back
    if ((e = run(ip, op, math, args, s)) != cudaSuccess) return e;
    return GradFromKtrsc(p, pr.out, ip.c, filter, b.out, s);
  }
  if (padded_k) {
    // FilterToKtrsc writes rows 0..k-1; the padding rows must be zeros (not whatever the workspace held, which could
    // be NaN and poison dx through 0 * NaN).
    const size_t row = static_cast<size_t>(SpatialCount(p.win) * ip.c) * InBytes(in);
    if ((e = cudaMemsetAsync(filter + row * p.k[0], 0, row * (ip.k - p.k[0]), s)) != cudaSuccess) return e;
    if (has_bias && (e = CopyChannels(in, b.bias, bias, 1, p.k[0], ip.k, p.k[0], s)) != cudaSuccess) return e;
  }
  if ((e = FilterToKtrsc(p, in, ip.c, b.b, filter, s)) != cudaSuccess) return e;
  if ((e = run(ip, op, math, args, s)) != cudaSuccess) return e;
  if (op == Op::kFwd && padded_k) return CopyChannels(in, out, b.out, out_pixels, ip.k, p.k[0], p.k[0], s);
  if (op == Op::kDgrad && padded) return CopyChannels(in, act, b.out, pixels, ip.c, p.c[0], p.c[0], s);
  return e;
}

}  // namespace cuda::igemm
}  // namespace jaxconv
