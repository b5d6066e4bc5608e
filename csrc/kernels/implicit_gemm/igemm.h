// Implicit-GEMM convolutions on tensor cores (CUTLASS), the "implicit_gemm" algorithm family.
//
// The kernels see canonical, dense, channels-innermost tensors only (the family's variants convert jaxconv's
// layouts into these, in the op's workspace: staging.h):
//   x  (N, D, H, W, C)    activations          y  (N, Z, P, Q, K)   output of fprop / input of dgrad
//   w  (K, T, R, S, C)    filter ("KTRSC")
// 1-D and 2-D problems have D = T = Z = 1 (and H = R = P = 1 for 1-D): every kernel is a 3-D convolution.
// Relation (cross-correlation, as lax):  y[n,z,p,q,k] = sum_{t,r,s,c} x[n, d, h, w, c] * w[k, t, r, s, c] with
//   d = z*stride[0] - pad_lo[0] + t*dil[0]   (likewise h, w), out-of-range positions read as zero.
//
// Two implementations share this interface:
//   sm90*.cu  Hopper: TMA im2col loads, wgmma, warp-specialised (CUTLASS 3.x conv collectives).
//   sm80.cu   Ampere mma.sync (CUTLASS 2.x implicit GEMM): every sm_80+ GPU, strided data gradients, and 3xTF32
//             for float32 HIGH and HIGHEST.
// Each is a registry variant (implicit_gemm.sm90, implicit_gemm.sm80; dispatch/variants.def), which the Supports
// predicates below decide together with the device arch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/shared/kernels.h"

