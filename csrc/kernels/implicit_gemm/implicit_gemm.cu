// The "implicit_gemm" family: jaxconv's channels-last problems on the CUTLASS tensor-core kernels of igemm.h.
//
// jaxconv's channels-last filter is (T, R, S, C, K) (K innermost, as Flax and lax's HWIO); the kernels want
// KTRSC (C innermost, the GEMM's reduction dimension contiguous). So fwd and dgrad first transpose the filter
// into the workspace, and wgrad computes an f32 KTRSC gradient in the workspace and transposes (and casts) it
// into the result. Activations need no conversion: channels-last NDHWC is the kernels' layout. Bias and
// activation are fused into the kernels' fprop epilogues.
// Kernel choice per call: first layers (few input channels, a window) as 1x1 problems on their unrolled window
// (im2col_gemm.cu); 1x1 convolutions as plain GEMMs (gemm1x1_sm90.cu, no staging) on an sm_90 GPU when they
// take the problem; else the Hopper kernels (igemm_sm90.cu) on an sm_90 GPU when they take it (the TF32 data
// gradient with unit strides as the forward with a flipped filter; strided data gradients as one forward per phase,
// scattered into dx), else the mma.sync kernels (igemm_sm80.cu), else the direct kernels (also for empty problems).
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "dispatch/rules.h"
#include "kernels/shared/common.cuh"
#include "kernels/implicit_gemm/igemm.h"

