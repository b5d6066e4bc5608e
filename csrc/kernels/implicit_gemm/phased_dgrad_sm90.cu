// implicit_gemm.phased_dgrad_sm90: strided data gradients (dilation 1) as Hopper forwards, one per phase.
// With stride s in a dim, dx's rows h = i s + a (phase a < s) receive only the taps r = a + pad_lo (mod s):
//   dx[i s + a] = sum_{j < taps_a} dy[i + off - j] w[r0 + j s],  r0 = (a + pad_lo) mod s,  off = (a + pad_lo - r0) / s,
// taps_a = ceil((R - r0) / s): the unit-stride forward of dy with those taps flipped (PhaseFilterKernel), pads
// lo = taps_a - 1 - off and hi = out_a - P - lo + taps_a - 1 (out_a = ceil((H - a) / s) rows), written to every s-th
// row of dx from row a (IgemmSm90ScatterFwdRun). No MMA is spent on the zeros of the dilated dy, as in the mma.sync
// strided kernel, but on wgmma. Each tap is in exactly one phase: the sub-filters together fill the staged filter's
// slot.
#include <algorithm>
#include <string>
#include <utility>

#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/staging.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace variants::implicit_gemm_phased_dgrad_sm90 {
namespace {

using cuda::CeilDiv;
using cuda::IgemmMath;
using cuda::IgemmProblem;
using cuda::kMaxScatterPhases;
using cuda::igemm::PhaseDim;
using cuda::igemm::PhaseProblem;

// Phase a of dim d (pads >= 0); taps or out 0 when it has none.
PhaseDim PhaseOf(const ConvParams& p, int d, int64_t a) {
  const int64_t s = p.stride[d], r0 = (a + p.pad_lo[d]) % s;
  PhaseDim ph;
  ph.first = r0;
  ph.taps = p.win[d] > r0 ? CeilDiv(p.win[d] - r0, s) : 0;
  ph.out = p.in[d] > a ? CeilDiv(p.in[d] - a, s) : 0;
  ph.lo = ph.taps - 1 - (a + p.pad_lo[d] - r0) / s;
  ph.hi = ph.out - p.out[d] - ph.lo + ph.taps - 1;
  return ph;
}

// The phases of a strided data gradient, most taps first (each later launch fills the previous one's tail); count 0
// when no stride is over 1, there are more than kMaxScatterPhases, a dilation is not 1, or a phase has no taps, no
// rows or a negative pad. start: dx's first row of the phase per dim.
struct Phases {
  int count = 0;
  PhaseDim dim[kMaxScatterPhases][3];
  int64_t start[kMaxScatterPhases][3];
  IgemmProblem pr[kMaxScatterPhases];
};

Phases PhasesOf(const ConvParams& p) {
  Phases r;
  int64_t n = 1;
  for (int d = 0; d < 3; ++d) {
    if (p.rhs_dil[d] != 1 || p.pad_lo[d] < 0 || p.pad_hi[d] < 0 || p.stride[d] < 1) return r;
    n *= p.stride[d];
  }
  if (n < 2 || n > kMaxScatterPhases) return r;
  int64_t taps[kMaxScatterPhases];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a[3] = {i / (p.stride[1] * p.stride[2]), i / p.stride[2] % p.stride[1], i % p.stride[2]};
    taps[i] = 1;
    for (int d = 0; d < 3; ++d) {
      r.start[i][d] = a[d];
      r.dim[i][d] = PhaseOf(p, d, a[d]);
      const PhaseDim& ph = r.dim[i][d];
      if (ph.taps < 1 || ph.out < 1 || ph.lo < 0 || ph.hi < 0) return r;
      taps[i] *= ph.taps;
    }
  }
  // Insertion sort by taps, descending (stable).
  for (int64_t i = 1; i < n; ++i) {
    for (int64_t j = i; j > 0 && taps[j] > taps[j - 1]; --j) {
      std::swap(taps[j], taps[j - 1]);
      std::swap(r.dim[j], r.dim[j - 1]);
      std::swap(r.start[j], r.start[j - 1]);
    }
  }
  for (int64_t i = 0; i < n; ++i) r.pr[i] = PhaseProblem(p, r.dim[i]);
  r.count = static_cast<int>(n);
  return r;
}

// 16-byte rows of dy, the sub-filters and dx.
int64_t RowAlign(DType in) { return in == DType::kF32 ? 4 : 8; }

