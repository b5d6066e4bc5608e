// The Hopper forward kernels (bf16, f16, TF32; the TF32 split forward on small grids): sm90_common.cuh's FpropCfg
// and SplitCfg instantiations.
#include "kernels/implicit_gemm/sm90_common.cuh"

namespace jaxconv {
namespace cuda {
#if JAXCONV_SM90_KERNELS
namespace sm90 {

bool FwdSupports(const IgemmProblem& pr, IgemmMath math) {
  constexpr Op op = Op::kFwd;
  auto can = [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<FpropTiles, cutlass::bfloat16_t>(pr, op, math, can);
  if (math == IgemmMath::kF16) return WithFwdCfg<FpropTiles, cutlass::half_t>(pr, op, math, can);
  return WithFwdCfg<FpropTiles, float>(pr, op, math, can);
}

cudaError_t FwdRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream) {
  constexpr Op op = Op::kFwd;
  // kF32 out is the operand type for tf32 (f32 operands); 16-bit operands write 16-bit only.
  if (args.out_type != IgemmOut::kSame && math != IgemmMath::kTF32) return cudaErrorNotSupported;
  auto run = [&](auto cfg) { return RunFwdOrDgrad<decltype(cfg)>(pr, args, math, stream); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<FpropTiles, cutlass::bfloat16_t>(pr, op, math, run);
  if (math == IgemmMath::kF16) return WithFwdCfg<FpropTiles, cutlass::half_t>(pr, op, math, run);
  return WithFwdCfg<FpropTiles, float>(pr, op, math, run);
}

}  // namespace sm90
#endif  // JAXCONV_SM90_KERNELS
}  // namespace cuda
}  // namespace jaxconv
