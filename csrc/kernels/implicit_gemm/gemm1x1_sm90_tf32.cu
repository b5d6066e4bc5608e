// The 1x1 Hopper GEMMs (gemm1x1_sm90.cuh) of float32 as TF32 operands.
#include "kernels/implicit_gemm/gemm1x1_sm90.cuh"

namespace jaxconv {
namespace cuda {
#if JAXCONV_GEMM1X1_KERNELS
namespace gemm1x1 {
JAXCONV_GEMM1X1_DEFINE(TF32, float)
}  // namespace gemm1x1
#endif  // JAXCONV_GEMM1X1_KERNELS
}  // namespace cuda
}  // namespace jaxconv
