// The few-channel family's host API (channels-last, c <= 16, k <= 64).
// Legacy entry points of the family, retired as its techniques become registry variants (dispatch/variants.def).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/shared/kernels.h"

namespace jaxconv {
namespace cuda {

// ---- small_channel.cu: channels-last, groups == batch_groups == 1, 1 <= c <= 16, 1 <= k <= 64 ----
// fwd/dgrad fall back to the direct kernels internally when the staged filter does not fit in shared memory.
cudaError_t SmallChannelFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s);
cudaError_t SmallChannelDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                              cudaStream_t s);
// wgrad always uses scratch: chunks * WElements accumulators (chunks from SmallChannelWgradChunks: spatial
// tiles on the tiled path, position chunks on the gather path); without enough scratch it falls back to the
// direct wgrad without split.
int64_t SmallChannelWgradChunks(const ConvParams& p, DType in);
cudaError_t SmallChannelWgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw,
                              void* scratch, size_t scratch_bytes, cudaStream_t s);

// ---- plane_stencil.cu: c == k == 1 2-D stencils (unit stride, "same" column padding, width % 8 == 0; see the
// file); the small-channel family's fast path. *launched false: not taken (the caller runs its own kernels). ----
bool PlaneStencilApplies(const ConvParams& p, DType in);
cudaError_t PlaneStencilFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t PlaneStencilDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);
// wgrad writes PlaneWgradBlocks(p) partial filters (f32, win taps each) to `partials`; the caller reduces them.
int64_t PlaneWgradBlocks(const ConvParams& p);
cudaError_t PlaneStencilWgrad(const ConvParams& p, DType in, const void* x, const void* dy, float* partials,
                              cudaStream_t s, bool* launched);

// c -> 1 forward (k == 1, 2 <= c, channels-last, 3x3, unit stride, c / (one 8- or 16-byte vector) a power of two
// <= 32), the same file; *launched as above.
bool ReduceStencilApplies(const ConvParams& p, DType in);
cudaError_t ReduceStencilFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                             void* y, cudaStream_t s, bool* launched);


}  // namespace cuda
}  // namespace jaxconv
