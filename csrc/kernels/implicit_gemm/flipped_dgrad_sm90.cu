// implicit_gemm.flipped_dgrad_sm90: the float32 DEFAULT (TF32) data gradient with unit strides, as a Hopper forward.
// The Hopper kernels have no TF32 dgrad (wgmma reads TF32 operands K-major only; dgrad's filter operand is
// MN-major), so it would run on the mma.sync kernels. With unit strides the data gradient is the forward of dy
// with the flipped filter, output channel c and input channel k: dx[i] = sum_f dy[i - P' + f d] * w'[f] with
// w'[c][f][k] = w[F-1-f][c][k] (already the forward's KTRSC layout, written by PhaseFilterKernel as one phase of
// every tap) and pads P' = (win - 1) d - pads.
#include <algorithm>
#include <string>

#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/staging.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace variants::implicit_gemm_flipped_dgrad_sm90 {
namespace {

using cuda::IgemmMath;
using cuda::IgemmProblem;

// Unit strides: one phase, every tap flipped, pads (win - 1) dil - pads.
IgemmProblem FlippedDgradProblem(const ConvParams& p) {
  cuda::igemm::PhaseDim ph[3];
  for (int d = 0; d < 3; ++d) {
    ph[d].taps = p.win[d];
    ph[d].out = p.in[d];
    ph[d].lo = (p.win[d] - 1) * p.rhs_dil[d] - p.pad_lo[d];
    ph[d].hi = (p.win[d] - 1) * p.rhs_dil[d] - p.pad_hi[d];
    ph[d].dil = p.rhs_dil[d];
  }
  return cuda::igemm::PhaseProblem(p, ph);
}

// Workspace: [the flipped filter, in the staged filter's slot (c % 4 == 0: unpadded)][the forward's split slices].
size_t FilterBytes(const Problem& pr) { return cuda::igemm::StagingOf(pr.p, Op::kDgrad, pr.in).filter; }

}  // namespace

std::string PlanError(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (pr.dev.arch != 90 || !cuda::IgemmSm90Built()) {
    return "the Hopper kernels run on sm_90, in builds with sm_90a code";
  }
  if (pr.op != Op::kDgrad || pr.in != DType::kF32 || pr.out != DType::kF32 ||
      cuda::MathFor(p, pr.in) != IgemmMath::kTF32) {
    return "it runs float32 data gradients at DEFAULT precision (TF32)";
  }
  // c % 4: the forward writes 16-byte dx rows; k % 4: PhaseFilterKernel's 16-byte rows.
  if (p.c[0] % 4 != 0 || p.k[0] % 4 != 0) return "it needs c and k multiples of 4";
  for (int d = 0; d < 3; ++d) {
    if (p.stride[d] != 1 || (p.win[d] - 1) * p.rhs_dil[d] < std::max(p.pad_lo[d], p.pad_hi[d])) {
      return "it takes unit strides and pads within the dilated window";
    }
  }
  const IgemmProblem fpr = FlippedDgradProblem(p);
  if (!cuda::IgemmSm90Supports(fpr, Op::kFwd, IgemmMath::kTF32)) {
    return "the Hopper TF32 forward does not take the flipped problem";
  }
  if (!cuda::igemm::PreferSm90(fpr, Op::kFwd)) return "its forward has under 64 channels or a short reduction";
  if (!cuda::igemm::PhaseFiltersFit(p, p.k[0] * 4)) return "the flipped filter's indices pass 32 bits";
  return {};
}

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::igemm::FamilyError(pr); !why.empty()) return why;
  return PlanError(pr);
}

size_t Workspace(const Problem& pr) {
  return FilterBytes(pr) + cuda::IgemmSm90WorkspaceBytes(FlippedDgradProblem(pr.p), Op::kFwd, IgemmMath::kTF32);
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const ConvParams& p = pr.p;
  if (b.ws_bytes < Workspace(pr)) return cudaErrorInvalidValue;
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
  const size_t fbytes = FilterBytes(pr);
  cuda::igemm::PhaseFilters f{};  // one phase: every tap, flipped
  for (int d = 0; d < 3; ++d) {
    f.count[0][d] = f.win[d] = static_cast<int>(p.win[d]);  // < 256 (the Hopper forward's window)
    f.step[d] = 1;
  }
  if (const cudaError_t e = cuda::igemm::LaunchPhaseFilters(p, f, 1, p.k[0] * 4, b.b, b.ws, s); e != cudaSuccess) {
    return e;
  }
  cuda::IgemmArgs args;
  args.a = b.a;
  args.b = b.ws;
  args.out = b.out;
  args.out_type = cuda::IgemmOut::kSame;
  args.workspace = static_cast<char*>(b.ws) + fbytes;
  args.workspace_bytes = b.ws_bytes - fbytes;
  return cuda::IgemmSm90Run(FlippedDgradProblem(p), Op::kFwd, IgemmMath::kTF32, args, s);
}

}  // namespace variants::implicit_gemm_flipped_dgrad_sm90
}  // namespace jaxconv
