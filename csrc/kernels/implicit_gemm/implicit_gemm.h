// The tensor-core family's host API.
// Legacy entry points of the family, retired as its techniques become registry variants (dispatch/variants.def).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/shared/kernels.h"

namespace jaxconv {
namespace cuda {

// ---- implicit_gemm.cu: tensor cores through CUTLASS (igemm.h), ImplicitGemmApplies in algorithms.h ----
// algo: kAlgoImplicitGemm (the Hopper kernels where they apply, else mma.sync) or kAlgoImplicitGemmSm80.
size_t ImplicitGemmWorkspaceBytes(const ConvParams& p, Op op, DType in, int64_t algo);
// With a workspace shorter than ImplicitGemmWorkspaceBytes, or for a problem no tensor-core kernel takes, the
// op runs on the direct kernels.
cudaError_t ImplicitGemmRun(const ConvParams& p, Op op, DType in, DType out, int64_t algo, const void* a,
                            const void* b, const void* bias, void* out_buf, void* workspace,
                            size_t workspace_bytes, cudaStream_t s);


}  // namespace cuda
}  // namespace jaxconv