// Bytes of the sub-filters: each tap is in exactly one phase.
size_t FilterBytes(const Problem& pr) {
  return static_cast<size_t>(SpatialCount(pr.p.win) * pr.p.c[0] * pr.p.k[0]) * cuda::igemm::InBytes(pr.in);
}

}  // namespace

std::string PlanError(const Problem& pr) {
  const ConvParams& p = pr.p;
  const DType in = pr.in;
  if (pr.dev.arch != 90 || !cuda::IgemmSm90Built()) {
    return "the Hopper kernels run on sm_90, in builds with sm_90a code";
  }
  if (pr.op != Op::kDgrad || pr.out != in || (in != DType::kF32 && in != DType::kBF16 && in != DType::kF16)) {
    return "it runs data gradients of 16-bit or float32 operands with the result in that dtype";
  }
  const IgemmMath math = cuda::MathFor(p, in);
  if (math == IgemmMath::k3xTF32) return "it takes no float32 at HIGH or HIGHEST precision (3xTF32)";
  if (p.c[0] % RowAlign(in) != 0 || p.k[0] % RowAlign(in) != 0) return "it needs 16-byte channel rows";
  if (!cuda::igemm::PreferSm90(cuda::igemm::ToProblem(p, in), Op::kDgrad)) return "it takes c >= 64";
  const Phases ph = PhasesOf(p);
  if (ph.count == 0) {
    return "it takes 2 to 8 stride phases, each with taps and rows, dilation 1 and no negative padding";
  }
  if (!cuda::IgemmSm90ScatterFwdSupports(ph.pr, ph.count, math)) {
    return "the Hopper scatter forward does not take its phases";
  }
  if (!cuda::igemm::PhaseFiltersFit(p, p.k[0] * static_cast<int64_t>(cuda::igemm::InBytes(in)))) {
    return "the sub-filters' indices pass 32 bits";
  }
  return {};
}

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::igemm::FamilyError(pr); !why.empty()) return why;
  return PlanError(pr);
}

size_t Workspace(const Problem& pr) { return FilterBytes(pr); }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const ConvParams& p = pr.p;
  if (b.ws_bytes < Workspace(pr)) return cudaErrorInvalidValue;
  if (!cuda::Aligned16(b.a) || !cuda::Aligned16(b.b) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
  const Phases ph = PhasesOf(p);
  const int64_t elem = static_cast<int64_t>(cuda::igemm::InBytes(pr.in)), c = p.c[0], k = p.k[0];
  cuda::igemm::PhaseFilters f{};
  cuda::IgemmScatterPhase run[kMaxScatterPhases];
  int64_t rows = 0;
  for (int i = 0; i < ph.count; ++i) {
    for (int d = 0; d < 3; ++d) {  // windows < 256 (the Hopper forward's)
      f.first[i][d] = static_cast<int>(ph.dim[i][d].first);
      f.count[i][d] = static_cast<int>(ph.dim[i][d].taps);
    }
    f.offset[i] = rows;
    run[i].pr = ph.pr[i];
    run[i].a = b.a;
    run[i].b = static_cast<const char*>(b.ws) + rows * k * elem;
    // dx (N, D, H, W, C): the phase's row (n, z, p, q) is dx's (n, z s0 + a0, p s1 + a1, q s2 + a2).
    const int64_t* a = ph.start[i];
    run[i].out = static_cast<char*>(b.out) + ((a[0] * p.in[1] + a[1]) * p.in[2] + a[2]) * c * elem;
    rows += ph.dim[i][0].taps * ph.dim[i][1].taps * ph.dim[i][2].taps * c;
  }
  for (int d = 0; d < 3; ++d) {
    f.win[d] = static_cast<int>(p.win[d]);
    f.step[d] = static_cast<int>(p.stride[d]);
  }
  if (const cudaError_t e = cuda::igemm::LaunchPhaseFilters(p, f, ph.count, k * elem, b.b, b.ws, s);
      e != cudaSuccess) {
    return e;
  }
  const int64_t hw = p.in[1] * p.in[2];
  const int64_t out_stride[4] = {p.in[0] * hw * c, p.stride[0] * hw * c, p.stride[1] * p.in[2] * c, p.stride[2] * c};
  return cuda::IgemmSm90ScatterFwdRun(run, ph.count, cuda::MathFor(p, pr.in), out_stride, s);
}

}  // namespace variants::implicit_gemm_phased_dgrad_sm90
}  // namespace jaxconv
