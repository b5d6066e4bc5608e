// The implicit_gemm family's shared host rules (plain C++, no kernels): the problem its conv kernels see (channels
// zero-padded to 16 bytes), the staged workspace of the conv variants, which of the two kernel sets auto prefers, and
// the hooks by which the chunked first-layer and the padded-k variants run the family's GEMM variants.
//
// jaxconv's channels-last filter is (T, R, S, C, K) (K innermost, as Flax and lax's HWIO); the conv kernels want
// KTRSC (C innermost, the GEMM's reduction dimension contiguous). So fwd and dgrad first transpose the filter into
// the workspace, and wgrad computes an f32 KTRSC gradient in the workspace and transposes (and casts) it into the
// result (staging.cu). Activations need no conversion: channels-last NDHWC is the kernels' layout. Bias and
// activation are fused into the kernels' fprop epilogues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"
#include "dispatch/rules.h"
#include "dispatch/variant.h"
#include "kernels/implicit_gemm/igemm.h"

namespace jaxconv {
namespace cuda::igemm {

inline constexpr size_t kAlign = 256;
inline size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

inline size_t InBytes(DType in) { return in == DType::kF32 ? 4 : 2; }

// The family gate of every variant: what the tensor-core kernels are written for (dispatch/rules.h).
inline std::string FamilyError(const Problem& pr) { return ImplicitGemmError(pr.p, pr.in, pr.out); }

// The problem the conv kernels see: channels padded to the alignment (ImplicitGemmPaddedC; ImplicitGemmPaddedK, which
// changes k only for the padded-k variants, whose gate is the family's on the padded problem).
inline IgemmProblem ToProblem(const ConvParams& p, DType in) {
  IgemmProblem pr;
  pr.n = p.n[0];
  pr.c = ImplicitGemmPaddedC(p, in);
  pr.k = ImplicitGemmPaddedK(p, in);
  for (int d = 0; d < 3; ++d) {
    pr.in[d] = p.in[d];
    pr.win[d] = p.win[d];
    pr.out[d] = p.out[d];
    pr.pad_lo[d] = p.pad_lo[d];
    pr.pad_hi[d] = p.pad_hi[d];
    pr.stride[d] = p.stride[d];
    pr.dil[d] = p.rhs_dil[d];
  }
  return pr;
}

// The conv variants' staging: [filter: fwd/dgrad the KTRSC filter, wgrad the f32 KTRSC gradient (both with the
// padded c and k)][padded activations, when c is not aligned: fwd/wgrad x, dgrad dx][when k is not aligned: fwd y,
// dgrad/wgrad dy with the padded k][fwd's bias padded to k, when k is not aligned], then the kernel's own workspace.
struct Staging {
  size_t filter = 0, act = 0, out = 0, bias = 0;
  size_t bytes() const { return filter + act + out + bias; }
};

inline Staging StagingOf(const ConvParams& p, Op op, DType in) {
  const int64_t cp = ImplicitGemmPaddedC(p, in), kp = ImplicitGemmPaddedK(p, in);
  const size_t wp = static_cast<size_t>(kp * SpatialCount(p.win) * cp);
  Staging st;
  st.filter = AlignUp(wp * (op == Op::kWgrad ? 4 : InBytes(in)));
  if (cp != p.c[0]) st.act = AlignUp(static_cast<size_t>(p.n[0] * SpatialCount(p.in) * cp) * InBytes(in));
  if (kp != p.k[0]) {
    st.out = AlignUp(static_cast<size_t>(p.n[0] * SpatialCount(p.out) * kp) * InBytes(in));
    if (op == Op::kFwd && p.has_bias[0]) st.bias = AlignUp(static_cast<size_t>(kp) * InBytes(in));
  }
  return st;
}

// A conv kernel set's own workspace (IgemmSm90WorkspaceBytes or IgemmSm80WorkspaceBytes).
using ConvKernelWorkspace = size_t (*)(const IgemmProblem&, Op, IgemmMath);
// The workspace of a staged conv variant, in RunStaged's layout: the staging, then the kernels' own.
inline size_t StagedWorkspace(const Problem& pr, ConvKernelWorkspace kernel) {
  return StagingOf(pr.p, pr.op, pr.in).bytes() + AlignUp(kernel(ToProblem(pr.p, pr.in), pr.op, MathFor(pr.p, pr.in)));
}

// Whether the Hopper kernels should run a problem they support. Measured on the H100 (ResNet-50 layers, bf16,
// batch 32 and 128, jaxconv.autotune; benchmarks/algorithm_survey.py): the mma.sync kernels' narrow tiles win
// the fprop with short reductions (taps * c < 576, e.g. 1x1 layers that the GEMM path does not take); with
// their 128x64 tiles the Hopper kernels win k = 64 (fprop) and c = 64 (dgrad) and every filter gradient. Below 64
// channels (not re-measured with the 128x64 tiles) the mma.sync kernels keep the problem.
inline bool PreferSm90(const IgemmProblem& pr, Op op) {
  switch (op) {
    case Op::kFwd: return pr.k >= 64 && pr.c * pr.win[0] * pr.win[1] * pr.win[2] >= 576;
    case Op::kDgrad: return pr.c >= 64;
    default: return true;
  }
}

// Whether either conv kernel set (Hopper or mma.sync, whatever the device) takes the padded problem: the condition
// under which the staged conv route was entered at all, which the swapped filter gradient keeps (the flipped and
// phased data gradients check only the Hopper forwards they run, so they also take 3-D problems).
inline bool StagedKernelExists(const ConvParams& p, Op op, DType in) {
  const IgemmProblem pr = ToProblem(p, in);
  const IgemmMath math = MathFor(p, in);
  return IgemmSm90Supports(pr, op, math) || IgemmSm80Supports(pr, op, math);
}

// The forward of a data gradient, dy (N, Z, P, Q, K) -> dx's rows of one phase per dim, C channels: `taps` taps of
// dilation `dil` (the phase's sub-filter, flipped), pads lo and hi, `out` rows (flipped_dgrad_sm90.cu: one phase of
// every tap; phased_dgrad_sm90.cu: one per stride phase).
struct PhaseDim {
  int64_t first = 0, taps = 0, lo = 0, hi = 0, out = 0, dil = 1;  // first: the phase's first tap (PhaseFilters)
};

inline IgemmProblem PhaseProblem(const ConvParams& p, const PhaseDim ph[3]) {
  IgemmProblem pr;
  pr.n = p.n[0];
  pr.c = p.k[0];
  pr.k = p.c[0];
  for (int d = 0; d < 3; ++d) {
    pr.in[d] = p.out[d];
    pr.win[d] = ph[d].taps;
    pr.out[d] = ph[d].out;
    pr.pad_lo[d] = ph[d].lo;
    pr.pad_hi[d] = ph[d].hi;
    pr.stride[d] = 1;
    pr.dil[d] = ph[d].dil;
  }
  return pr;
}

// LaunchPhaseFilters' 32-bit indices: the sub-filters' 16-byte units (rows of row_bytes) of all phases.
inline bool PhaseFiltersFit(const ConvParams& p, int64_t row_bytes) {
  return row_bytes % 16 == 0 && SpatialCount(p.win) * p.c[0] * (row_bytes / 16) <= INT32_MAX;
}

}  // namespace cuda::igemm

// The GEMM variants of the family as the chunked first-layer variant (im2col_chunked.cu) runs them on its 1x1
// problem, and as the padded-k variants (padded_k.cu) run the staged ones. PlanError: the variant's Applies without
// the family gate, which today's recursive call on that problem never checked (its filter gradient has a float32
// result for 16-bit operands), and which the padded-k variants check on the problem with k padded. Workspace and
// Launch: the registry's.
#define JAXCONV_IGEMM_INNER(id)                                       \
  namespace variants::id {                                            \
  std::string PlanError(const Problem&);                              \
  size_t Workspace(const Problem&);                                   \
  cudaError_t Launch(const Problem&, const Buffers&, cudaStream_t);   \
  }
JAXCONV_IGEMM_INNER(implicit_gemm_gemm1x1_sm90)
JAXCONV_IGEMM_INNER(implicit_gemm_flipped_dgrad_sm90)
JAXCONV_IGEMM_INNER(implicit_gemm_phased_dgrad_sm90)
JAXCONV_IGEMM_INNER(implicit_gemm_swapped_wgrad_sm90)
JAXCONV_IGEMM_INNER(implicit_gemm_sm90)
JAXCONV_IGEMM_INNER(implicit_gemm_sm80)
#undef JAXCONV_IGEMM_INNER

namespace variants::implicit_gemm_sm90 {
// Today's choice between the two conv kernel sets, auto's rule after PreferTensorCores: PreferSm90, or the mma.sync
// kernels do not take the problem.
bool Sm90Preferred(const Problem&);
}

}  // namespace jaxconv
