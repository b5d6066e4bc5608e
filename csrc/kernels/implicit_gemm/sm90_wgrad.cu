// The Hopper filter-gradient kernels (bf16, f16): split-K over the pixels, fixed-order reduction.
#include "kernels/implicit_gemm/sm90_common.cuh"

namespace jaxconv {
namespace cuda {
#if JAXCONV_SM90_KERNELS
namespace sm90 {

bool WgradSupports(const IgemmProblem& pr, IgemmMath math) {
  auto can = [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); };
  if (math == IgemmMath::kBF16) return WithWgradCfg<cutlass::bfloat16_t>(pr, can);
  return WithWgradCfg<cutlass::half_t>(pr, can);
}

cudaError_t WgradRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream) {
  auto run = [&](auto cfg) { return RunWgrad<decltype(cfg)>(pr, args, stream); };
  if (math == IgemmMath::kBF16) return WithWgradCfg<cutlass::bfloat16_t>(pr, run);
  return WithWgradCfg<cutlass::half_t>(pr, run);
}

}  // namespace sm90
#endif  // JAXCONV_SM90_KERNELS
}  // namespace cuda
}  // namespace jaxconv
