// Ampere-style tensor-core implicit-GEMM convolutions (CUTLASS 2.x, mma.sync + cp.async multistage): the
// general tensor-core path on every sm_80+ GPU (the sm_80 code also runs on Hopper), the only one for strided
// data gradients and for float32 at HIGH/HIGHEST (3xTF32). Interface and tensor layouts: igemm.h.
//
// WHAT IgemmSm80Supports(pr, op, math) ACCEPTS (all of it must hold):
//   * a 2-D problem after folding depth into the batch: T == 1, stride[0] == 1, pad_lo[0] == pad_hi[0] == 0
//     (then Z == D, and the kernels see batch N*D); so every 1-D and 2-D problem, and 3-D ones with a 1-deep
//     window and unit depth stride (e.g. the spatial half of a (2+1)-D conv). Other 3-D problems: false.
//   * every size >= 1, pads >= 0, strides and dilations >= 1, out[] consistent with the rest (as lax computes).
//   * C and K multiples of 8 (kBF16, kF16) or 4 (kTF32, k3xTF32): 128-bit accesses (kOptimized iterators).
//   * fprop and dgrad: R <= 32 and S <= 32 (the iterators keep one predicate bit per filter row/column).
//   * dgrad: stride (H, W) == (1, 1) with any dilation, or any stride with dilation (1, 1). (CUTLASS's strided
//     dgrad kernel rejects dilation; the unit-stride one rejects stride.) Strided and dilated at once: false.
//   * x, w and y (dy, dx) each under 2^31 bytes in the operand type, dw (f32) under 2^31 bytes, every scalar
//     (N*D, H, W, C, K, ...) under 2^30, and at most 65535 tiles of 64 along the GEMM N dimension (fprop K,
//     dgrad C, wgrad R*S*C): CUTLASS's 32-bit indexing and grid limits.
//   Asymmetric padding (pad_hi != pad_lo) is fine for all three ops: the kernels take the lower pad and the
//   explicit output size and bounds-check every position (h in [0, H) for fprop/wgrad, p in [0, P) for dgrad,
//   including the strided dgrad's per-phase start, which depends on pad_lo alone).
//
// WHAT IgemmSm80Run ADDITIONALLY REQUIRES (else cudaErrorNotSupported, nothing enqueued):
//   * out_type: kSame always works; kF32 only where it is the same thing (kTF32, k3xTF32). For 16-bit
//     operands fprop/dgrad write the operand type only (the caller casts). wgrad ignores out_type (dw is f32).
//   * fprop: bias (out type, K elements, or null) and act (kActNone, kActRelu, kActGelu = tanh form,
//     kActSilu) are all fused in the epilogue: y = act(acc + bias[k]) computed in f32, rounded once.
//     dgrad and wgrad ignore bias and act, as igemm.h says.
//   * a, b, out non-null; a split op: workspace of IgemmSm80WorkspaceBytes (else cudaErrorInvalidValue).
//   * a, b, out, bias, workspace 16-byte aligned (128-bit vector accesses; XLA's buffers are).
//   * compute capability >= 8.0: the caller checks (these kernels trap on older GPUs).
//
// Kernels (22 CUTLASS instantiations; 16 with -DJAXCONV_IGEMM_SM80_NARROW_TILES=0):
//   main tiles, 4 kernels per math (fprop, unit-stride dgrad, strided dgrad, wgrad), GEMM tile 128x128:
//     kBF16, kF16: 128x128x32, 64x64x32 warps (4 warps), mma 16x8x16, 4 stages (64 KiB smem)
//     kTF32:   f32 in memory, TF32 math (arch::OpMultiplyAdd on float operands rounds them to TF32):
//              128x128x16, 64x64x16 warps, mma 16x8x8, 4 stages (64 KiB)
//     k3xTF32: arch::OpMultiplyAddFastF32 (big + small TF32 parts, 3 products): 128x128x16, 32x64x16 warps
//              (8 warps, as CUTLASS's fast-f32 library kernels), 3 stages (48 KiB)
//   narrow tiles, kBF16 and kF16 only, 3 kernels each: fprop and unit-stride dgrad 128x64x32 (when GEMM N
//     <= 64 or the 128x128 grid has <= 66 tiles), wgrad 64x128x32 (when K <= 64); 5 stages. See UseNarrowN.
//   fprop: Conv2dFprop kOptimized, epilogue BiasActOp (bias as a zero-stride C tensor, runtime activation); 3xTF32
//          on small grids in parallel split-K, the bias and activation then in ReduceSplitsBiasAct (FwdSplits).
//   dgrad: Conv2dDgrad kOptimized, kUnity for stride (1, 1) (any dilation), kStrided
//          (ImplicitGemmConvolutionStridedDgrad) for larger strides (dilation 1 only). Measured on H100: the
//          strided kernel at stride 1 is 10-25% slower than the unit-stride one, hence both. 3xTF32 at unit stride
//          on small grids in parallel split-K, as fprop.
//   wgrad: Conv2dWgrad kOptimized, A = dy (K x NPQ), B = x (NPQ x RSC), D = dw (K x RSC), f32 out; parallel
//          split-K into the workspace + ReduceSplits (shared/reduce_splits.cu, fixed order: deterministic).
// WORKSPACE: wgrad: splits * K * R * S * C * 4 bytes when splits > 1, else 0, with (16-bit, TF32)
//   splits = clamp(ceil(264 / tiles), 1, min(256, N*D*P*Q / 1024)), tiles = ceil(K / tm) * ceil(R*S*C / 128),
//   tm = 64 for 16-bit K <= 64 (narrow), else 128 (264 = 2 CTAs on each of kPlanSms = 132 SMs), or (3xTF32) the
//   wave model of Plan3xSplits. 3xTF32 fprop and unit-stride dgrad on at most 66 128x128 tiles: splits * (output
//   elements) * 4 bytes when FwdSplits gives more than one; else 0.
// Only 2-D CUTLASS kernels: the 3-D ones would double the instantiations (CI builds this file twice on two
// cores), and CUTLASS 2.x has no optimized strided 3-D dgrad anyway.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/igemm.h"
#include "kernels/implicit_gemm/staging.h"
#include "kernels/shared/common.cuh"

