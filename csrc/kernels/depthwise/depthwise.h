// The depthwise family's host API (groups == c == k).
// Legacy entry points of the family, retired as its techniques become registry variants (dispatch/variants.def).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/shared/kernels.h"

namespace jaxconv {
namespace cuda {

// ---- depthwise.cu: groups == c == k, batch_groups == 1 ----
cudaError_t DepthwiseFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias, void* y,
                         cudaStream_t s);
cudaError_t DepthwiseDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                           cudaStream_t s);
int64_t DepthwiseWgradSplits(const ConvParams& p, DType in);
cudaError_t DepthwiseWgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw, void* scratch,
                           int64_t splits, cudaStream_t s);

// depthwise_reg.cu: the register-stencil forward, data and filter gradients (channels-last 1-D/2-D, f32/bf16/f16, c a
// multiple of 4, no dilation; data gradients of stride 1 or 2); DepthwiseFwd / DepthwiseDgrad / DepthwiseWgrad try
// them first. *launched false: not taken.
cudaError_t DepthwiseRegFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t DepthwiseRegDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);
// Its filter gradient: the splits it plans (0: not taken), and the run (then the split partials in scratch,
// reduced into dw).
int64_t DepthwiseRegWgradSplits(const ConvParams& p, DType in);
cudaError_t DepthwiseRegWgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw,
                              void* scratch, int64_t splits, cudaStream_t s, bool* launched);

// depthwise_tma_sm90.cu: the Hopper 3x3 forward and unit-stride data gradient (channels-last 2-D, stride 1 or 2,
// c * sizeof(T) % 16 == 0, sm_90a builds on a 9.0 device); DepthwiseFwd / DepthwiseDgrad try it before the register
// stencil. *launched false: not taken.
cudaError_t DepthwiseTmaFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t DepthwiseTmaDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);

// depthwise_mma.cu: the tensor-core 7x7 forward, unit-stride data gradient and filter gradient (channels-last 2-D,
// unit strides, 16-bit data, c a multiple of 8, sm_80+); DepthwiseFwd / DepthwiseDgrad try it after the TMA kernel,
// DepthwiseWgrad first. *launched false: not taken. DepthwiseMmaWgradSplits: 0 when it does not take the problem.
cudaError_t DepthwiseMmaFwd(const ConvParams& p, DType in, DType out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t DepthwiseMmaDgrad(const ConvParams& p, DType in, DType out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);
int64_t DepthwiseMmaWgradSplits(const ConvParams& p, DType in);
cudaError_t DepthwiseMmaWgrad(const ConvParams& p, DType in, DType out, const void* x, const void* dy, void* dw,
                              void* scratch, int64_t splits, cudaStream_t s, bool* launched);


}  // namespace cuda
}  // namespace jaxconv
