// implicit_gemm.gemm1x1_sm90: 1x1 convolutions as plain Hopper GEMMs (TMA + wgmma, gemm1x1_sm90.cuh) on the caller's
// buffers, no staging but the TF32 forward's filter, transposed to (K, C) first (wgmma reads TF32 K-major only). And
// the GEMMs' entry points (igemm.h), whose kernels live in gemm1x1_sm90_bf16.cu, _f16.cu and _tf32.cu.
#include <string>

#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/gemm1x1_sm90.cuh"
#include "kernels/implicit_gemm/staging.h"

namespace jaxconv {
namespace cuda {

bool Gemm1x1Sm90Supports(const ConvParams& p, Op op, DType in, DType out) {
#if JAXCONV_GEMM1X1_KERNELS
  if (!BasicSupports(p, op, in, out)) return false;
  switch (in) {
    case DType::kBF16: return gemm1x1::SupportsBF16(p, op);
    case DType::kF16: return gemm1x1::SupportsF16(p, op);
    default: return gemm1x1::SupportsTF32(p, op);  // BasicSupports: float32 at DEFAULT
  }
#else
  (void)p, (void)op, (void)in, (void)out;
  return false;
#endif
}

size_t Gemm1x1Sm90WorkspaceBytes(const ConvParams& p, Op op, DType in, DType out) {
#if JAXCONV_GEMM1X1_KERNELS
  if (!Gemm1x1Sm90Supports(p, op, in, out)) return 0;
  switch (in) {
    case DType::kBF16: return gemm1x1::WorkspaceBF16(p, op);
    case DType::kF16: return gemm1x1::WorkspaceF16(p, op);
    default: return gemm1x1::WorkspaceTF32(p, op);
  }
#else
  (void)p, (void)op, (void)in, (void)out;
  return 0;
#endif
}

cudaError_t Gemm1x1Sm90Run(const ConvParams& p, Op op, DType in, DType out, const void* a, const void* b,
                           const void* bias, void* out_buf, void* workspace, size_t workspace_bytes,
                           cudaStream_t s) {
#if JAXCONV_GEMM1X1_KERNELS
  if (!BasicSupports(p, op, in, out)) return cudaErrorNotSupported;
  // TMA needs 16-byte aligned bases (XLA's buffers are; the variant checks them before launching anything).
  if (!Aligned16(a) || !Aligned16(b) || !Aligned16(out_buf)) return cudaErrorNotSupported;
  if (op == Op::kFwd && p.has_bias[0] && (bias == nullptr || !Aligned16(bias))) return cudaErrorNotSupported;
  if (workspace != nullptr && !Aligned16(workspace)) return cudaErrorNotSupported;
  switch (in) {
    case DType::kBF16: return gemm1x1::RunBF16(p, op, in, out, a, b, bias, out_buf, workspace, workspace_bytes, s);
    case DType::kF16: return gemm1x1::RunF16(p, op, in, out, a, b, bias, out_buf, workspace, workspace_bytes, s);
    default: return gemm1x1::RunTF32(p, op, in, out, a, b, bias, out_buf, workspace, workspace_bytes, s);
  }
#else
  (void)p, (void)op, (void)in, (void)out, (void)a, (void)b, (void)bias, (void)out_buf, (void)workspace;
  (void)workspace_bytes, (void)s;
  return cudaErrorNotSupported;
#endif
}

}  // namespace cuda

namespace variants::implicit_gemm_gemm1x1_sm90 {
namespace {

// Workspace: [TF32 fwd: w^T][the GEMM's own workspace].
size_t FilterBytes(const Problem& pr) {
  if (pr.op != Op::kFwd || pr.in != DType::kF32) return 0;
  return cuda::igemm::AlignUp(static_cast<size_t>(pr.p.c[0] * pr.p.k[0]) * 4);
}

}  // namespace

std::string PlanError(const Problem& pr) {
  if (pr.dev.arch != 90 || !cuda::IgemmSm90Built()) {
    return "the Hopper GEMMs run on sm_90, in builds with sm_90a code";
  }
  if (!cuda::Gemm1x1Sm90Supports(pr.p, pr.op, pr.in, pr.out)) {
    return "it takes 1x1 windows with unit strides and no padding, 16-bit or TF32";
  }
  return {};
}

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::igemm::FamilyError(pr); !why.empty()) return why;
  return PlanError(pr);
}

size_t Workspace(const Problem& pr) {
  return FilterBytes(pr) + cuda::Gemm1x1Sm90WorkspaceBytes(pr.p, pr.op, pr.in, pr.out);
}

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const size_t filter = FilterBytes(pr);
  if (b.ws_bytes < Workspace(pr)) return cudaErrorInvalidValue;
  // TMA needs 16-byte aligned bases.
  const bool bias = pr.op == Op::kFwd && pr.p.has_bias[0];
  if (!cuda::Aligned16(b.a) || (filter == 0 && !cuda::Aligned16(b.b)) || !cuda::Aligned16(b.out) ||
      (bias && (b.bias == nullptr || !cuda::Aligned16(b.bias)))) {
    return cudaErrorMisalignedAddress;
  }
  const void* w = b.b;
  if (filter > 0) {
    if (const cudaError_t e = cuda::igemm::FilterToKtrsc(pr.p, pr.in, pr.p.c[0], b.b, b.ws, s); e != cudaSuccess) {
      return e;
    }
    w = b.ws;
  }
  return cuda::Gemm1x1Sm90Run(pr.p, pr.op, pr.in, pr.out, b.a, w, b.bias, b.out, static_cast<char*>(b.ws) + filter,
                              b.ws_bytes - filter, s);
}

}  // namespace variants::implicit_gemm_gemm1x1_sm90
}  // namespace jaxconv