#include "cutlass/cutlass.h"
#include "cutlass/array.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_dgrad.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/conv/kernel/default_conv2d_wgrad.h"
#include "cutlass/conv/threadblock/threadblock_swizzle.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"

namespace jaxconv {
namespace cuda {
namespace {

using cutlass::conv::Conv2dProblemSize;

// ---------------------------------------------------------------------------------------------------------
// Tile plan (shared by Supports, WorkspaceBytes and Run so that all three agree).
// ---------------------------------------------------------------------------------------------------------
// Narrow tiles for 16-bit operands (see Cfg16Narrow): 6 more instantiations. Build with
// -DJAXCONV_IGEMM_SM80_NARROW_TILES=0 to drop them (everything then runs on the 128x128 tiles).
#ifndef JAXCONV_IGEMM_SM80_NARROW_TILES
#define JAXCONV_IGEMM_SM80_NARROW_TILES 1
#endif
constexpr bool kNarrowTiles = JAXCONV_IGEMM_SM80_NARROW_TILES != 0;
constexpr int64_t kTile = 128;       // the main output tiles: 128 x 128 for every math and op
constexpr int64_t kNarrowTile = 64;  // the narrow side of the 16-bit narrow tiles (128 x 64, 64 x 128)
constexpr int64_t kMaxGridYZ = 65535;
// wgrad split-K: aim at two CTAs per multiprocessor of the planning GPU, each split reducing at least this many
// GEMM-K elements (N*P*Q positions) so that the f32 partials stay small next to the operand traffic.
constexpr int64_t kSplitTargetCtas = 2 * kPlanSms;
constexpr int64_t kMinSplitK = 1024;
constexpr int64_t kMaxSplits = 256;

int64_t CeilDiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }

int AlignOf(IgemmMath m) { return (m == IgemmMath::kBF16 || m == IgemmMath::kF16) ? 8 : 4; }
int64_t ElemBytesOf(IgemmMath m) { return (m == IgemmMath::kBF16 || m == IgemmMath::kF16) ? 2 : 4; }

// The 2-D problem the kernels run, or false. Pure host code.
bool MapProblem(const IgemmProblem& pr, Op op, IgemmMath math, Conv2dProblemSize* out) {
  if (op != Op::kFwd && op != Op::kDgrad && op != Op::kWgrad) return false;
  if (math != IgemmMath::kBF16 && math != IgemmMath::kF16 && math != IgemmMath::kTF32 &&
      math != IgemmMath::k3xTF32) {
    return false;
  }
  const int64_t kInt = int64_t(1) << 30;  // every scalar the kernels see stays far below INT_MAX
  if (pr.n < 1 || pr.c < 1 || pr.k < 1 || pr.n >= kInt || pr.c >= kInt || pr.k >= kInt) return false;
  for (int d = 0; d < 3; ++d) {
    if (pr.in[d] < 1 || pr.win[d] < 1 || pr.out[d] < 1 || pr.stride[d] < 1 || pr.dil[d] < 1) return false;
    if (pr.pad_lo[d] < 0 || pr.pad_hi[d] < 0) return false;
    if (pr.in[d] >= kInt || pr.win[d] >= kInt || pr.out[d] >= kInt || pr.stride[d] >= kInt ||
        pr.dil[d] >= kInt || pr.pad_lo[d] >= kInt || pr.pad_hi[d] >= kInt) {
      return false;
    }
    // out must be what lax computes: the kernels trust P, Q for their bounds.
    const int64_t span = pr.in[d] + pr.pad_lo[d] + pr.pad_hi[d] - ((pr.win[d] - 1) * pr.dil[d] + 1);
    if (span < 0 || span / pr.stride[d] + 1 != pr.out[d]) return false;
  }
  // Depth folds into the batch when the window has depth 1 and the depth axis is a plain batch-like axis.
  if (pr.win[0] != 1 || pr.stride[0] != 1 || pr.pad_lo[0] != 0 || pr.pad_hi[0] != 0 || pr.out[0] != pr.in[0]) {
    return false;
  }
  const int64_t n2 = pr.n * pr.in[0];
  const int64_t h = pr.in[1], w = pr.in[2], r = pr.win[1], s = pr.win[2], p = pr.out[1], q = pr.out[2];
  if (n2 >= kInt) return false;

  const int64_t align = AlignOf(math);
  if (pr.c % align != 0 || pr.k % align != 0) return false;

  // Tensor sizes: CUTLASS indexes with 32-bit strides (can_implement checks bytes < 2^31 per operand). The
  // products below cannot overflow int64: every factor is < 2^30 and we stop as soon as one exceeds the limit.
  const int64_t kBytes = int64_t(1) << 31;
  const int64_t eb = ElemBytesOf(math);
  auto under = [&](std::initializer_list<int64_t> dims, int64_t bytes_per) {
    int64_t v = bytes_per;
    for (int64_t x : dims) {
      v *= x;
      if (v >= kBytes) return false;
    }
    return true;
  };
  if (!under({n2, h, w, pr.c}, eb) || !under({pr.k, r, s, pr.c}, eb) || !under({n2, p, q, pr.k}, eb)) {
    return false;
  }
  if (op == Op::kWgrad && !under({pr.k, r, s, pr.c}, 4)) return false;

  // Grid y (and z) are limited to 65535 blocks: tiles along GEMM N (counted for the narrowest tile).
  const int64_t gemm_n = op == Op::kFwd ? pr.k : op == Op::kDgrad ? pr.c : r * s * pr.c;
  if (CeilDiv64(gemm_n, kNarrowTile) > kMaxGridYZ) return false;

  if (op != Op::kWgrad && (r > 32 || s > 32)) return false;  // one mask bit per filter row / column
  // dgrad: unit stride takes any dilation, stride > 1 none (see DgradKernelT).
  if (op == Op::kDgrad && (pr.stride[1] != 1 || pr.stride[2] != 1) && (pr.dil[1] != 1 || pr.dil[2] != 1)) {
    return false;
  }

  *out = Conv2dProblemSize(static_cast<int>(n2), static_cast<int>(h), static_cast<int>(w),
                           static_cast<int>(pr.c), static_cast<int>(pr.k), static_cast<int>(r),
                           static_cast<int>(s), static_cast<int>(p), static_cast<int>(q),
                           static_cast<int>(pr.pad_lo[1]), static_cast<int>(pr.pad_lo[2]),
                           static_cast<int>(pr.stride[1]), static_cast<int>(pr.stride[2]),
                           static_cast<int>(pr.dil[1]), static_cast<int>(pr.dil[2]),
                           cutlass::conv::Mode::kCrossCorrelation, /*split_k_slices=*/1, /*groups=*/1);
  return true;
}

// 3xTF32 split-K plans (wgrad; fprop and unit-stride dgrad on small grids). Its 128x128 kernels hold 255 registers
// a thread over 8 warps, so one CTA fits an SM and kPlanSms of them run at once. s slices then take about
// ceil(tiles * s / kPlanSms) rounds of a slice's K steps, taps * ceil(chunks / s), at about k3xStepUs each, plus s
// partial outputs written and read back at about 3 TB/s (fitted to float32 HIGHEST runs of ResNet-50 res5's 3x3
// forward at batch 32, 52 tiles of 9 x 32 steps, unsplit and in 6 slices, and of a batch-1 3x3 128 -> 128 at 14x14).
// The 264-CTA aim of the 16-bit and TF32 wgrad plans below (two CTAs an SM) overfilled this kernel's waves (res4's
// 3x3 filter gradient at batch 32 ran slower in 8 slices than in 6).
constexpr double k3xStepUs = 1.0;
int64_t Plan3xSplits(int64_t tiles, int64_t taps, int64_t chunks, int64_t out_elems, int64_t max_splits) {
  int64_t best = 1;
  double best_us = 0.0;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const double us = static_cast<double>(CeilDiv64(tiles * s, kPlanSms) * taps * CeilDiv64(chunks, s)) * k3xStepUs +
                      (s > 1 ? static_cast<double>(s * out_elems) * 8.0 / 3.0e6 : 0.0);
    if (s == 1 || us < best_us) {  // strictly less: the fewest slices among equals
      best = s;
      best_us = us;
    }
  }
  return best;
}

constexpr int64_t kF32TileK = 16;

// Number of wgrad K-slices for output tiles of tile_m x tile_n: a pure function of the problem, the math and its
// tile (WorkspaceBytes reports it). 3xTF32: Plan3xSplits over K steps of kF32TileK positions. The others: enough
// slices for kSplitTargetCtas CTAs, each reducing >= kMinSplitK.
int64_t WgradSplits(const Conv2dProblemSize& ps, IgemmMath math, int64_t tile_m, int64_t tile_n) {
  const int64_t tiles = CeilDiv64(ps.K, tile_m) * CeilDiv64(int64_t(ps.R) * ps.S * ps.C, tile_n);
  const int64_t npq = int64_t(ps.N) * ps.P * ps.Q;
  if (math == IgemmMath::k3xTF32) {
    const int64_t steps = CeilDiv64(npq, kF32TileK);
    return Plan3xSplits(tiles, 1, steps, int64_t(ps.K) * ps.R * ps.S * ps.C, steps < kMaxSplits ? steps : kMaxSplits);
  }
  int64_t splits = CeilDiv64(kSplitTargetCtas, tiles);
  const int64_t by_k = npq / kMinSplitK;
  if (splits > by_k) splits = by_k;
  if (splits > kMaxSplits) splits = kMaxSplits;
  return splits < 1 ? 1 : splits;
}

// fprop and unit-stride dgrad in 3xTF32 on grids of at most half a wave of 128x128 tiles: parallel split-K.
// CUTLASS's optimized iterators deal the reduced channels (fprop C, dgrad K) to the slices in chunks of the tile's K
// (slice i takes chunks i, i + splits, ... at every filter tap); each slice writes f32 partials of the whole output to
// the workspace, summed in a fixed order with the bias and activation (ReduceSplitsBiasAct). Slices: Plan3xSplits.
// The other maths keep one slice (16-bit partials would be rounded; TF32 small grids were not measured).
int64_t FwdSplits(const Conv2dProblemSize& ps, Op op, IgemmMath math) {
  if (math != IgemmMath::k3xTF32 || op == Op::kWgrad) return 1;
  const bool fwd = op == Op::kFwd;
  if (!fwd && (ps.stride_h != 1 || ps.stride_w != 1)) return 1;  // CUTLASS's strided dgrad does not split
  const int64_t m = int64_t(ps.N) * (fwd ? int64_t(ps.P) * ps.Q : int64_t(ps.H) * ps.W);
  const int64_t n = fwd ? ps.K : ps.C;
  const int64_t tiles = CeilDiv64(m, kTile) * CeilDiv64(n, kTile);
  if (2 * tiles > kPlanSms) return 1;
  const int64_t chunks = CeilDiv64(fwd ? ps.C : ps.K, kF32TileK);
  return Plan3xSplits(tiles, int64_t(ps.R) * ps.S, chunks, m * n, chunks < kMaxSplits ? chunks : kMaxSplits);
}

// Elements of the fprop / dgrad output (a slice's partial).
int64_t OutCount(const Conv2dProblemSize& ps, Op op) {
  return op == Op::kFwd ? int64_t(ps.N) * ps.P * ps.Q * ps.K : int64_t(ps.N) * ps.H * ps.W * ps.C;
}

// Tile choice (pure host functions of the problem; Run and WorkspaceBytes agree through them). Measured on an
// H100 with bf16 ResNet-50 layers at batch 32 (see Cfg16Narrow): a 64-wide GEMM N side (K = 64 fprop, C = 64
// dgrad) wastes half of a 128x128 tile, and a grid of few 128x128 tiles leaves multiprocessors idle.
bool HasNarrow(IgemmMath m) { return kNarrowTiles && (m == IgemmMath::kBF16 || m == IgemmMath::kF16); }

// fprop and unit-stride dgrad: 128x64 tiles when GEMM N <= 64 or the 128x128 grid fills at most half the SMs.
[[maybe_unused]] bool UseNarrowN(const Conv2dProblemSize& ps, Op op, IgemmMath math) {
  if (!HasNarrow(math) || op == Op::kWgrad) return false;
  if (op == Op::kDgrad && (ps.stride_h != 1 || ps.stride_w != 1)) return false;  // strided: 128x128 only
  const int64_t m = op == Op::kFwd ? int64_t(ps.N) * ps.P * ps.Q : int64_t(ps.N) * ps.H * ps.W;
  const int64_t n = op == Op::kFwd ? ps.K : ps.C;
  return n <= kNarrowTile || CeilDiv64(m, kTile) * CeilDiv64(n, kTile) <= kPlanSms / 2;
}

// wgrad: 64x128 tiles when K (GEMM M) <= 64.
bool UseNarrowWgrad(const Conv2dProblemSize& ps, IgemmMath math) { return HasNarrow(math) && ps.K <= kNarrowTile; }

// ---------------------------------------------------------------------------------------------------------
// Fused fprop epilogue: y = act(acc + bias[k]). The bias arrives as CUTLASS's source tensor C with all strides
// zero (every output row reads the same K-vector), so the standard epilogue loads it; the activation is a
// runtime parameter (a warp-uniform switch), which keeps one kernel per math instead of one per activation.
// Implements the thread-level output-operator concept of cutlass::epilogue::thread::LinearCombination.
// ---------------------------------------------------------------------------------------------------------
template <typename ElementOutput_, int Count>
class BiasActOp {
 public:
  using ElementOutput = ElementOutput_;
  using ElementSource = ElementOutput_;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = ElementOutput_;
  using ElementD = ElementOutput_;
  static int const kCount = Count;
  static cutlass::FloatRoundStyle const kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using FragmentOutput = cutlass::Array<ElementOutput, kCount>;
  using FragmentSource = cutlass::Array<ElementSource, kCount>;
  using FragmentAccumulator = cutlass::Array<ElementAccumulator, kCount>;
  using FragmentCompute = cutlass::Array<ElementCompute, kCount>;

