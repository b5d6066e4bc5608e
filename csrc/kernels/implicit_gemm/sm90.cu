// implicit_gemm.sm90: the Hopper implicit GEMM (TMA im2col loads, warp-specialised wgmma; CUTLASS 3.x conv
// collectives, sm90_common.cuh) on the staged problem (staging.h: filter to KTRSC, channels padded to 16 bytes), and
// the entry points of the Hopper conv kernels (igemm.h), whose kernels live in sm90_fprop.cu, sm90_dgrad.cu,
// sm90_wgrad.cu and sm90_scatter.cu. Without sm_90a code in the build every entry point refuses every problem.
#include <string>

#include "dispatch/cost_rules.h"
#include "dispatch/rules.h"
#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/sm90_common.cuh"
#include "kernels/implicit_gemm/staging.h"

namespace jaxconv {
namespace cuda {

bool IgemmSm90Built() { return JAXCONV_SM90_KERNELS != 0; }

bool IgemmSm90Supports(const IgemmProblem& pr, Op op, IgemmMath math) {
#if JAXCONV_SM90_KERNELS
  if (!BasicChecks(pr, op, math)) return false;
  switch (op) {
    case Op::kFwd: return sm90::FwdSupports(pr, math);
    case Op::kDgrad: return sm90::DgradSupports(pr, math);
    case Op::kWgrad: return sm90::WgradSupports(pr, math);
  }
  return false;
#else
  (void)pr;
  (void)op;
  (void)math;
  return false;
#endif
}

size_t IgemmSm90WorkspaceBytes(const IgemmProblem& pr, Op op, IgemmMath math) {
#if JAXCONV_SM90_KERNELS
  // CUTLASS's conv kernel needs none; only the split partial sums.
  if (!IgemmSm90Supports(pr, op, math)) return 0;
  switch (op) {
    case Op::kFwd: return SplitFwdWorkspace(pr, math);
    case Op::kWgrad: return WgradWorkspace(pr);
    default: return 0;
  }
#else
  (void)pr;
  (void)op;
  (void)math;
  return 0;
#endif
}

bool IgemmSm90LargeWindowSupports(const IgemmProblem& pr) {
#if JAXCONV_SM90_KERNELS
  return LargeWindowChecks(pr) && sm90::LargeWindowSupports(pr);
#else
  (void)pr;
  return false;
#endif
}

size_t IgemmSm90LargeWindowWorkspaceBytes(const IgemmProblem& pr) {
#if JAXCONV_SM90_KERNELS
  return IgemmSm90LargeWindowSupports(pr) ? SplitBytes(pr, LargeWindowPlan(pr)) : 0;
#else
  (void)pr;
  return 0;
#endif
}

cudaError_t IgemmSm90LargeWindowRun(const IgemmProblem& pr, const IgemmArgs& args, cudaStream_t stream) {
#if JAXCONV_SM90_KERNELS
  if (!LargeWindowChecks(pr)) return cudaErrorNotSupported;
  if (args.bias != nullptr || args.act != kActNone) return cudaErrorNotSupported;
  return sm90::LargeWindowRun(pr, args, stream);
#else
  (void)pr;
  (void)args;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

#if JAXCONV_SM90_KERNELS
// The scatter entry points' checks: 1..kMaxScatterPhases forwards of one k (even: ExtentChecks' alignment), each one
// the rank-3 kernels take. pr(i): phase i's problem.
template <class PrOf>
bool ScatterChecks(int count, IgemmMath math, PrOf pr) {
  if (count < 1 || count > kMaxScatterPhases) return false;
  for (int i = 0; i < count; ++i) {
    if (!BasicChecks(pr(i), Op::kFwd, math) || pr(i).k != pr(0).k) return false;
  }
  return true;
}
#endif

bool IgemmSm90ScatterFwdSupports(const IgemmProblem* prs, int count, IgemmMath math) {
#if JAXCONV_SM90_KERNELS
  if (!ScatterChecks(count, math, [&](int i) -> const IgemmProblem& { return prs[i]; })) return false;
  return sm90::ScatterFwdSupports(prs, count, math);
#else
  (void)prs;
  (void)count;
  (void)math;
  return false;
#endif
}

cudaError_t IgemmSm90ScatterFwdRun(const IgemmScatterPhase* phases, int count, IgemmMath math,
                                   const int64_t out_stride[4], cudaStream_t stream) {
#if JAXCONV_SM90_KERNELS
  if (!ScatterChecks(count, math, [&](int i) -> const IgemmProblem& { return phases[i].pr; })) {
    return cudaErrorNotSupported;
  }
  return sm90::ScatterFwdRun(phases, count, math, out_stride, stream);
#else
  (void)phases;
  (void)count;
  (void)math;
  (void)out_stride;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

cudaError_t IgemmSm90Run(const IgemmProblem& pr, Op op, IgemmMath math, const IgemmArgs& args,
                         cudaStream_t stream) {
#if JAXCONV_SM90_KERNELS
  if (!BasicChecks(pr, op, math)) return cudaErrorNotSupported;
  switch (op) {
    case Op::kFwd: return sm90::FwdRun(pr, math, args, stream);
    case Op::kDgrad: return sm90::DgradRun(pr, math, args, stream);
    case Op::kWgrad: return sm90::WgradRun(pr, math, args, stream);
  }
  return cudaErrorNotSupported;
#else
  (void)pr;
  (void)op;
  (void)math;
  (void)args;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}
}  // namespace cuda

namespace variants::implicit_gemm_sm90 {

std::string PlanError(const Problem& pr) {
  if (pr.dev.arch != 90 || !cuda::IgemmSm90Built()) {
    return "the Hopper kernels run on sm_90, in builds with sm_90a code";
  }
  if (!cuda::IgemmSm90Supports(cuda::igemm::ToProblem(pr.p, pr.in), pr.op, cuda::MathFor(pr.p, pr.in))) {
    return "the Hopper kernels do not take it (unit-stride 16-bit dgrad, 16-bit wgrad, no 3xTF32; pads <= 16, "
           "windows under 32 taps)";
  }
  return {};
}

bool Sm90Preferred(const Problem& pr) {
  return cuda::igemm::PreferSm90(cuda::igemm::ToProblem(pr.p, pr.in), pr.op) ||
         !implicit_gemm_sm80::PlanError(pr).empty();
}

std::string Prefer(const Problem& pr) {
  if (std::string why = PreferTensorCores(pr); !why.empty()) return why;
  return Sm90Preferred(pr) ? std::string()
                           : "auto takes the mma.sync kernels below 64 channels and for forwards with short reductions";
}

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::igemm::FamilyError(pr); !why.empty()) return why;
  return PlanError(pr);
}

size_t Workspace(const Problem& pr) { return cuda::igemm::StagedWorkspace(pr, cuda::IgemmSm90WorkspaceBytes); }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  if (b.ws_bytes < Workspace(pr)) return cudaErrorInvalidValue;
  return cuda::igemm::RunStaged(pr, b, cuda::IgemmSm90Run, s);
}

}  // namespace variants::implicit_gemm_sm90
}  // namespace jaxconv
