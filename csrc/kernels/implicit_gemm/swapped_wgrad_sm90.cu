// implicit_gemm.swapped_wgrad_sm90: the float32 DEFAULT (TF32) filter gradient of 1-D and 2-D problems, as a Hopper
// forward with swapped roles.
// Both of the filter gradient's GEMM operands (x and dy, channels innermost) are MN-major, which wgmma does not read
// in TF32, so the Hopper kernels have no TF32 filter gradient and it would run on the mma.sync kernels. Swapping the
// roles of batch and channels makes it a forward with K-major operands: with x' = x as (C, H, W, N) and dy' = dy as
// (K, P, Q, N),
//   dw[r][s][c][k] = sum_{p,q,n} x'[c][r*dil + p*stride - pad][s*dil + q*stride - pad][n] * dy'[k][p][q][n],
// the forward of batch C, input channels N, output channels K over a P x Q window (its dilation the stride, its
// stride the dilation) to an R x S output, which the large-window kernel (rank 2) writes batch-inner: dw's (R, S, C,
// K) layout. Costs two transposes (x and dy once each) in the workspace.
#include <string>

#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/staging.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace variants::implicit_gemm_swapped_wgrad_sm90 {
namespace {

using cuda::IgemmProblem;
using cuda::igemm::AlignUp;

IgemmProblem SwappedWgradProblem(const ConvParams& p) {
  IgemmProblem pr;
  pr.n = p.c[0];
  pr.c = p.n[0];
  pr.k = p.k[0];
  for (int d = 0; d < 3; ++d) {
    pr.in[d] = p.in[d];
    pr.win[d] = p.out[d];
    pr.out[d] = p.win[d];
    pr.stride[d] = p.rhs_dil[d];
    pr.dil[d] = p.stride[d];
    pr.pad_lo[d] = p.pad_lo[d];
    // The upper pad that makes the output exactly the window: the last position read, (win-1)*dil + (out-1)*stride
    // - pad_lo, is in - 1 + pad_hi. Negative (declined) when the convolution never reads its last inputs.
    pr.pad_hi[d] = (p.win[d] - 1) * p.rhs_dil[d] + (p.out[d] - 1) * p.stride[d] + 1 - p.in[d] - p.pad_lo[d];
  }
  return pr;
}

// Workspace layout: [x' (C, D, H, W, N)][dy' (K, Z, P, Q, N)][the kernel's split slices].
struct SwappedWgradLayout {
  size_t x = 0, dy = 0, kernel = 0;
  size_t bytes() const { return x + dy + kernel; }
};

SwappedWgradLayout SwappedWgradLayoutOf(const ConvParams& p) {
  SwappedWgradLayout l;
  l.x = AlignUp(static_cast<size_t>(XElements(p)) * 4);
  l.dy = AlignUp(static_cast<size_t>(YElements(p)) * 4);
  l.kernel = AlignUp(cuda::IgemmSm90LargeWindowWorkspaceBytes(SwappedWgradProblem(p)));
  return l;
}

// At most this much workspace for the transposed operands (x and dy): XLA reserves it for the whole program.
constexpr size_t kMaxSwappedStaging = size_t(2) << 30;

}  // namespace

std::string PlanError(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (pr.dev.arch != 90 || !cuda::IgemmSm90Built()) {
    return "the Hopper kernels run on sm_90, in builds with sm_90a code";
  }
  if (pr.op != Op::kWgrad || pr.in != DType::kF32 || pr.out != DType::kF32 ||
      cuda::MathFor(p, pr.in) != cuda::IgemmMath::kTF32) {
    return "it runs float32 filter gradients at DEFAULT precision (TF32)";
  }
  if (p.n[0] % 4 != 0 || p.k[0] % 4 != 0) return "it needs n and k multiples of 4";  // 16-byte rows of x', dy', dw
  if (p.n[0] > int64_t(65535) * 32) return "its batch exceeds the transposes' grid";
  if (static_cast<size_t>(XElements(p) + YElements(p)) * 4 > kMaxSwappedStaging) {
    return "its transposed operands exceed 2 GiB";
  }
  if (!cuda::igemm::StagedKernelExists(p, Op::kWgrad, pr.in)) return "no staged conv kernel takes the problem";
  if (!cuda::IgemmSm90LargeWindowSupports(SwappedWgradProblem(p))) {
    return "the Hopper large-window forward does not take the swapped problem (1-D or 2-D, windows up to 255 "
           "positions)";
  }
  return {};
}

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::igemm::FamilyError(pr); !why.empty()) return why;
  return PlanError(pr);
}

size_t Workspace(const Problem& pr) { return SwappedWgradLayoutOf(pr.p).bytes(); }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const ConvParams& p = pr.p;
  const SwappedWgradLayout l = SwappedWgradLayoutOf(p);
  if (b.ws_bytes < l.bytes()) return cudaErrorInvalidValue;
  if (!cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
  char* xt = static_cast<char*>(b.ws);
  char* dyt = xt + l.x;
  const int64_t n = p.n[0], c = p.c[0], k = p.k[0], in_px = SpatialCount(p.in), out_px = SpatialCount(p.out);
  // (N, pixels, ch) -> (ch, pixels, N): per pixel an (N x ch) -> (ch x N) transpose.
  cudaError_t e = cuda::igemm::TransposeF32(b.a, xt, n, c, in_px, c, in_px * c, n, in_px * n, s);
  if (e != cudaSuccess) return e;
  if ((e = cuda::igemm::TransposeF32(b.b, dyt, n, k, out_px, k, out_px * k, n, out_px * n, s)) != cudaSuccess) {
    return e;
  }
  cuda::IgemmArgs args;
  args.a = xt;
  args.b = dyt;
  args.out = b.out;
  args.workspace = dyt + l.dy;
  args.workspace_bytes = b.ws_bytes - l.x - l.dy;
  // y' (batch c, output t, r, s, channels k) comes batch-inner: dw's (T, R, S, C, K)
  return cuda::IgemmSm90LargeWindowRun(SwappedWgradProblem(p), args, s);
}

}  // namespace variants::implicit_gemm_swapped_wgrad_sm90
}  // namespace jaxconv