  struct Params {
    int act = 0;       // jaxconv Activation
    int has_bias = 0;  // 1: add the source (the zero-stride bias "tensor")
  };

  CUTLASS_HOST_DEVICE explicit BiasActOp(Params const& p) : act_(p.act), has_bias_(p.has_bias) {}

  CUTLASS_HOST_DEVICE bool is_source_needed() const { return has_bias_ != 0; }

  // Only serial split-K calls this; fprop splits in parallel only (FwdSplits), with no bias or activation.
  CUTLASS_HOST_DEVICE void set_k_partition(int, int) {}

  CUTLASS_HOST_DEVICE FragmentOutput operator()(FragmentAccumulator const& acc, FragmentSource const& src) const {
    cutlass::NumericArrayConverter<ElementCompute, ElementSource, kCount, kRound> to_compute;
    FragmentCompute b = to_compute(src);
    FragmentCompute v;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) v[i] = acc[i] + b[i];
    return Finish(v);
  }

  CUTLASS_HOST_DEVICE FragmentOutput operator()(FragmentAccumulator const& acc) const {
    FragmentCompute v;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) v[i] = acc[i];
    return Finish(v);
  }

 private:
  CUTLASS_HOST_DEVICE FragmentOutput Finish(FragmentCompute v) const {
#if defined(__CUDA_ARCH__)
    if (act_ != kActNone) {  // same formulas as the direct kernels (common.cuh)
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kCount; ++i) v[i] = Activate(v[i], act_);
    }