namespace jaxconv {
namespace cuda {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

size_t InBytes(DType in) { return in == DType::kF32 ? 4 : 2; }

// The problem the kernels see: input channels padded to the alignment (ImplicitGemmPaddedC).
IgemmProblem ToProblem(const ConvParams& p, DType in) {
  IgemmProblem pr;
  pr.n = p.n[0];
  pr.c = ImplicitGemmPaddedC(p, static_cast<int>(InBytes(in)));
  pr.k = p.k[0];
  for (int d = 0; d < 3; ++d) {
    pr.in[d] = p.in[d];
    pr.win[d] = p.win[d];
    pr.out[d] = p.out[d];
    pr.pad_lo[d] = p.pad_lo[d];
    pr.pad_hi[d] = p.pad_hi[d];
    pr.stride[d] = p.stride[d];
    pr.dil[d] = p.rhs_dil[d];
  }
  return pr;
}

// The workspace: [filter: fwd/dgrad the KTRSC filter, wgrad the f32 KTRSC gradient (both with the padded c)]
// [padded activations, when c is not aligned: fwd/wgrad x, dgrad dx][kernel workspace].
struct Staging {
  size_t filter = 0, act = 0;
  size_t bytes() const { return filter + act; }
};

Staging StagingOf(const ConvParams& p, Op op, DType in) {
  const int64_t cp = ImplicitGemmPaddedC(p, static_cast<int>(InBytes(in)));
  const size_t wp = static_cast<size_t>(p.k[0] * SpatialCount(p.win) * cp);
  Staging st;
  st.filter = AlignUp(wp * (op == Op::kWgrad ? 4 : InBytes(in)));
  if (cp != p.c[0]) st.act = AlignUp(static_cast<size_t>(p.n[0] * SpatialCount(p.in) * cp) * InBytes(in));
  return st;
}

bool AnyKernel(const IgemmProblem& pr, Op op, IgemmMath math, int64_t algo) {
  return (algo == kAlgoImplicitGemm && IgemmSm90Supports(pr, op, math)) || IgemmSm80Supports(pr, op, math);
}

size_t KernelWorkspaceBytes(const IgemmProblem& pr, Op op, IgemmMath math, int64_t algo) {
  size_t bytes = 0;
  if (algo == kAlgoImplicitGemm && IgemmSm90Supports(pr, op, math)) bytes = IgemmSm90WorkspaceBytes(pr, op, math);
  if (IgemmSm80Supports(pr, op, math)) bytes = std::max(bytes, IgemmSm80WorkspaceBytes(pr, op, math));
  return AlignUp(bytes);
}

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
// flight. The TF32 filter gradient transposes whole activations with it (TrySwappedTf32Wgrad); the scalar kernel
// moved them at about 2.2 TB/s on the H200.
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
// 64x64 tiles, each thread moving 4 elements a row: the filter staging of 16-bit convolutions (FilterToKtrsc). The
// scalar kernel took 7.7 µs for ResNet-50 res5's 3x3x512x512 bf16 filter on the H200 (lax's own transpose: 3.0).
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
    // 16-bit (32-bit) ones, 4x (2x) the store sectors. ncu, H200: with both, res5's 3x3x512x512 filter took 7.8 µs
    // (XLA's 5.3).
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

// (T, R, S, C, K) -> (K, T, R, S, Cp), same dtype: per tap a (C x K) -> (K x C) transpose into rows of Cp
// (the padding channels, c..Cp-1, zeroed first).
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

// f32 (K, T, R, S, Cp) -> (T, R, S, C, K) in the result dtype: per tap a (K x C) -> (C x K) transpose (the
// padding channels' gradients are dropped).
cudaError_t GradFromKtrsc(const ConvParams& p, DType out, int64_t cp, const void* src, void* dw, cudaStream_t s) {
  const int64_t taps = SpatialCount(p.win), c = p.c[0], k = p.k[0];
  switch (out) {
    case DType::kF32: return BatchedTranspose<float, float>(src, dw, k, c, taps, cp, taps * cp, c * k, k, s);
    case DType::kBF16: return BatchedTranspose<float, __nv_bfloat16>(src, dw, k, c, taps, cp, taps * cp, c * k, k, s);
    case DType::kF16: return BatchedTranspose<float, __half>(src, dw, k, c, taps, cp, taps * cp, c * k, k, s);
    default: return cudaErrorInvalidValue;
  }
}

// out[r*ow + j] = j < width ? in[r*iw + j] : 0 for j < ow: pads channel rows with zeros (iw = width < ow) or
// crops them (ow = width < iw). Elements are moved as 16-bit or 32-bit words.
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

cudaError_t DirectFallback(const ConvParams& p, Op op, DType in, DType out, const void* a, const void* b,
                           const void* bias, void* out_buf, cudaStream_t s) {
  switch (op) {
    case Op::kFwd: return DirectFwd(p, in, out, a, b, bias, out_buf, s);
    case Op::kDgrad: return DirectDgrad(p, in, out, a, b, out_buf, s);
    default: return DirectWgrad(p, in, out, a, b, out_buf, nullptr, 1, s);
  }
}

// Whether the Hopper kernels should run a problem they support. Measured on the H100 (ResNet-50 layers, bf16,
// batch 32 and 128, jaxconv.autotune; benchmarks/algorithm_survey.py): the mma.sync kernels' narrow tiles win
// the fprop with short reductions (taps * c < 576, e.g. 1x1 layers that the GEMM path does not take); with
// their 128x64 tiles the Hopper kernels win k = 64 (fprop) and c = 64 (dgrad) (DEVICE_RUNS run 44: res2 3x3 b128
// fwd 180 vs 230 µs, dgrad 169 vs 222) and every filter gradient. Below 64 channels (not re-measured with the
// 128x64 tiles) the mma.sync kernels keep the problem.
bool PreferSm90(const IgemmProblem& pr, Op op) {
  switch (op) {
    case Op::kFwd: return pr.k >= 64 && pr.c * pr.win[0] * pr.win[1] * pr.win[2] >= 576;
    case Op::kDgrad: return pr.c >= 64;
    default: return true;
  }
}

// Runs the GEMM on the first kernel set that takes it; cudaErrorNotSupported when none does (nothing was
// enqueued then).
cudaError_t RunKernels(const IgemmProblem& pr, Op op, IgemmMath math, int64_t algo, const IgemmArgs& args,
                       cudaStream_t s) {
  const size_t kernel_ws = KernelWorkspaceBytes(pr, op, math, algo);
  if (args.workspace_bytes < kernel_ws) return cudaErrorNotSupported;
  const bool sm80_ok = DeviceArch() >= 80 && IgemmSm80Supports(pr, op, math);
  if (algo == kAlgoImplicitGemm && DeviceArch() == 90 && IgemmSm90Supports(pr, op, math) &&
      (PreferSm90(pr, op) || !sm80_ok)) {
    const cudaError_t e = IgemmSm90Run(pr, op, math, args, s);
    if (e != cudaErrorNotSupported) return e;
  }
  if (sm80_ok) return IgemmSm80Run(pr, op, math, args, s);
  return cudaErrorNotSupported;
}

// 1x1 convolutions on Hopper: plain GEMMs on the caller's buffers (gemm1x1_sm90.cu), except the TF32 forward's
// filter, transposed to (K, C) first (wgmma reads TF32 K-major only). Its workspace does not depend on `out`
// (wgrad: f32 partial sums either way), so the size is asked with out = in.
// Layout: [TF32 fwd: w^T][the GEMM's own workspace].
size_t Gemm1x1FilterBytes(const ConvParams& p, Op op, DType in) {
  return op == Op::kFwd && in == DType::kF32 ? AlignUp(static_cast<size_t>(p.c[0] * p.k[0]) * 4) : 0;
}

size_t Gemm1x1WorkspaceBytes(const ConvParams& p, Op op, DType in, int64_t algo) {
  if (algo != kAlgoImplicitGemm || !Gemm1x1Sm90Supports(p, op, in, in)) return 0;
  return Gemm1x1FilterBytes(p, op, in) + Gemm1x1Sm90WorkspaceBytes(p, op, in, in);
}

// cudaErrorNotSupported: not taken (nothing enqueued), the caller runs the conv kernels.
cudaError_t TryGemm1x1(const ConvParams& p, Op op, DType in, DType out, int64_t algo, const void* a, const void* b,
                       const void* bias, void* out_buf, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  if (algo != kAlgoImplicitGemm || DeviceArch() != 90 || !Gemm1x1Sm90Supports(p, op, in, out)) {
    return cudaErrorNotSupported;
  }
  const size_t filter = Gemm1x1FilterBytes(p, op, in);
  const size_t need = filter + Gemm1x1Sm90WorkspaceBytes(p, op, in, out);
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) return cudaErrorNotSupported;
  if (filter > 0) {
    if (const cudaError_t e = FilterToKtrsc(p, in, p.c[0], b, workspace, s); e != cudaSuccess) return e;
    b = workspace;
    workspace = static_cast<char*>(workspace) + filter;
    workspace_bytes -= filter;
  }
  return Gemm1x1Sm90Run(p, op, in, out, a, b, bias, out_buf, workspace, workspace_bytes, s);
}

// ---- the float32 DEFAULT (TF32) data gradient with unit strides, as a Hopper forward ----
// The Hopper kernels have no TF32 dgrad (wgmma reads TF32 operands K-major only; dgrad's filter operand is
// MN-major), so it would run on the mma.sync kernels. With unit strides the data gradient is the forward of dy
// with the flipped filter, output channel c and input channel k: dx[i] = sum_f dy[i - P' + f d] * w'[f] with
// w'[c][f][k] = w[F-1-f][c][k] (already the forward's KTRSC layout) and pads P' = (win - 1) d - pads.

// The sub-filters of data gradients run as forwards (this one and the strided phases below): per phase, the taps
// first + (count - 1 - j) * step (j < count) of each dim, flipped, as the forward's KTRSC filter with output channels
// C and input channels K: out[off + ((c * count0 + t) * count1 + r) * count2 + s][:] = w[(t', r', s')][c][:], t' =
// first0 + (count0 - 1 - t) * step0 and so on. Phase blockIdx.y; one thread per 16-byte unit of a row (row16 units:
// K * element size % 16 == 0), 32-bit index arithmetic (taps * c * row16 < 2^31, checked by the caller). The
// unit-stride TF32 data gradient is one phase with step 1.
struct PhaseFilters {
  int first[kMaxScatterPhases][3], count[kMaxScatterPhases][3];
  int64_t offset[kMaxScatterPhases];  // the phase's first row
  int win[3], step[3];
};

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

// Phases 0..phases-1 of f; cudaErrorNotSupported (nothing launched) when the 32-bit indices could overflow.
cudaError_t LaunchPhaseFilters(const ConvParams& p, const PhaseFilters& f, int phases, int64_t row_bytes,
                               const void* w, void* out, cudaStream_t s) {
  const int64_t units = SpatialCount(p.win) * p.c[0] * (row_bytes / 16);  // all phases: each tap is in one
  if (units > INT32_MAX || row_bytes % 16 != 0) return cudaErrorNotSupported;
  const dim3 grid(GridX(std::min<int64_t>(CeilDiv(CeilDiv(units, phases), 256), kPlanSms * 8)), unsigned(phases));
  PhaseFilterKernel<<<grid, 256, 0, s>>>(static_cast<const uint4*>(w), static_cast<uint4*>(out), f, int(p.c[0]),
                                         int(row_bytes / 16));
  return cudaGetLastError();
}

// The forward of a data gradient, dy (N, Z, P, Q, K) -> dx's rows of one phase per dim, C channels: `taps` taps of
// dilation `dil` (the phase's sub-filter, flipped), pads lo and hi, `out` rows.
struct PhaseDim {
  int64_t first = 0, taps = 0, lo = 0, hi = 0, out = 0, dil = 1;  // first: the phase's first tap (PhaseFilters)
};

IgemmProblem PhaseProblem(const ConvParams& p, const PhaseDim ph[3]) {
  IgemmProblem pr;
  pr.n = p.n[0];
  pr.c = p.k[0];
  pr.k = p.c[0];
  for (int d = 0; d < 3; ++d) {
    pr.in[d] = p.out[d];
    pr.win[d] = ph[d].taps;
    pr.out[d] = ph[d].out;
    pr.pad_lo[d] = ph[d].lo;
    pr.pad_hi[d] = ph[d].hi;
    pr.stride[d] = 1;
    pr.dil[d] = ph[d].dil;
  }
  return pr;
}

// Unit strides: one phase, every tap flipped, pads (win - 1) dil - pads.
IgemmProblem FlippedDgradProblem(const ConvParams& p) {
  PhaseDim ph[3];
  for (int d = 0; d < 3; ++d) {
    ph[d].taps = p.win[d];
    ph[d].out = p.in[d];
    ph[d].lo = (p.win[d] - 1) * p.rhs_dil[d] - p.pad_lo[d];
    ph[d].hi = (p.win[d] - 1) * p.rhs_dil[d] - p.pad_hi[d];
    ph[d].dil = p.rhs_dil[d];
  }
  return PhaseProblem(p, ph);
}

// ---- the float32 DEFAULT (TF32) filter gradient of 1-D and 2-D problems, as a Hopper forward with swapped roles ----
// Both of the filter gradient's GEMM operands (x and dy, channels innermost) are MN-major, which wgmma does not read
// in TF32, so the Hopper kernels have no TF32 filter gradient and it would run on the mma.sync kernels. Swapping the
// roles of batch and channels makes it a forward with K-major operands: with x' = x as (C, H, W, N) and dy' = dy as
// (K, P, Q, N),
//   dw[r][s][c][k] = sum_{p,q,n} x'[c][r*dil + p*stride - pad][s*dil + q*stride - pad][n] * dy'[k][p][q][n],
// the forward of batch C, input channels N, output channels K over a P x Q window (its dilation the stride, its
// stride the dilation) to an R x S output, which the large-window kernel (rank 2) writes batch-inner: dw's (R, S, C,
// K) layout. Costs two transposes (x and dy once each) in the workspace.
IgemmProblem SwappedWgradProblem(const ConvParams& p) {
  IgemmProblem pr;
  pr.n = p.c[0];
  pr.c = p.n[0];
  pr.k = p.k[0];
  for (int d = 0; d < 3; ++d) {
    pr.in[d] = p.in[d];
    pr.win[d] = p.out[d];
    pr.out[d] = p.win[d];
    pr.stride[d] = p.rhs_dil[d];
    pr.dil[d] = p.stride[d];
    pr.pad_lo[d] = p.pad_lo[d];
    // The upper pad that makes the output exactly the window: the last position read, (win-1)*dil + (out-1)*stride
    // - pad_lo, is in - 1 + pad_hi. Negative (declined) when the convolution never reads its last inputs.
    pr.pad_hi[d] = (p.win[d] - 1) * p.rhs_dil[d] + (p.out[d] - 1) * p.stride[d] + 1 - p.in[d] - p.pad_lo[d];
  }
  return pr;
}

// Workspace layout: [x' (C, D, H, W, N)][dy' (K, Z, P, Q, N)][the kernel's split slices].
struct SwappedWgradLayout {
  size_t x = 0, dy = 0, kernel = 0;
  size_t bytes() const { return x + dy + kernel; }
};

SwappedWgradLayout SwappedWgradLayoutOf(const ConvParams& p) {
  SwappedWgradLayout l;
  l.x = AlignUp(static_cast<size_t>(XElements(p)) * 4);
  l.dy = AlignUp(static_cast<size_t>(YElements(p)) * 4);
  l.kernel = AlignUp(IgemmSm90LargeWindowWorkspaceBytes(SwappedWgradProblem(p)));
  return l;
}

// At most this much workspace for the transposed operands (x and dy): XLA reserves it for the whole program.
constexpr size_t kMaxSwappedStaging = size_t(2) << 30;

// Pure host code (the workspace size depends on it): whether the TF32 filter gradient takes the swapped forward.
bool SwappedWgradApplies(const ConvParams& p, DType in, int64_t algo) {
  if (algo != kAlgoImplicitGemm || in != DType::kF32 || MathFor(p, in) != IgemmMath::kTF32) return false;
  if (p.n[0] % 4 != 0 || p.k[0] % 4 != 0) return false;  // 16-byte rows of x', dy' and dw
  if (p.n[0] > int64_t(65535) * 32) return false;          // BatchedTranspose's grid
  if (static_cast<size_t>(XElements(p) + YElements(p)) * 4 > kMaxSwappedStaging) return false;
  return IgemmSm90LargeWindowSupports(SwappedWgradProblem(p));
}

// cudaErrorNotSupported: not taken, the caller runs the wgrad kernels (the transposes may have run by then: they
// write the workspace only).
cudaError_t TrySwappedTf32Wgrad(const ConvParams& p, DType in, DType out, int64_t algo, const void* x, const void* dy,
                                void* dw, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  if (out != DType::kF32 || DeviceArch() != 90 || !SwappedWgradApplies(p, in, algo)) return cudaErrorNotSupported;
  const SwappedWgradLayout l = SwappedWgradLayoutOf(p);
  if (workspace == nullptr || workspace_bytes < l.bytes()) return cudaErrorNotSupported;
  char* xt = static_cast<char*>(workspace);
  char* dyt = xt + l.x;
  const int64_t n = p.n[0], c = p.c[0], k = p.k[0], in_px = SpatialCount(p.in), out_px = SpatialCount(p.out);
  // (N, pixels, ch) -> (ch, pixels, N): per pixel an (N x ch) -> (ch x N) transpose.
  cudaError_t e = BatchedTranspose<float, float>(x, xt, n, c, in_px, c, in_px * c, n, in_px * n, s);
  if (e != cudaSuccess) return e;
  if ((e = BatchedTranspose<float, float>(dy, dyt, n, k, out_px, k, out_px * k, n, out_px * n, s)) != cudaSuccess) {
    return e;
  }
  IgemmArgs args;
  args.a = xt;
  args.b = dyt;
  args.out = dw;
  args.workspace = dyt + l.dy;
  args.workspace_bytes = workspace_bytes - l.x - l.dy;
  // y' (batch c, output t, r, s, channels k) comes batch-inner: dw's (T, R, S, C, K)
  return IgemmSm90LargeWindowRun(SwappedWgradProblem(p), args, s);
}

// Workspace of the staged conv-kernel path; 0: it runs on the direct kernels. The TF32 data gradient may run as
// the flipped forward (TryFlippedTf32Dgrad) and the TF32 filter gradient as the swapped one (TrySwappedTf32Wgrad);
// their workspaces count too.
size_t ConvPathBytes(const ConvParams& p, Op op, DType in, int64_t algo) {
  if (in != DType::kF32 && in != DType::kBF16 && in != DType::kF16) return 0;
  const IgemmProblem pr = ToProblem(p, in);
  const IgemmMath math = MathFor(p, in);
  if (!AnyKernel(pr, op, math, algo)) return 0;
  size_t kernel = KernelWorkspaceBytes(pr, op, math, algo);
  if (op == Op::kDgrad && math == IgemmMath::kTF32 && algo == kAlgoImplicitGemm) {
    kernel = std::max(kernel, AlignUp(IgemmSm90WorkspaceBytes(FlippedDgradProblem(p), Op::kFwd, math)));
  }
  size_t bytes = StagingOf(p, op, in).bytes() + kernel;
  if (op == Op::kWgrad && SwappedWgradApplies(p, in, algo)) {
    bytes = std::max(bytes, SwappedWgradLayoutOf(p).bytes());
  }
  return bytes;
}

// cudaErrorNotSupported: not taken, the caller runs the dgrad kernels (the flipped filter may have been written to
// the workspace by then; the caller's staging overwrites it).
cudaError_t TryFlippedTf32Dgrad(const ConvParams& p, DType in, DType out, int64_t algo, const void* dy, const void* w,
                                void* dx, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  if (algo != kAlgoImplicitGemm || in != DType::kF32 || out != DType::kF32 || MathFor(p, in) != IgemmMath::kTF32 ||
      DeviceArch() != 90 || p.c[0] % 4 != 0) {  // c % 4: the forward writes 16-byte dx rows
    return cudaErrorNotSupported;
  }
  for (int d = 0; d < 3; ++d) {
    if (p.stride[d] != 1 || (p.win[d] - 1) * p.rhs_dil[d] < std::max(p.pad_lo[d], p.pad_hi[d])) {
      return cudaErrorNotSupported;
    }
  }
  const IgemmProblem pr = FlippedDgradProblem(p);
  if (!IgemmSm90Supports(pr, Op::kFwd, IgemmMath::kTF32) || !PreferSm90(pr, Op::kFwd)) {
    return cudaErrorNotSupported;
  }
  if (!Aligned16(w) || p.k[0] % 4 != 0) return cudaErrorNotSupported;  // PhaseFilterKernel's 16-byte rows
  const size_t fbytes = StagingOf(p, Op::kDgrad, in).filter;  // the staged filter's slot (c % 4 == 0: unpadded)
  const size_t kernel_ws = IgemmSm90WorkspaceBytes(pr, Op::kFwd, IgemmMath::kTF32);
  if (workspace == nullptr || workspace_bytes < fbytes + kernel_ws) {
    return cudaErrorNotSupported;
  }
  PhaseFilters f{};  // one phase: every tap, flipped
  for (int d = 0; d < 3; ++d) {
    f.count[0][d] = f.win[d] = static_cast<int>(p.win[d]);  // < 256 (the Hopper forward's window)
    f.step[d] = 1;
  }
  if (const cudaError_t e = LaunchPhaseFilters(p, f, 1, p.k[0] * 4, w, workspace, s); e != cudaSuccess) return e;
  IgemmArgs args;
  args.a = dy;
  args.b = workspace;
  args.out = dx;
  args.out_type = IgemmOut::kSame;
  args.workspace = static_cast<char*>(workspace) + fbytes;
  args.workspace_bytes = workspace_bytes - fbytes;
  return IgemmSm90Run(pr, Op::kFwd, IgemmMath::kTF32, args, s);
}

// ---- strided data gradients (dilation 1) as Hopper forwards, one per phase ----
// With stride s in a dim, dx's rows h = i s + a (phase a < s) receive only the taps r = a + pad_lo (mod s):
//   dx[i s + a] = sum_{j < taps_a} dy[i + off - j] w[r0 + j s],  r0 = (a + pad_lo) mod s,  off = (a + pad_lo - r0) / s,
// taps_a = ceil((R - r0) / s): the unit-stride forward of dy with those taps flipped (PhaseFilterKernel), pads
// lo = taps_a - 1 - off and hi = out_a - P - lo + taps_a - 1 (out_a = ceil((H - a) / s) rows), written to every s-th
// row of dx from row a (IgemmSm90ScatterFwdRun). No MMA is spent on the zeros of the dilated dy, as in the mma.sync
// strided kernel, but on wgmma. Each tap is in exactly one phase: the sub-filters together fill the staged filter's
// slot.

// Phase a of dim d (pads >= 0); taps or out 0 when it has none.
PhaseDim PhaseOf(const ConvParams& p, int d, int64_t a) {
  const int64_t s = p.stride[d], r0 = (a + p.pad_lo[d]) % s;
  PhaseDim ph;
  ph.first = r0;
  ph.taps = p.win[d] > r0 ? CeilDiv(p.win[d] - r0, s) : 0;
  ph.out = p.in[d] > a ? CeilDiv(p.in[d] - a, s) : 0;
  ph.lo = ph.taps - 1 - (a + p.pad_lo[d] - r0) / s;
  ph.hi = ph.out - p.out[d] - ph.lo + ph.taps - 1;
  return ph;
}

// The phases of a strided data gradient, most taps first (each later launch fills the previous one's tail); count 0
// when no stride is over 1, there are more than kMaxScatterPhases, a dilation is not 1, or a phase has no taps, no
// rows or a negative pad. start: dx's first row of the phase per dim.
struct Phases {
  int count = 0;
  PhaseDim dim[kMaxScatterPhases][3];
  int64_t start[kMaxScatterPhases][3];
  IgemmProblem pr[kMaxScatterPhases];
};

Phases PhasesOf(const ConvParams& p) {
  Phases r;
  int64_t n = 1;
  for (int d = 0; d < 3; ++d) {
    if (p.rhs_dil[d] != 1 || p.pad_lo[d] < 0 || p.pad_hi[d] < 0 || p.stride[d] < 1) return r;
    n *= p.stride[d];
  }
  if (n < 2 || n > kMaxScatterPhases) return r;
  int64_t taps[kMaxScatterPhases];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a[3] = {i / (p.stride[1] * p.stride[2]), i / p.stride[2] % p.stride[1], i % p.stride[2]};
    taps[i] = 1;
    for (int d = 0; d < 3; ++d) {
      r.start[i][d] = a[d];
      r.dim[i][d] = PhaseOf(p, d, a[d]);
      const PhaseDim& ph = r.dim[i][d];
      if (ph.taps < 1 || ph.out < 1 || ph.lo < 0 || ph.hi < 0) return r;
      taps[i] *= ph.taps;
    }
  }
  // Insertion sort by taps, descending (stable).
  for (int64_t i = 1; i < n; ++i) {
    for (int64_t j = i; j > 0 && taps[j] > taps[j - 1]; --j) {
      std::swap(taps[j], taps[j - 1]);
      std::swap(r.dim[j], r.dim[j - 1]);
      std::swap(r.start[j], r.start[j - 1]);
    }
  }
  for (int64_t i = 0; i < n; ++i) r.pr[i] = PhaseProblem(p, r.dim[i]);
  r.count = static_cast<int>(n);
  return r;
}

