// The Hopper data-gradient kernels (bf16, f16, unit stride) and the large-window TF32 forward, which the swapped
// TF32 filter gradient runs (swapped_wgrad_sm90.cu).
#include "kernels/implicit_gemm/sm90_common.cuh"

namespace jaxconv {
namespace cuda {
#if JAXCONV_SM90_KERNELS
namespace sm90 {

bool DgradSupports(const IgemmProblem& pr, IgemmMath math) {
  constexpr Op op = Op::kDgrad;
  auto can = [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<DgradTiles, cutlass::bfloat16_t>(pr, op, math, can);
  return WithFwdCfg<DgradTiles, cutlass::half_t>(pr, op, math, can);
}

cudaError_t DgradRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream) {
  constexpr Op op = Op::kDgrad;
  if (args.out_type != IgemmOut::kSame) return cudaErrorNotSupported;
  auto run = [&](auto cfg) { return RunFwdOrDgrad<decltype(cfg)>(pr, args, math, stream); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<DgradTiles, cutlass::bfloat16_t>(pr, op, math, run);
  return WithFwdCfg<DgradTiles, cutlass::half_t>(pr, op, math, run);
}

// The large-window TF32 forward builds here, with the lightest set of instantiations.
bool LargeWindowSupports(const IgemmProblem& pr) {
  return WithLargeWindowCfg(pr, [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); });
}

cudaError_t LargeWindowRun(const IgemmProblem& pr, const IgemmArgs& args, cudaStream_t stream) {
  if (!Aligned16(args.a) || !Aligned16(args.b) || !Aligned16(args.out)) return cudaErrorInvalidValue;
  return WithLargeWindowCfg(pr, [&](auto cfg) {
    return RunSplitFwd<decltype(cfg)>(pr, args, LargeWindowPlan(pr), /*batch_inner=*/true, stream);
  });
}

}  // namespace sm90
#endif  // JAXCONV_SM90_KERNELS
}  // namespace cuda
}  // namespace jaxconv