#endif
    cutlass::NumericArrayConverter<ElementOutput, ElementCompute, kCount, kRound> to_output;
    return to_output(v);
  }

  int act_;
  int has_bias_;
};

// ---------------------------------------------------------------------------------------------------------
// Per-math configuration.
// ---------------------------------------------------------------------------------------------------------
template <IgemmMath M> struct MathCfg;

template <class E> struct Cfg16 {
  using Element = E;
  using Tile = cutlass::gemm::GemmShape<128, 128, 32>;
  using Warp = cutlass::gemm::GemmShape<64, 64, 32>;
  using Inst = cutlass::gemm::GemmShape<16, 8, 16>;
  using MathOp = cutlass::arch::OpMultiplyAdd;
  static constexpr int kStages = 4;
  static constexpr int kAlign = 8;
};
template <> struct MathCfg<IgemmMath::kBF16> : Cfg16<cutlass::bfloat16_t> {};
template <> struct MathCfg<IgemmMath::kF16> : Cfg16<cutlass::half_t> {};

template <IgemmMath M> struct NarrowCfg { static constexpr bool kHas = false; };
#if JAXCONV_IGEMM_SM80_NARROW_TILES
// 16-bit narrow tiles: on the H100 (bf16 ResNet-50 layers, batch 32) they ran fprop, dgrad and wgrad (64x128) with
// 64 channels and small 7x7 grids about a quarter to a third faster than the 128x128 tiles. Where the 128x128 grid is
// large they lose (3x3 256->256 at 14x14), hence UseNarrowN. 5 stages: 60 KiB of shared memory, two CTAs per SM on A100 too.
template <class E> struct Cfg16Narrow : Cfg16<E> {  // fprop, dgrad: GEMM tile 128 x 64
  using Tile = cutlass::gemm::GemmShape<128, 64, 32>;
  using Warp = cutlass::gemm::GemmShape<64, 32, 32>;
  static constexpr int kStages = 5;
};
template <class E> struct Cfg16NarrowM : Cfg16<E> {  // wgrad: GEMM tile 64 x 128
  using Tile = cutlass::gemm::GemmShape<64, 128, 32>;
  using Warp = cutlass::gemm::GemmShape<32, 64, 32>;
  static constexpr int kStages = 5;
};
template <class E> struct NarrowCfg16 {
  static constexpr bool kHas = true;
  using N = Cfg16Narrow<E>;
  using W = Cfg16NarrowM<E>;
};
template <> struct NarrowCfg<IgemmMath::kBF16> : NarrowCfg16<cutlass::bfloat16_t> {};
template <> struct NarrowCfg<IgemmMath::kF16> : NarrowCfg16<cutlass::half_t> {};
static_assert(Cfg16Narrow<cutlass::half_t>::Tile::kM == kTile &&
                  Cfg16Narrow<cutlass::half_t>::Tile::kN == kNarrowTile, "UseNarrowN assumes 128 x 64");