// Pure host code: the phases when the data gradient runs as them (PhasesOf's, which the Hopper scatter forward takes;
// c >= 64 as PreferSm90's dgrad), else count 0.
Phases PhasedDgradPlan(const ConvParams& p, DType in, int64_t algo) {
  if (algo != kAlgoImplicitGemm || (in != DType::kF32 && in != DType::kBF16 && in != DType::kF16)) return Phases{};
  const IgemmMath math = MathFor(p, in);
  if (math == IgemmMath::k3xTF32) return Phases{};
  const int64_t align = in == DType::kF32 ? 4 : 8;  // 16-byte rows of dy, the sub-filters and dx
  if (p.c[0] % align != 0 || p.k[0] % align != 0 || !PreferSm90(ToProblem(p, in), Op::kDgrad)) return Phases{};
  const Phases ph = PhasesOf(p);
  return ph.count > 0 && IgemmSm90ScatterFwdSupports(ph.pr, ph.count, math) ? ph : Phases{};
}

// cudaErrorNotSupported: not taken, the caller runs the dgrad kernels (the sub-filters may have been written to the
// workspace by then; the caller's staging overwrites them).
cudaError_t TryPhasedDgrad(const ConvParams& p, DType in, DType out, int64_t algo, const void* dy, const void* w, void* dx,
                           void* workspace, size_t workspace_bytes, cudaStream_t s) {
  if (out != in || DeviceArch() != 90) return cudaErrorNotSupported;
  const Phases ph = PhasedDgradPlan(p, in, algo);
  if (ph.count == 0) return cudaErrorNotSupported;
  const int64_t elem = static_cast<int64_t>(InBytes(in)), c = p.c[0], k = p.k[0];
  const size_t fbytes = static_cast<size_t>(SpatialCount(p.win) * c * k * elem);
  if (workspace == nullptr || workspace_bytes < fbytes || !Aligned16(w) || !Aligned16(dy) || !Aligned16(dx)) {
    return cudaErrorNotSupported;
  }
  PhaseFilters f{};
  IgemmScatterPhase run[kMaxScatterPhases];
  int64_t rows = 0;
  for (int i = 0; i < ph.count; ++i) {
    for (int d = 0; d < 3; ++d) {  // windows < 256 (the Hopper forward's)
      f.first[i][d] = static_cast<int>(ph.dim[i][d].first);
      f.count[i][d] = static_cast<int>(ph.dim[i][d].taps);
    }
    f.offset[i] = rows;
    run[i].pr = ph.pr[i];
    run[i].a = dy;
    run[i].b = static_cast<const char*>(workspace) + rows * k * elem;
    // dx (N, D, H, W, C): the phase's row (n, z, p, q) is dx's (n, z s0 + a0, p s1 + a1, q s2 + a2).
    const int64_t* a = ph.start[i];
    run[i].out = static_cast<char*>(dx) + ((a[0] * p.in[1] + a[1]) * p.in[2] + a[2]) * c * elem;
    rows += ph.dim[i][0].taps * ph.dim[i][1].taps * ph.dim[i][2].taps * c;
  }
  for (int d = 0; d < 3; ++d) {
    f.win[d] = static_cast<int>(p.win[d]);
    f.step[d] = static_cast<int>(p.stride[d]);
  }
  if (const cudaError_t e = LaunchPhaseFilters(p, f, ph.count, k * elem, w, workspace, s); e != cudaSuccess) {
    return e;
  }
  const int64_t hw = p.in[1] * p.in[2];
  const int64_t out_stride[4] = {p.in[0] * hw * c, p.stride[0] * hw * c, p.stride[1] * p.in[2] * c, p.stride[2] * c};
  return IgemmSm90ScatterFwdRun(run, ph.count, MathFor(p, in), out_stride, s);
}

}  // namespace