namespace jaxconv {
namespace cuda {

struct IgemmProblem {
  int64_t n, c, k;        // batch, input channels, output channels
  int64_t in[3];          // D, H, W
  int64_t win[3];         // T, R, S
  int64_t out[3];         // Z, P, Q (consistent with in/win/pads/stride/dil, as lax computes it)
  int64_t pad_lo[3], pad_hi[3];  // >= 0
  int64_t stride[3], dil[3];     // >= 1
};

// The arithmetic of the tensor-core path. Operands are bf16 (kBF16), f16 (kF16) or f32 (kTF32, k3xTF32);
// accumulation is f32 always. k3xTF32 splits each f32 operand into big + small TF32 parts and sums three
// products (about FP32 accuracy): float32 at HIGH/HIGHEST precision.
enum class IgemmMath { kBF16, kF16, kTF32, k3xTF32 };
// A call's arithmetic: float32 follows lax on the GPU, DEFAULT may use TF32; HIGH and HIGHEST get the ~FP32-accurate
// 3xTF32.
inline IgemmMath MathFor(const ConvParams& p, DType in) {
  switch (in) {
    case DType::kBF16: return IgemmMath::kBF16;
    case DType::kF16: return IgemmMath::kF16;
    default: return p.precision[0] == kPrecisionDefault ? IgemmMath::kTF32 : IgemmMath::k3xTF32;
  }
}

// Output element type: the operand type (bf16, f16 or f32), or f32 (kF32) for 16-bit operands.
enum class IgemmOut { kSame, kF32 };

// Arguments of one call. a, b: fprop x, w; dgrad dy, w; wgrad x, dy. out: fprop y, dgrad dx, wgrad dw.
// wgrad's dw is always f32 (`out_type` is ignored for wgrad), in KTRSC, written densely.
// bias (fprop only, may be null): k elements of the output type; act: jaxconv's Activation (conv_params.h);
// fprop computes y = act(acc + bias). dgrad and wgrad ignore bias and act.
// workspace: at least WorkspaceBytes of the implementation, 256-byte aligned, contents undefined on entry.
struct IgemmArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;
  int64_t act = 0;
  IgemmOut out_type = IgemmOut::kSame;
  void* out = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Each implementation provides, for op in {kFwd, kDgrad, kWgrad}:
//   Supports: whether it runs this problem (pure host code: no CUDA calls, no device queries).
//   WorkspaceBytes: bytes it needs; a function of (problem, op, math) alone (plans that depend on the number
//     of multiprocessors use kPlanSms), because XLA allocates it at compile time.
//   Run: enqueues the op on `stream` (no allocation, no synchronisation), returns the first CUDA error;
//     cudaErrorNotSupported when the problem is not supported, cudaErrorInvalidValue on a short workspace.
// The sm90 functions report Supports == false when the build has no sm_90a code.
// Whether this build has the Hopper kernels (sm_90a code for the *sm90* files).
bool IgemmSm90Built();
bool IgemmSm90Supports(const IgemmProblem& pr, Op op, IgemmMath math);
size_t IgemmSm90WorkspaceBytes(const IgemmProblem& pr, Op op, IgemmMath math);
cudaError_t IgemmSm90Run(const IgemmProblem& pr, Op op, IgemmMath math, const IgemmArgs& args,
                         cudaStream_t stream);

// The large-window TF32 forward (sm90_dgrad.cu, Hopper): float32 operands as TF32, f32 y. A 1-D or 2-D problem (D =
// T = Z = 1, no depth padding) whose window may reach over up to 255 input positions per dim ((win - 1) * dil < 255,
// pads <= 256: the rank-2 TMA im2col box), for few output tiles over a long reduction: always split over it (f32
// slices in the workspace, added in a fixed order). y is written batch-inner, (Z, P, Q, N, K). No bias or
// activation (args.bias null, act kActNone); out_type is ignored. The TF32 filter gradient runs through it
// (swapped_wgrad_sm90.cu). Contract as above.
bool IgemmSm90LargeWindowSupports(const IgemmProblem& pr);
size_t IgemmSm90LargeWindowWorkspaceBytes(const IgemmProblem& pr);
cudaError_t IgemmSm90LargeWindowRun(const IgemmProblem& pr, const IgemmArgs& args, cudaStream_t stream);

// Hopper forwards written through strided views of one larger tensor (sm90_scatter.cu; the phases of a strided data
// gradient, phased_dgrad_sm90.cu). Phase i computes the forward pr (operands a = x, b = w as above) and
// writes its y[n, z, p, q, :] to out + n * out_stride[0] + z * out_stride[1] + p * out_stride[2] + q * out_stride[3]
// (elements, the k channels contiguous; out and every stride a multiple of two elements); other elements are left
// untouched. All phases have the same k; at most kMaxScatterPhases; one launch each, in order, the later ones as
// programmatic dependents that may start while the previous one finishes.
// Operands bf16, f16, or f32 as TF32; y in the operand type; no bias or activation; no workspace. Contract as above.
inline constexpr int kMaxScatterPhases = 8;
struct IgemmScatterPhase {
  IgemmProblem pr;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
};
bool IgemmSm90ScatterFwdSupports(const IgemmProblem* prs, int count, IgemmMath math);
cudaError_t IgemmSm90ScatterFwdRun(const IgemmScatterPhase* phases, int count, IgemmMath math,
                                   const int64_t out_stride[4], cudaStream_t stream);

bool IgemmSm80Supports(const IgemmProblem& pr, Op op, IgemmMath math);
size_t IgemmSm80WorkspaceBytes(const IgemmProblem& pr, Op op, IgemmMath math);
cudaError_t IgemmSm80Run(const IgemmProblem& pr, Op op, IgemmMath math, const IgemmArgs& args,
                         cudaStream_t stream);

// ---- gemm1x1_sm90*.cu: 1x1 convolutions as Hopper GEMMs (CUTLASS 3.x, TMA + wgmma, two consumer warpgroups) ----
// 1x1 convolutions (window 1 in every dim, stride 1, no padding, dilation 1, groups 1, channels-last) as GEMMs on
// jaxconv's own layouts: x (M = N*D*H*W, C) row-major, w (C, K) row-major (the channels-last filter with T=R=S=1), y /
// dy (M, K) row-major, dx (M, C), dw (C, K). No staging: the kernels read and write the caller's buffers. Operands
// bf16, f16, or f32 as TF32 (DEFAULT precision only); fwd/dgrad results in the operand dtype, wgrad's in the operand
// dtype or f32. fwd fuses y = act(acc + bias[k]) (bias used when p.has_bias); its float32 filter comes transposed, w^T
// (K, C) row-major (wgmma reads TF32 K-major only). wgrad is split over M deterministically (f32 partial sums in the
// workspace, reduced in a fixed order). Same contract as the Igemm* functions above (Supports pure host code,
// WorkspaceBytes a function of the problem alone; Run enqueues only: cudaErrorNotSupported with nothing enqueued when
// it does not take the problem, cudaErrorInvalidValue on a short workspace). Always "not supported" in builds without
// sm_90a code.
bool Gemm1x1Sm90Supports(const ConvParams& p, Op op, DType in, DType out);
size_t Gemm1x1Sm90WorkspaceBytes(const ConvParams& p, Op op, DType in, DType out);
cudaError_t Gemm1x1Sm90Run(const ConvParams& p, Op op, DType in, DType out, const void* a, const void* b,
                           const void* bias, void* out_buf, void* workspace, size_t workspace_bytes, cudaStream_t s);

}  // namespace cuda
}  // namespace jaxconv