static_assert(Cfg16NarrowM<cutlass::half_t>::Tile::kM == kNarrowTile &&
                  Cfg16NarrowM<cutlass::half_t>::Tile::kN == kTile, "WorkspaceBytes assumes 64 x 128");
#endif  // JAXCONV_IGEMM_SM80_NARROW_TILES

// f32 data with TF32 tensor-core math: float operands + OpMultiplyAdd make the warp-level MMA round each
// operand to TF32 (DefaultMmaTensorOp<..., float, ..., OpMultiplyAdd>); cutlass::tfloat32_t operands (as in
// CUTLASS's unit tests) would instead truncate the low mantissa bits.
template <> struct MathCfg<IgemmMath::kTF32> {
  using Element = float;
  using Tile = cutlass::gemm::GemmShape<128, 128, 16>;
  using Warp = cutlass::gemm::GemmShape<64, 64, 16>;
  using Inst = cutlass::gemm::GemmShape<16, 8, 8>;
  using MathOp = cutlass::arch::OpMultiplyAdd;
  static constexpr int kStages = 4;
  static constexpr int kAlign = 4;
};

template <> struct MathCfg<IgemmMath::k3xTF32> {
  using Element = float;
  using Tile = cutlass::gemm::GemmShape<128, 128, 16>;
  using Warp = cutlass::gemm::GemmShape<32, 64, 16>;
  using Inst = cutlass::gemm::GemmShape<16, 8, 8>;
  using MathOp = cutlass::arch::OpMultiplyAddFastF32;
  static constexpr int kStages = 3;
  static constexpr int kAlign = 4;
};

// WorkspaceBytes and the tile choice assume these tiles.
static_assert(MathCfg<IgemmMath::kBF16>::Tile::kM == kTile && MathCfg<IgemmMath::kBF16>::Tile::kN == kTile, "");
static_assert(MathCfg<IgemmMath::kF16>::Tile::kM == kTile && MathCfg<IgemmMath::kF16>::Tile::kN == kTile, "");
static_assert(MathCfg<IgemmMath::kTF32>::Tile::kM == kTile && MathCfg<IgemmMath::kTF32>::Tile::kN == kTile, "");
static_assert(MathCfg<IgemmMath::k3xTF32>::Tile::kM == kTile && MathCfg<IgemmMath::k3xTF32>::Tile::kN == kTile, "");
using Cfg3x = MathCfg<IgemmMath::k3xTF32>;
static_assert(Cfg3x::Tile::kK == kF32TileK &&
                  (Cfg3x::Tile::kM / Cfg3x::Warp::kM) * (Cfg3x::Tile::kN / Cfg3x::Warp::kN) == 8,
              "Plan3xSplits counts K steps of kF32TileK and one 8-warp CTA per SM");