size_t ImplicitGemmWorkspaceBytes(const ConvParams& p, Op op, DType in, int64_t algo) {
  if (Im2colGemmApplies(p, in)) return Im2colGemmWorkspaceBytes(p, op, in, algo);
  // Both paths: the arch (Hopper: the 1x1 GEMMs) is known at run time only.
  return std::max(ConvPathBytes(p, op, in, algo), Gemm1x1WorkspaceBytes(p, op, in, algo));
}

cudaError_t ImplicitGemmRun(const ConvParams& p, Op op, DType in, DType out, int64_t algo, const void* a,
                            const void* b, const void* bias, void* out_buf, void* workspace,
                            size_t workspace_bytes, cudaStream_t s) {
  if (Im2colGemmApplies(p, in)) {
    const cudaError_t e = Im2colGemmRun(p, op, in, out, algo, a, b, bias, out_buf, workspace, workspace_bytes, s);
    if (e != cudaErrorNotSupported) return e;
  }
  if (const cudaError_t e = TryGemm1x1(p, op, in, out, algo, a, b, bias, out_buf, workspace, workspace_bytes, s);
      e != cudaErrorNotSupported) {
    return e;
  }
  const size_t need = ConvPathBytes(p, op, in, algo);
  const bool fits = workspace != nullptr && workspace_bytes >= need && need > 0;
  const bool same_out = op == Op::kWgrad || out == in;
  if (!fits || !same_out || XElements(p) == 0 || YElements(p) == 0 || WElements(p) == 0) {
    return DirectFallback(p, op, in, out, a, b, bias, out_buf, s);
  }
  if (op == Op::kDgrad) {
    if (const cudaError_t e = TryFlippedTf32Dgrad(p, in, out, algo, a, b, out_buf, workspace, workspace_bytes, s);
        e != cudaErrorNotSupported) {
      return e;
    }
    if (const cudaError_t e = TryPhasedDgrad(p, in, out, algo, a, b, out_buf, workspace, workspace_bytes, s);
        e != cudaErrorNotSupported) {
      return e;
    }
  }
  if (op == Op::kWgrad) {
    if (const cudaError_t e = TrySwappedTf32Wgrad(p, in, out, algo, a, b, out_buf, workspace, workspace_bytes, s);
        e != cudaErrorNotSupported) {
      return e;
    }
  }
  const IgemmProblem pr = ToProblem(p, in);
  const IgemmMath math = MathFor(p, in);
  const Staging st = StagingOf(p, op, in);
  char* filter = static_cast<char*>(workspace);
  char* act = filter + st.filter;  // padded x (fwd, wgrad) or dx (dgrad) when c is not aligned
  const bool padded = pr.c != p.c[0];
  const int64_t pixels = p.n[0] * SpatialCount(p.in);
  IgemmArgs args;
  args.workspace = filter + st.bytes();
  args.workspace_bytes = workspace_bytes - st.bytes();
  args.out_type = IgemmOut::kSame;
  cudaError_t e = cudaSuccess;
  args.a = a;
  if (op != Op::kDgrad && padded) {  // x is fwd's and wgrad's first operand
    if ((e = CopyChannels(in, a, act, pixels, p.c[0], pr.c, p.c[0], s)) != cudaSuccess) return e;
    args.a = act;
  }
  if (op == Op::kWgrad) {
    args.b = b;
    args.out = filter;
    e = RunKernels(pr, op, math, algo, args, s);
    if (e == cudaErrorNotSupported) return DirectFallback(p, op, in, out, a, b, bias, out_buf, s);
    if (e != cudaSuccess) return e;
    return GradFromKtrsc(p, out, pr.c, filter, out_buf, s);
  }
  if ((e = FilterToKtrsc(p, in, pr.c, b, filter, s)) != cudaSuccess) return e;
  args.b = filter;
  args.out = op == Op::kDgrad && padded ? static_cast<void*>(act) : out_buf;
  if (op == Op::kFwd) {  // both kernel sets fuse y = act(acc + bias) into the fprop epilogue
    args.bias = bias;
    args.act = p.activation[0];
  }
  e = RunKernels(pr, op, math, algo, args, s);
  if (e == cudaErrorNotSupported) return DirectFallback(p, op, in, out, a, b, bias, out_buf, s);
  if (e != cudaSuccess || !(op == Op::kDgrad && padded)) return e;
  return CopyChannels(in, act, out_buf, pixels, pr.c, p.c[0], p.c[0], s);  // drop dx's padding channels
}

}  // namespace cuda
}  // namespace jaxconv
