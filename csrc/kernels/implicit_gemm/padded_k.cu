// implicit_gemm.padded_k_sm90 and implicit_gemm.padded_k_sm80: output channels off the 16-byte alignment (k not a
// multiple of 8 for 16-bit operands, of 4 for float32) on the staged conv kernels. The staging (staging.cu's
// RunStaged) pads k with zeros as it pads c: the filter's padding rows and dy's padding channels are zeros, the
// forward writes y with the padded k into the workspace and crops it, and the filter gradient's padding rows are not
// read back. The kernels are the Hopper and mma.sync ones of implicit_gemm.sm90 and implicit_gemm.sm80.
#include <string>

#include "dispatch/rules.h"
#include "kernels/implicit_gemm/family.h"

namespace jaxconv {
namespace {

// The family's gate on the problem with k padded, for problems whose k needs the padding.
std::string PaddedKError(const Problem& pr) {
  const int64_t kp = ImplicitGemmPaddedK(pr.p, pr.in);
  if (kp == pr.p.k[0]) {
    return "k is a multiple of " + std::to_string(ImplicitGemmAlign(pr.in)) +
           " for this dtype: the unpadded variants take the problem";
  }
  ConvParams q = pr.p;
  q.k[0] = kp;
  return ImplicitGemmError(q, pr.in, pr.out);
}

}  // namespace

namespace variants::implicit_gemm_padded_k_sm90 {

std::string Applies(const Problem& pr) {
  if (std::string why = PaddedKError(pr); !why.empty()) return why;
  return implicit_gemm_sm90::PlanError(pr);  // the Hopper kernels on the padded problem (ToProblem pads k)
}

// implicit_gemm.sm90's staged run: its staging pads k wherever ToProblem does.
size_t Workspace(const Problem& pr) { return implicit_gemm_sm90::Workspace(pr); }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) { return implicit_gemm_sm90::Launch(pr, b, s); }

}  // namespace variants::implicit_gemm_padded_k_sm90

namespace variants::implicit_gemm_padded_k_sm80 {

std::string Applies(const Problem& pr) {
  if (std::string why = PaddedKError(pr); !why.empty()) return why;
  return implicit_gemm_sm80::PlanError(pr);  // the mma.sync kernels on the padded problem
}

// implicit_gemm.sm80's staged run: its staging pads k wherever ToProblem does.
size_t Workspace(const Problem& pr) { return implicit_gemm_sm80::Workspace(pr); }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) { return implicit_gemm_sm80::Launch(pr, b, s); }

}  // namespace variants::implicit_gemm_padded_k_sm80
}  // namespace jaxconv