using cutlass::layout::TensorNHWC;

template <class C>
using FpropKernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
    typename C::Element, TensorNHWC, typename C::Element, TensorNHWC,
    typename C::Element, TensorNHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    typename C::Tile, typename C::Warp, typename C::Inst,
    BiasActOp<typename C::Element, 128 / cutlass::sizeof_bits<typename C::Element>::value>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, C::kStages,
    typename C::MathOp, cutlass::conv::IteratorAlgorithm::kOptimized,
    cutlass::conv::StrideSupport::kUnity,  // fprop: selects the packed-output epilogue; any conv stride works
    C::kAlign, C::kAlign>::Kernel;

// dgrad: two kernels per math. Unit stride (any dilation): Conv2dDgrad kOptimized kUnity (plain
// ImplicitGemmConvolution). Stride > 1 (no dilation: CUTLASS's strided dgrad rejects it at any stride):
// kStrided (ImplicitGemmConvolutionStridedDgrad), which splits dx into stride_h*stride_w phases that each see a
// fixed subset of filter taps, so no MMA is spent on the zeros of the strided output gradient.
template <class C, cutlass::conv::StrideSupport kStride, class Swizzle>
using DgradKernelT = typename cutlass::conv::kernel::DefaultConv2dDgrad<
    typename C::Element, TensorNHWC, typename C::Element, TensorNHWC,
    typename C::Element, TensorNHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    typename C::Tile, typename C::Warp, typename C::Inst,
    cutlass::epilogue::thread::LinearCombination<
        typename C::Element, 128 / cutlass::sizeof_bits<typename C::Element>::value, float,
        float>,
    Swizzle, C::kStages, typename C::MathOp, cutlass::conv::IteratorAlgorithm::kOptimized,
    kStride, C::kAlign, C::kAlign>::Kernel;
template <class C>
using DgradUnityKernel = DgradKernelT<C, cutlass::conv::StrideSupport::kUnity,
                                      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>>;
template <class C>
using DgradStridedKernel = DgradKernelT<C, cutlass::conv::StrideSupport::kStrided,
                                        cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<1>>;

// wgrad: A = dy, B = x (CUTLASS's operand roles), C/D = dw in f32.
template <class C>
using WgradKernel = typename cutlass::conv::kernel::DefaultConv2dWgrad<
    typename C::Element, TensorNHWC, typename C::Element, TensorNHWC, float, TensorNHWC,
    float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, typename C::Tile,
    typename C::Warp, typename C::Inst,
    cutlass::epilogue::thread::LinearCombination<float, 4, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, C::kStages,
    typename C::MathOp, cutlass::conv::IteratorAlgorithm::kOptimized,
    cutlass::conv::StrideSupport::kStrided, C::kAlign, C::kAlign>::Kernel;

