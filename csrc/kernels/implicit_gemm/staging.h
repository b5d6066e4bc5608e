// The implicit_gemm family's staging (staging.cu): the layout conversions around the tensor-core kernels (filter to
// KTRSC and back, channel padding, batched transposes, the flipped sub-filters of data gradients run as forwards) and
// the staged run of a conv kernel set, shared by the sm90 and sm80 conv variants.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/types.h"
#include "dispatch/variant.h"
#include "kernels/implicit_gemm/igemm.h"

namespace jaxconv {
namespace cuda::igemm {

// (T, R, S, C, K) -> (K, T, R, S, Cp), same dtype: per tap a (C x K) -> (K x C) transpose into rows of Cp (the
// padding channels, c..Cp-1, zeroed first).
cudaError_t FilterToKtrsc(const ConvParams& p, DType in, int64_t cp, const void* w, void* dst, cudaStream_t s);

// f32 (K, T, R, S, Cp) -> (T, R, S, C, K) in the result dtype: per tap a (K x C) -> (C x K) transpose (the padding
// channels' gradients are dropped).
cudaError_t GradFromKtrsc(const ConvParams& p, DType out, int64_t cp, const void* src, void* dw, cudaStream_t s);

// out[r*ow + j] = j < width ? in[r*iw + j] : 0 for j < ow: pads channel rows with zeros (iw = width < ow) or crops
// them (ow = width < iw).
cudaError_t CopyChannels(DType in, const void* src, void* dst, int64_t rows, int64_t iw, int64_t ow, int64_t width,
                         cudaStream_t s);

// float out[b*obs + j*ors + i] = in[b*ibs + i*irs + j] for i < rows, j < cols, b < batch.
cudaError_t TransposeF32(const void* in, void* out, int64_t rows, int64_t cols, int64_t batch, int64_t ibs,
                         int64_t irs, int64_t obs, int64_t ors, cudaStream_t s);

// The sub-filters of data gradients run as forwards (flipped_dgrad_sm90.cu: one phase of every tap;
// phased_dgrad_sm90.cu: one per stride phase): per phase, the taps first + (count - 1 - j) * step (j < count) of each dim, flipped, as the
// forward's KTRSC filter with output channels C and input channels K: out[off + ((c * count0 + t) * count1 + r) *
// count2 + s][:] = w[(t', r', s')][c][:], t' = first0 + (count0 - 1 - t) * step0 and so on.
struct PhaseFilters {
  int first[kMaxScatterPhases][3], count[kMaxScatterPhases][3];
  int64_t offset[kMaxScatterPhases];  // the phase's first row
  int win[3], step[3];
};

// Phases 0..phases-1 of f, rows of row_bytes (a multiple of 16); cudaErrorNotSupported (nothing launched) when the
// 32-bit indices could overflow (PhaseFiltersFit in family.h).
cudaError_t LaunchPhaseFilters(const ConvParams& p, const PhaseFilters& f, int phases, int64_t row_bytes,
                               const void* w, void* out, cudaStream_t s);

// One of the conv kernel sets (IgemmSm90Run or IgemmSm80Run).
using ConvKernelRun = cudaError_t (*)(const IgemmProblem&, Op, IgemmMath, const IgemmArgs&, cudaStream_t);

// The op on a conv kernel set with its staging (family.h's StagingOf, then the kernel's own workspace): x padded to
// the aligned channel count, the filter to KTRSC, the kernels, then dx cropped or dw transposed back. Where k is not
// aligned (the padded-k variants), also dy and the bias padded to the aligned k and y cropped from it. The caller
// checked that the workspace holds the staging and the kernel's bytes.
cudaError_t RunStaged(const Problem& pr, const Buffers& b, ConvKernelRun run, cudaStream_t s);

}  // namespace cuda::igemm
}  // namespace jaxconv
