// The Hopper forwards written through strided views (the phases of strided data gradients, phased_dgrad_sm90.cu).
#include "kernels/implicit_gemm/sm90_common.cuh"

namespace jaxconv {
namespace cuda {
#if JAXCONV_SM90_KERNELS
namespace sm90 {

bool ScatterFwdSupports(const IgemmProblem* prs, int count, IgemmMath math) {
  auto can = [&](auto cfg) {
    for (int i = 0; i < count; ++i) {
      if (!CanImplement<decltype(cfg)>(prs[i])) return false;
    }
    return true;
  };
  if (math == IgemmMath::kBF16) return WithScatterCfg<cutlass::bfloat16_t>(prs, count, can);
  if (math == IgemmMath::kF16) return WithScatterCfg<cutlass::half_t>(prs, count, can);
  return WithScatterCfg<float>(prs, count, can);
}

cudaError_t ScatterFwdRun(const IgemmScatterPhase* phases, int count, IgemmMath math, const int64_t out_stride[4],
                          cudaStream_t stream) {
  IgemmProblem prs[kMaxScatterPhases];
  for (int i = 0; i < count; ++i) prs[i] = phases[i].pr;
  auto run = [&](auto cfg) { return RunScatterFwd<decltype(cfg)>(phases, count, out_stride, stream); };
  if (math == IgemmMath::kBF16) return WithScatterCfg<cutlass::bfloat16_t>(prs, count, run);
  if (math == IgemmMath::kF16) return WithScatterCfg<cutlass::half_t>(prs, count, run);
  return WithScatterCfg<float>(prs, count, run);
}

}  // namespace sm90
#endif  // JAXCONV_SM90_KERNELS
}  // namespace cuda
}  // namespace jaxconv