// Launches one CUTLASS conv kernel: what device::ImplicitGemmConvolution's initialize() + run() do, minus the
// cudaMemsetAsync that initialize() issues over the whole split-K buffer whenever split_k_slices > 1 (needed
// for serial split-K semaphores only; parallel split-K overwrites every partial).
template <class Kernel>
cudaError_t LaunchConv(typename Kernel::Arguments const& args, cudaStream_t stream) {
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  if (Device::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
  typename Kernel::Params params(args, /*semaphore=*/nullptr);
  typename Kernel::ThreadblockSwizzle swizzle;
  const dim3 grid = swizzle.get_grid_shape(params.grid_tiled_shape);
  const dim3 block(32 * Device::kWarpCount, 1, 1);
  const int smem = static_cast<int>(sizeof(typename Kernel::SharedStorage));
  if (const cudaError_t e = AllowDynamicSmem(cutlass::Kernel<Kernel>, smem); e != cudaSuccess) return e;
  cutlass::Kernel<Kernel><<<grid, block, smem, stream>>>(params);
  return cudaGetLastError();
}

template <class T> cutlass::TensorRef<T, TensorNHWC> Ref(const void* p, const TensorNHWC& layout) {
  return cutlass::TensorRef<T, TensorNHWC>(static_cast<T*>(const_cast<void*>(p)), layout);
}

// The parallel split-K workspace check: a short one is cudaErrorInvalidValue (igemm.h).
bool ShortWorkspace(const IgemmArgs& a, int64_t splits, int64_t count) {
  return splits > 1 &&
         (a.workspace == nullptr || a.workspace_bytes < static_cast<size_t>(splits * count) * sizeof(float));
}

// splits > 1 (FwdSplits; f32 operands only): partials into the workspace, then ReduceSplitsBiasAct.
template <class C>
cudaError_t RunFprop(const Conv2dProblemSize& ps0, const IgemmArgs& a, int64_t splits, cudaStream_t s) {
  using K = FpropKernel<C>;
  using E = typename C::Element;
  const int64_t count = OutCount(ps0, Op::kFwd);
  if (ShortWorkspace(a, splits, count)) return cudaErrorInvalidValue;
  Conv2dProblemSize ps = ps0;
  ps.split_k_slices = static_cast<int>(splits);
  const TensorNHWC lx = TensorNHWC::packed({ps.N, ps.H, ps.W, ps.C});
  const TensorNHWC lw = TensorNHWC::packed({ps.K, ps.R, ps.S, ps.C});
  const TensorNHWC ly = TensorNHWC::packed({ps.N, ps.P, ps.Q, ps.K});
  const TensorNHWC lbias(0, 0, 0);  // every output row reads bias[0..K)
  typename K::EpilogueOutputOp::Params op;
  if (splits > 1) {  // plain partial sums: the reduction adds the bias and applies the activation
    if constexpr (std::is_same_v<E, float>) {
      void* ws = a.workspace;
      typename K::Arguments args(ps, Ref<E>(a.a, lx), Ref<E>(a.b, lw), Ref<E>(ws, ly), Ref<E>(ws, ly), op,
                                 cutlass::conv::SplitKMode::kParallel);
      if (const cudaError_t e = LaunchConv<K>(args, s); e != cudaSuccess) return e;
      return ReduceSplitsBiasAct(static_cast<const float*>(ws), splits, count, ps.K,
                                 static_cast<const float*>(a.bias), a.act, static_cast<float*>(a.out), s);
    } else {
      return cudaErrorNotSupported;
    }
  }
  op.act = static_cast<int>(a.act);
  op.has_bias = a.bias != nullptr;
  typename K::Arguments args(ps, Ref<E>(a.a, lx), Ref<E>(a.b, lw),
                             a.bias != nullptr ? Ref<E>(a.bias, lbias) : Ref<E>(a.out, ly), Ref<E>(a.out, ly),
                             op, cutlass::conv::SplitKMode::kSerial);
  return LaunchConv<K>(args, s);
}

// Runs kernel K (its arguments from make(destination, split mode)) on out, or with splits > 1 in parallel split-K:
// slice k writes its partial output to workspace + k * count (the kernel adds the offset), then the fixed-order sum.
template <class K, class MakeArgs>
cudaError_t LaunchSplitK(const IgemmArgs& a, int64_t splits, int64_t count, MakeArgs make, cudaStream_t s) {
  const cudaError_t e = splits > 1 ? LaunchConv<K>(make(a.workspace, cutlass::conv::SplitKMode::kParallel), s)
                                   : LaunchConv<K>(make(a.out, cutlass::conv::SplitKMode::kSerial), s);
  if (e != cudaSuccess || splits == 1) return e;
  return ReduceSplits(DType::kF32, DType::kF32, a.workspace, splits, count, a.out, s);
}

// splits > 1: unit stride and f32 operands only (FwdSplits), as RunFprop.
template <class C, class K>
cudaError_t RunDgradWith(const Conv2dProblemSize& ps0, const IgemmArgs& a, int64_t splits, cudaStream_t s) {
  using E = typename C::Element;
  const int64_t count = OutCount(ps0, Op::kDgrad);
  if (ShortWorkspace(a, splits, count)) return cudaErrorInvalidValue;
  if (splits > 1 && !std::is_same_v<E, float>) return cudaErrorNotSupported;
  Conv2dProblemSize ps = ps0;
  ps.split_k_slices = static_cast<int>(splits);
  const TensorNHWC ldy = TensorNHWC::packed({ps.N, ps.P, ps.Q, ps.K});
  const TensorNHWC lw = TensorNHWC::packed({ps.K, ps.R, ps.S, ps.C});
  const TensorNHWC ldx = TensorNHWC::packed({ps.N, ps.H, ps.W, ps.C});
  return LaunchSplitK<K>(a, splits, count, [&](void* dst, cutlass::conv::SplitKMode mode) {
    return typename K::Arguments(ps, Ref<E>(a.a, ldy), Ref<E>(a.b, lw), Ref<E>(dst, ldx), Ref<E>(dst, ldx),
                                 {1.0f, 0.0f}, mode);
  }, s);
}

template <class C>
cudaError_t RunDgrad(const Conv2dProblemSize& ps, const IgemmArgs& a, int64_t splits, cudaStream_t s) {
  if (ps.stride_h == 1 && ps.stride_w == 1) return RunDgradWith<C, DgradUnityKernel<C>>(ps, a, splits, s);
  return RunDgradWith<C, DgradStridedKernel<C>>(ps, a, 1, s);
}

template <class C>
cudaError_t RunWgrad(const Conv2dProblemSize& ps0, const IgemmArgs& a, int64_t splits, cudaStream_t s) {
  using K = WgradKernel<C>;
  using E = typename C::Element;
  const int64_t count = int64_t(ps0.K) * ps0.R * ps0.S * ps0.C;
  if (ShortWorkspace(a, splits, count)) return cudaErrorInvalidValue;
  Conv2dProblemSize ps = ps0;
  ps.split_k_slices = static_cast<int>(splits);
  const TensorNHWC ldy = TensorNHWC::packed({ps.N, ps.P, ps.Q, ps.K});
  const TensorNHWC lx = TensorNHWC::packed({ps.N, ps.H, ps.W, ps.C});
  const TensorNHWC ldw = TensorNHWC::packed({ps.K, ps.R, ps.S, ps.C});
  return LaunchSplitK<K>(a, splits, count, [&](void* dst, cutlass::conv::SplitKMode mode) {
    return typename K::Arguments(ps, Ref<E>(a.b, ldy), Ref<E>(a.a, lx), Ref<float>(dst, ldw), Ref<float>(dst, ldw),
                                 {1.0f, 0.0f}, mode);
  }, s);
}

template <IgemmMath M>
cudaError_t RunOp(Op op, const Conv2dProblemSize& ps, const IgemmArgs& a, cudaStream_t s) {
  if constexpr (NarrowCfg<M>::kHas) {
    if (op == Op::kFwd && UseNarrowN(ps, op, M)) return RunFprop<typename NarrowCfg<M>::N>(ps, a, 1, s);
    if (op == Op::kDgrad && UseNarrowN(ps, op, M)) {
      return RunDgradWith<typename NarrowCfg<M>::N, DgradUnityKernel<typename NarrowCfg<M>::N>>(ps, a, 1, s);
    }
    if (op == Op::kWgrad && UseNarrowWgrad(ps, M)) {
      return RunWgrad<typename NarrowCfg<M>::W>(ps, a, WgradSplits(ps, M, kNarrowTile, kTile), s);
    }
  }
  switch (op) {
    case Op::kFwd: return RunFprop<MathCfg<M>>(ps, a, FwdSplits(ps, op, M), s);
    case Op::kDgrad: return RunDgrad<MathCfg<M>>(ps, a, FwdSplits(ps, op, M), s);
    case Op::kWgrad: return RunWgrad<MathCfg<M>>(ps, a, WgradSplits(ps, M, kTile, kTile), s);
  }
  return cudaErrorNotSupported;
}

}  // namespace

bool IgemmSm80Supports(const IgemmProblem& pr, Op op, IgemmMath math) {
  Conv2dProblemSize ps;
  return MapProblem(pr, op, math, &ps);
}

size_t IgemmSm80WorkspaceBytes(const IgemmProblem& pr, Op op, IgemmMath math) {
  Conv2dProblemSize ps;
  if (!MapProblem(pr, op, math, &ps)) return 0;
  if (op != Op::kWgrad) {
    const int64_t splits = FwdSplits(ps, op, math);
    return splits > 1 ? static_cast<size_t>(splits * OutCount(ps, op)) * sizeof(float) : 0;
  }
  const int64_t splits =
      UseNarrowWgrad(ps, math) ? WgradSplits(ps, math, kNarrowTile, kTile) : WgradSplits(ps, math, kTile, kTile);
  if (splits <= 1) return 0;
  return static_cast<size_t>(splits * int64_t(ps.K) * ps.R * ps.S * ps.C) * sizeof(float);
}

cudaError_t IgemmSm80Run(const IgemmProblem& pr, Op op, IgemmMath math, const IgemmArgs& args,
                         cudaStream_t stream) {
  Conv2dProblemSize ps;
  if (!MapProblem(pr, op, math, &ps)) return cudaErrorNotSupported;
  const bool narrow = math == IgemmMath::kBF16 || math == IgemmMath::kF16;
  if (op != Op::kWgrad && narrow && args.out_type != IgemmOut::kSame) return cudaErrorNotSupported;
  if (op == Op::kFwd && (args.act < kActNone || args.act > kActSilu)) return cudaErrorNotSupported;
  if (args.a == nullptr || args.b == nullptr || args.out == nullptr) return cudaErrorInvalidValue;
  // Every global access (bias included) is a 128-bit vector: the pointers must be 16-byte aligned.
  auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(args.a) || misaligned(args.b) || misaligned(args.out) ||
      (op == Op::kFwd && misaligned(args.bias)) || misaligned(args.workspace)) {
    return cudaErrorNotSupported;
  }
  IgemmArgs a = args;
  if (op != Op::kFwd) {  // igemm.h: dgrad and wgrad ignore bias and act
    a.bias = nullptr;
    a.act = kActNone;
  }
  switch (math) {
    case IgemmMath::kBF16: return RunOp<IgemmMath::kBF16>(op, ps, a, stream);
    case IgemmMath::kF16: return RunOp<IgemmMath::kF16>(op, ps, a, stream);
    case IgemmMath::kTF32: return RunOp<IgemmMath::kTF32>(op, ps, a, stream);
    case IgemmMath::k3xTF32: return RunOp<IgemmMath::k3xTF32>(op, ps, a, stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace cuda

// implicit_gemm.sm80: the staged problem (staging.h) on these kernels.
namespace variants::implicit_gemm_sm80 {

std::string PlanError(const Problem& pr) {
  if (pr.dev.arch < 80) return "the mma.sync kernels need sm_80 or newer";
  if (!cuda::IgemmSm80Supports(cuda::igemm::ToProblem(pr.p, pr.in), pr.op, cuda::MathFor(pr.p, pr.in))) {
    return "the mma.sync kernels take 1-D and 2-D problems (a 1-deep window, unit depth stride), windows up to 32 "
           "taps a dim, no strided and dilated data gradient, 32-bit extents";
  }
  return {};
}

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::igemm::FamilyError(pr); !why.empty()) return why;
  return PlanError(pr);
}

size_t Workspace(const Problem& pr) { return cuda::igemm::StagedWorkspace(pr, cuda::IgemmSm80WorkspaceBytes); }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  if (b.ws_bytes < Workspace(pr)) return cudaErrorInvalidValue;
  return cuda::igemm::RunStaged(pr, b, cuda::IgemmSm80Run, s);
}

}  // namespace variants::implicit_gemm_sm80
}  // namespace jaxconv
