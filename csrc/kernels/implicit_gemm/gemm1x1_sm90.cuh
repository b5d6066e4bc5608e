// 1x1 convolutions as plain GEMMs on Hopper (igemm.h): CUTLASS 3.x GEMM kernels (TMA + wgmma, warp-specialised,
// two consumer warpgroups, persistent tile scheduler) directly on jaxconv's channels-last buffers, no staging.
//
//   x (M, C), w (C, K), y / dy (M, K), dx (M, C), dw (C, K), all row-major, M = N*D*H*W.
//   fwd    y  = act(x @ w + bias)   A = x  RowMajor (K-major), B = w RowMajor (N-major)       pingpong 128x128
//          TF32: B = w^T (K, C) ColumnMajor (K-major), transposed by the caller
//   dgrad  dx = dy @ w^T            A = dy RowMajor (K-major), B = w ColumnMajor (K-major)    pingpong 128x128
//   wgrad  dw = x^T @ dy            A = x ColumnMajor (M-major), B = dy RowMajor (N-major)    cooperative 128x128
//          TF32: a CUTLASS 2.x mma.sync GEMM instead (below), 128x128, 128x64 or 64x128
// Instantiations: those three x {bf16, f16, float as TF32} x {128, 64}-wide N tiles (64 when the GEMM's N is at
// most 64, or on small grids), plus 64x128 tiles for 16-bit fwd/dgrad on small grids with N over 64 (TallM); the K
// tile is 128 bytes of operand (64 16-bit values, 32 floats); f32 accumulation; cluster 1x1x1
// (the filter operand is small and L2-resident, so multicast buys little, and odd M tails cost nothing extra).
// TF32 (float32 at DEFAULT precision, as lax) reads f32 operands; wgmma takes TF32 only K-major from shared
// memory. wgrad's MN-major operands: 16-bit through CUTLASS's transposing mainloop (x through registers, dy
// transposed in shared memory); TF32 on CUTLASS 2.x's sm80 GEMM, whose mma.sync fragments load M-major operands
// from shared memory as they are (the transposing mainloop had run at 1.3-2.2x cuBLAS's time on ResNet-50's 1x1
// layers). The fwd filter is transposed by the caller instead: the builder's alternative for a
// K-major A with an MN-major B swaps A and B, which also transposes the epilogue's problem (seen on the H100: wrong
// results with the row-major output and per-column bias used here).
// wgrad's reduction (M pixels) is long while C x K is small: a deterministic split over M. The pixels are cut
// into `splits` equal ranges of `per` pixels, run as one batched GEMM (L = splits, each batch writes its own f32
// slice of the workspace), plus, when splits does not divide M, one more GEMM over the last M - splits*per
// pixels into a further slice; ReduceSplits then adds the slices in a fixed order and converts to the result
// dtype. No atomics, no in-kernel cross-CTA reduction: reruns are bitwise equal.
//
// The kernels of each operand type build in their own file (gemm1x1_sm90_bf16.cu, _f16.cu, _tf32.cu), so that the three
// sets of CUTLASS instantiations build in parallel; gemm1x1_sm90.cu has the entry points and the variant. Built only
// with JAXCONV_IGEMM_SM90 (sm_90a); otherwise this header declares nothing and the entry points report "not
// supported".
#pragma once

#include "kernels/implicit_gemm/igemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/shared/common.cuh"

#if defined(JAXCONV_IGEMM_SM90) && JAXCONV_IGEMM_SM90
#define JAXCONV_GEMM1X1_KERNELS 1
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/numeric_types.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "kernels/shared/cutlass_act.cuh"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/device/gemm_universal.h"
#else
#define JAXCONV_GEMM1X1_KERNELS 0
#endif

namespace jaxconv {
namespace cuda {
#if JAXCONV_GEMM1X1_KERNELS
namespace {

constexpr int64_t kTileM = 128, kTileN = 128;
// GEMMs whose N (fwd and wgrad k, dgrad c) is at most 64 use 128x64 tiles: a 128-wide tile would spend half
// its MMAs on zero columns (ResNet's 64-channel layers, first layers' k = 64).
constexpr int64_t kNarrowTileN = 64;
constexpr int64_t kMaxElems = int64_t(1) << 36;             // per tensor: TMA strides < 2^40 bytes
constexpr int64_t kMaxSplits = 64;
constexpr int64_t kMaxSplitWorkspace = int64_t(256) << 20;  // wgrad partial sums (beyond one slice)
constexpr size_t kAlign = 256;
size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The GEMM extents of a 1x1 problem: pixels, input and output channels.
struct Dims {
  int64_t m, c, k;
};
Dims DimsOf(const ConvParams& p) { return {p.n[0] * SpatialCount(p.in), p.c[0], p.k[0]}; }

// Everything but the kernels' own can_implement. float32 runs here only as TF32 (DEFAULT precision, as lax);
// HIGH and HIGHEST take the conv kernels' 3xTF32.
[[maybe_unused]] bool BasicSupports(const ConvParams& p, Op op, DType in, DType out) {
  const bool tf32 = in == DType::kF32 && p.precision[0] == kPrecisionDefault;
  if (in != DType::kBF16 && in != DType::kF16 && !tf32) return false;
  if (op == Op::kWgrad ? (out != in && out != DType::kF32) : out != in) return false;
  if (p.layout[0] != kChannelsLast || p.groups[0] != 1 || p.batch_groups[0] != 1) return false;
  for (int d = 0; d < 3; ++d) {
    if (p.win[d] != 1 || p.stride[d] != 1 || p.pad_lo[d] != 0 || p.pad_hi[d] != 0) return false;
    if (p.rhs_dil[d] != 1 || p.lhs_dil[d] != 1 || p.in[d] < 1 || p.out[d] != p.in[d]) return false;
  }
  if (op == Op::kFwd && (p.activation[0] < kActNone || p.activation[0] > kActSilu)) return false;
  const Dims g = DimsOf(p);
  const int64_t vec = in == DType::kF32 ? 4 : 8;  // 16-byte TMA rows
  if (p.n[0] < 1 || g.c < 1 || g.k < 1 || g.c % vec != 0 || g.k % vec != 0) return false;
  // CUTLASS's problem shape is int; TMA coordinates are int32 per mode.
  if (g.m > INT32_MAX || g.c > INT32_MAX || g.k > INT32_MAX) return false;
  if (g.c > kMaxElems / g.m || g.k > kMaxElems / g.m || g.c > kMaxElems / g.k) return false;
  return true;
}

// wgrad's split of the M pixels: `splits` ranges of `per` pixels (one batched GEMM) and `rem` = M - splits*per
// more (one extra GEMM when > 0), so slices() f32 partial (C, K) sums, for tiles of tile_m channels c. Estimated
// time in units of one k tile (tile_k pixels) of MMA on one SM: waves * (k tiles per split + per-tile overhead) +
// partial-sum traffic + the tail GEMM.
struct WgradPlan {
  int64_t splits = 1, per = 1, rem = 0;
  int64_t slices() const { return splits + (rem > 0 ? 1 : 0); }
};

WgradPlan PlanWgrad(const Dims& g, int64_t tile_k, int64_t tile_m) {
  const int64_t tiles_mn = CeilDiv(g.c, tile_m) * CeilDiv(g.k, g.k <= kNarrowTileN ? kNarrowTileN : kTileN);
  const int64_t slice_bytes = g.c * g.k * int64_t(sizeof(float));
  constexpr double kTileOverhead = 4.0;    // pipeline fill + epilogue, in k tiles
  constexpr double kPerPartial = 1e-5;     // write + read one f32 partial, in k tiles (spread over the GPU)
  constexpr double kTailLaunch = 6.0;      // the extra GEMM launch
  WgradPlan best;
  best.per = g.m;
  double best_cost = double(CeilDiv(tiles_mn, kPlanSms)) * (double(CeilDiv(g.m, tile_k)) + kTileOverhead);
  const int64_t max_s = std::min<int64_t>(kMaxSplits, g.m);
  for (int64_t s = 2; s <= max_s; ++s) {
    const int64_t per = g.m / s, rem = g.m - s * per;
    const int64_t slices = s + (rem > 0 ? 1 : 0);
    if (slices * slice_bytes > kMaxSplitWorkspace) break;
    double cost = double(CeilDiv(tiles_mn * s, kPlanSms)) * (double(CeilDiv(per, tile_k)) + kTileOverhead) +
                  double(slices) * double(g.c * g.k) * kPerPartial;
    if (rem > 0) cost += double(CeilDiv(tiles_mn, kPlanSms)) * (double(CeilDiv(rem, tile_k)) + kTileOverhead) +
                         kTailLaunch;
    if (cost < best_cost) {
      best_cost = cost;
      best.splits = s;
      best.per = per;
      best.rem = rem;
    }
  }
  return best;
}

size_t WgradPartialBytes(const Dims& g, int64_t tile_k, int64_t tile_m) {
  return AlignUp(static_cast<size_t>(PlanWgrad(g, tile_k, tile_m).slices() * g.c * g.k) * sizeof(float));
}

// Whether the op's GEMM N (fwd and wgrad k, dgrad c) takes the kNarrowTileN-wide tiles: N at most 64, or (fwd,
// dgrad) fewer 128x128 tiles than an H100 has SMs, where half-width tiles put twice as many SMs to work (as the
// conv kernels' FwdTileOf in igemm_sm90.cu). kPlanSms, not the device's count: Supports must not query the device.
bool NarrowN(const Dims& g, Op op) {
  const int64_t n = op == Op::kDgrad ? g.c : g.k;
  if (n <= kNarrowTileN) return true;
  return op != Op::kWgrad && CeilDiv(g.m, kTileM) * CeilDiv(n, kTileN) < kPlanSms;
}

// 16-bit fwd/dgrad that NarrowN puts on small tiles although N is over 64 take 64x128 tiles instead: about as many
// tiles, and one warpgroup's m64n128k16 reads 6 KB of shared memory per 64 tensor-core cycles where the two
// m64n64k16 of a 128x64 tile read 8 KB, all that the SM's shared memory delivers in that time.
constexpr int kTallTileM = 64;
bool TallM(const Dims& g, Op op) {
  return op != Op::kWgrad && (op == Op::kDgrad ? g.c : g.k) > kNarrowTileN && NarrowN(g, op);
}

using namespace cute;


using Cluster = Shape<_1, _1, _1>;
using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;

template <class T>
constexpr int Align16B() {
  return 128 / cutlass::sizeof_bits<T>::value;
}
// The K tile: 128-byte operand rows (the 128-byte swizzle), 64 16-bit values or 32 floats.
template <class T>
constexpr int TileK() {
  return 8 * Align16B<T>();
}

// One GEMM type: operands T (float: TF32 MMAs) with layouts LA, LB, output TD (RowMajor M x N), f32
// accumulation, no C operand.
template <class T, int TN, class LA, class LB, class TD, class MainSchedule, class EpiSchedule, class Fusion,
          int TM = kTileM, class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
struct GemmCfg {
  using Tile = Shape<Int<TM>, Int<TN>, Int<TileK<T>()>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      EpiTile, float, float, void, RowMajor, Align16B<TD>(), TD, RowMajor,
      Align16B<TD>(), EpiSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, LA, Align16B<T>(), T, LB, Align16B<T>(), float, Tile,
      Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class T>
constexpr bool kTf32 = std::is_same_v<T, float>;

// fwd with TM = kWideTileM: the cooperative schedule on 256x128 tiles, for reductions of one k tile (c <= 64).
// There the output store is the whole cost, and the ping-pong schedule's two consumer warpgroups take turns at
// their epilogues, while cooperative ones store at once: ResNet-50's res2 1x1 expand (64 -> 256, bf16) ran about a
// quarter faster so; layers with c >= 128 measured slower.
constexpr int kWideTileM = 256;
template <int TM>
using FwdEpiSchedule = std::conditional_t<TM == kWideTileM, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                          cutlass::epilogue::TmaWarpSpecialized>;
template <class T, int TN, int TM>
using FwdGemm = typename GemmCfg<
    T, TN, RowMajor, std::conditional_t<kTf32<T>, ColMajor, RowMajor>, T,
    std::conditional_t<TM == kWideTileM, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                       cutlass::gemm::KernelTmaWarpSpecializedPingpong>,
    FwdEpiSchedule<TM>, cutlass::epilogue::fusion::LinCombPerColBiasEltAct<RuntimeAct, T, float, T, T, float>, TM,
    FullWidthEpiTile<FwdEpiSchedule<TM>, TN>>::Gemm;
// dgrad's M tile for a Variant's TM: kWideTileM is the forward's only (so is never instantiated for dgrad).
template <int TM>
constexpr int kDgradTileM = TM == kWideTileM ? int(kTileM) : TM;
template <class T, int TN, int TM>
using DgradGemm = typename GemmCfg<T, TN, RowMajor, ColMajor, T, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                   cutlass::epilogue::TmaWarpSpecialized,
                                   cutlass::epilogue::fusion::LinearCombination<T, float, void, float>,
                                   kDgradTileM<TM>,
                                   FullWidthEpiTile<cutlass::epilogue::TmaWarpSpecialized, TN>>::Gemm;
template <class T, int TN>
using WgradGemm = typename GemmCfg<T, TN, ColMajor, RowMajor, float, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                   cutlass::epilogue::TmaWarpSpecializedCooperative,
                                   cutlass::epilogue::fusion::LinearCombination<float, float, void, float>>::Gemm;

// Arguments with the common fields; the strides are set by the callers (explicit int64 arithmetic: CUTLASS's
// make_cute_packed_stride multiplies ints).
template <class Gemm>
typename Gemm::Arguments BaseArgs(int64_t m, int64_t n, int64_t k, int64_t l) {
  typename Gemm::Arguments args{};
  args.mode = l > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = make_shape(int(m), int(n), int(k), int(l));
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = int(kPlanSms);  // persistent grid size: no device query, a pure plan
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.ptr_C = nullptr;
  return args;
}

// y (M x K) = act(x (M x C) @ w (C x K) + bias).
template <class T, int TN, int TM>
typename FwdGemm<T, TN, TM>::Arguments FwdArgs(const Dims& g, const void* x, const void* w, const void* bias,
                                               int64_t act, void* y) {
  auto args = BaseArgs<FwdGemm<T, TN, TM>>(g.m, g.k, g.c, 1);
  args.mainloop.ptr_A = static_cast<const T*>(x);
  get<0>(args.mainloop.dA) = g.c;  // A[m][kk] = x[m*C + kk]
  get<2>(args.mainloop.dA) = g.m * g.c;
  args.mainloop.ptr_B = static_cast<const T*>(w);
  if constexpr (kTf32<T>) {
    get<0>(args.mainloop.dB) = g.c;  // B[n][kk] = w^T[n*C + kk]
  } else {
    get<1>(args.mainloop.dB) = g.k;  // B[n][kk] = w[kk*K + n]
  }
  get<2>(args.mainloop.dB) = g.c * g.k;
  args.epilogue.ptr_D = static_cast<T*>(y);
  get<0>(args.epilogue.dD) = g.k;
  get<2>(args.epilogue.dD) = g.m * g.k;
  args.epilogue.dC = args.epilogue.dD;
  args.epilogue.thread.bias_ptr = static_cast<const T*>(bias);  // null: CUTLASS broadcasts 0
  args.epilogue.thread.activation.act = int(act);
  return args;
}

// dx (M x C) = dy (M x K) @ w^T.
template <class T, int TN, int TM>
typename DgradGemm<T, TN, TM>::Arguments DgradArgs(const Dims& g, const void* dy, const void* w, void* dx) {
  auto args = BaseArgs<DgradGemm<T, TN, TM>>(g.m, g.c, g.k, 1);
  args.mainloop.ptr_A = static_cast<const T*>(dy);
  get<0>(args.mainloop.dA) = g.k;  // A[m][kk] = dy[m*K + kk]
  get<2>(args.mainloop.dA) = g.m * g.k;
  args.mainloop.ptr_B = static_cast<const T*>(w);
  get<0>(args.mainloop.dB) = g.k;  // B[n=c][kk] = w[c*K + kk]
  get<2>(args.mainloop.dB) = g.c * g.k;
  args.epilogue.ptr_D = static_cast<T*>(dx);
  get<0>(args.epilogue.dD) = g.c;
  get<2>(args.epilogue.dD) = g.m * g.c;
  args.epilogue.dC = args.epilogue.dD;
  return args;
}

// `l` batches of `pixels` pixels from pixel `first` on: partial[b] (C x K) = x[rows of batch b]^T @ dy[same rows].
template <class T, int TN>
typename WgradGemm<T, TN>::Arguments WgradArgs(const Dims& g, const void* x, const void* dy, int64_t first,
                                           int64_t pixels, int64_t l, float* partial) {
  auto args = BaseArgs<WgradGemm<T, TN>>(g.c, g.k, pixels, l);
  args.mainloop.ptr_A = x == nullptr ? nullptr : static_cast<const T*>(x) + first * g.c;
  get<1>(args.mainloop.dA) = g.c;  // A[m=c][kk=pix][b] = x[(b*pixels + pix)*C + c]
  get<2>(args.mainloop.dA) = pixels * g.c;
  args.mainloop.ptr_B = dy == nullptr ? nullptr : static_cast<const T*>(dy) + first * g.k;
  get<1>(args.mainloop.dB) = g.k;  // B[n=k][kk=pix][b] = dy[(b*pixels + pix)*K + k]
  get<2>(args.mainloop.dB) = pixels * g.k;
  args.epilogue.ptr_D = partial;
  get<0>(args.epilogue.dD) = g.k;  // D[c][k][b] = partial[b*C*K + c*K + k]
  get<2>(args.epilogue.dD) = g.c * g.k;
  args.epilogue.dC = args.epilogue.dD;
  return args;
}

// TF32 wgrad (CUTLASS 2.x, sm80 mma.sync m16n8k8 on float operands rounded to TF32, 3-stage cp.async): the same
// batched problem as WgradArgs. Tiles TM x TN x 32 with 4 warps; TM = 64 for c <= 64 with k > 64 (WgradTileM), TN
// = 64 for k <= 64 (NarrowN), as the Hopper kernels' N.
template <int TM, int TN>
using WgradTf32Gemm = cutlass::gemm::device::GemmUniversal<
    float, ColMajor, float, RowMajor, float, RowMajor, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<TM, TN, 32>, cutlass::gemm::GemmShape<TM / 2, TN / 2, 32>,
    cutlass::gemm::GemmShape<16, 8, 8>, cutlass::epilogue::thread::LinearCombination<float, 4, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, 3, 4, 4>;

template <int TM, int TN>
typename WgradTf32Gemm<TM, TN>::Arguments WgradTf32Args(const Dims& g, const void* x, const void* dy, int64_t first,
                                                        int64_t pixels, int64_t l, float* partial) {
  return typename WgradTf32Gemm<TM, TN>::Arguments(
      l > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm,
      cutlass::gemm::GemmCoord(int(g.c), int(g.k), int(pixels)), int(l), {1.f, 0.f},
      x == nullptr ? nullptr : static_cast<const float*>(x) + first * g.c,  // A[c][pix] = x[pix*C + c]
      dy == nullptr ? nullptr : static_cast<const float*>(dy) + first * g.k,  // B[pix][k] = dy[pix*K + k]
      partial, partial, pixels * g.c, pixels * g.k, g.c * g.k, g.c * g.k, g.c, g.k, g.k, g.k);
}

template <class T>
int64_t WgradTileM(const Dims& g) {
  return kTf32<T> && g.c <= 64 && g.k > kNarrowTileN ? 64 : kTileM;
}

// wgrad's GEMM type and arguments for operand type T, N tile TN and M tile TM.
template <class T, int TN, int TM>
struct WgradKernel {
  using Gemm = WgradGemm<T, TN>;
  static typename Gemm::Arguments Args(const Dims& g, const void* x, const void* dy, int64_t first, int64_t pixels,
                                       int64_t l, float* partial) {
    return WgradArgs<T, TN>(g, x, dy, first, pixels, l, partial);
  }
};
template <int TN, int TM>
struct WgradKernel<float, TN, TM> {
  using Gemm = WgradTf32Gemm<TM, TN>;
  static typename Gemm::Arguments Args(const Dims& g, const void* x, const void* dy, int64_t first, int64_t pixels,
                                       int64_t l, float* partial) {
    return WgradTf32Args<TM, TN>(g, x, dy, first, pixels, l, partial);
  }
};

// Calls f(WgradKernel<T, TN, M tile>{}, plan) with the problem's M tile and split plan.
template <class T, int TN, class F>
auto WithWgradKernel(const Dims& g, F&& f) {
  const WgradPlan pl = PlanWgrad(g, TileK<T>(), WgradTileM<T>(g));
  if constexpr (kTf32<T> && TN == kTileN) {
    if (WgradTileM<T>(g) != kTileM) return f(WgradKernel<T, TN, 64>{}, pl);
  }
  return f(WgradKernel<T, TN, kTileM>{}, pl);
}

template <class Gemm>
bool CanImplement(const typename Gemm::Arguments& args) {
  return Gemm::can_implement(args) == cutlass::Status::kSuccess;
}

// can_implement was checked by the caller; `ws` holds at least Gemm::get_workspace_size(args) bytes.
template <class Gemm>
cudaError_t Launch(const typename Gemm::Arguments& args, void* ws, cudaStream_t s) {
  Gemm gemm;
  if (gemm.initialize(args, ws, s) != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? e : cudaErrorInvalidConfiguration;
  }
  const cutlass::Status st = gemm.run(s);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return st == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorLaunchFailure;
}

// The kernels' own workspace (the persistent scheduler needs none; kept general). Pointers play no part.
template <class T, int TN, int TM>
size_t KernelWorkspace(const Dims& g, Op op) {
  switch (op) {
    case Op::kFwd:
      return FwdGemm<T, TN, TM>::get_workspace_size(FwdArgs<T, TN, TM>(g, nullptr, nullptr, nullptr, 0, nullptr));
    case Op::kDgrad:
      return DgradGemm<T, TN, TM>::get_workspace_size(DgradArgs<T, TN, TM>(g, nullptr, nullptr, nullptr));
    default:
      return WithWgradKernel<T, TN>(g, [&](auto kern, const WgradPlan& pl) {
        using K = decltype(kern);
        size_t b = K::Gemm::get_workspace_size(K::Args(g, nullptr, nullptr, 0, pl.per, pl.splits, nullptr));
        if (pl.rem > 0) {
          b = std::max(b, K::Gemm::get_workspace_size(K::Args(g, nullptr, nullptr, 0, pl.rem, 1, nullptr)));
        }
        return b;
      });
  }
}

template <class T, int TN, int TM>
bool KernelsImplement(const Dims& g, Op op) {
  switch (op) {
    case Op::kFwd:
      return CanImplement<FwdGemm<T, TN, TM>>(FwdArgs<T, TN, TM>(g, nullptr, nullptr, nullptr, 0, nullptr));
    case Op::kDgrad: return CanImplement<DgradGemm<T, TN, TM>>(DgradArgs<T, TN, TM>(g, nullptr, nullptr, nullptr));
    default:
      return WithWgradKernel<T, TN>(g, [&](auto kern, const WgradPlan& pl) {
        using K = decltype(kern);
        return CanImplement<typename K::Gemm>(K::Args(g, nullptr, nullptr, 0, pl.per, pl.splits, nullptr)) &&
               (pl.rem == 0 || CanImplement<typename K::Gemm>(K::Args(g, nullptr, nullptr, 0, pl.rem, 1, nullptr)));
      });
  }
}

// Workspace: [wgrad f32 partial slices, 256-aligned][kernel workspace].
template <class T, int TN, int TM>
cudaError_t RunTyped(const ConvParams& p, Op op, DType in, DType out, const void* a, const void* b, const void* bias,
                     void* out_buf, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  const Dims g = DimsOf(p);
  const size_t partial = op == Op::kWgrad ? WgradPartialBytes(g, TileK<T>(), WgradTileM<T>(g)) : 0;
  const size_t need = partial + AlignUp(KernelWorkspace<T, TN, TM>(g, op));
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) return cudaErrorInvalidValue;
  char* kernel_ws = static_cast<char*>(workspace) + partial;
  switch (op) {
    case Op::kFwd: {
      const auto args = FwdArgs<T, TN, TM>(g, a, b, p.has_bias[0] ? bias : nullptr, p.activation[0], out_buf);
      if (!CanImplement<FwdGemm<T, TN, TM>>(args)) return cudaErrorNotSupported;
      return Launch<FwdGemm<T, TN, TM>>(args, kernel_ws, s);
    }
    case Op::kDgrad: {
      const auto args = DgradArgs<T, TN, TM>(g, a, b, out_buf);
      if (!CanImplement<DgradGemm<T, TN, TM>>(args)) return cudaErrorNotSupported;
      return Launch<DgradGemm<T, TN, TM>>(args, kernel_ws, s);
    }
    default:
      return WithWgradKernel<T, TN>(g, [&](auto kern, const WgradPlan& pl) {
        using K = decltype(kern);
        using Gemm = typename K::Gemm;
        float* slices = static_cast<float*>(workspace);
        const auto main_args = K::Args(g, a, b, 0, pl.per, pl.splits, slices);
        const auto tail_args =
            K::Args(g, a, b, pl.splits * pl.per, pl.rem > 0 ? pl.rem : 1, 1, slices + pl.splits * g.c * g.k);
        if (!CanImplement<Gemm>(main_args) || (pl.rem > 0 && !CanImplement<Gemm>(tail_args))) {
          return cudaErrorNotSupported;
        }
        cudaError_t e = Launch<Gemm>(main_args, kernel_ws, s);
        if (e == cudaSuccess && pl.rem > 0) e = Launch<Gemm>(tail_args, kernel_ws, s);
        if (e != cudaSuccess) return e;
        return ReduceSplits(in, out, slices, pl.slices(), g.c * g.k, out_buf, s);  // fixed order
      });
  }
}
// The kernels of one problem: operand type, N tile width and the fwd/dgrad M tile (the forward's kWideTileM:
// cooperative; kTallTileM: TallM), as types.
template <class T, int TN, int TM = kTileM>
struct Variant {
  static constexpr int kN = TN, kM = TM;
};

// Calls f(Variant<T, ...>{}) with the problem's tiles for operand type T (bf16, f16, float as TF32).
template <class T, class F>
auto WithVariant(const ConvParams& p, Op op, F&& f) {
  const Dims g = DimsOf(p);
  const bool narrow = NarrowN(g, op), wide_m = op == Op::kFwd && !narrow && g.c <= 64;
  if constexpr (!kTf32<T>) {  // TF32: not measured with the wide or tall tiles
    if (wide_m) return f(Variant<T, kTileN, kWideTileM>{});
    if (TallM(g, op)) return f(Variant<T, kTileN, kTallTileM>{});
  }
  return narrow ? f(Variant<T, kNarrowTileN>{}) : f(Variant<T, kTileN>{});
}

template <class T>
bool SupportsOf(const ConvParams& p, Op op) {
  return WithVariant<T>(p, op, [&](auto v) {
    return KernelsImplement<T, decltype(v)::kN, decltype(v)::kM>(DimsOf(p), op);
  });
}

template <class T>
size_t WorkspaceOf(const ConvParams& p, Op op) {
  return WithVariant<T>(p, op, [&](auto v) {
    const Dims g = DimsOf(p);
    const size_t partial = op == Op::kWgrad ? WgradPartialBytes(g, TileK<T>(), WgradTileM<T>(g)) : 0;
    return partial + AlignUp(KernelWorkspace<T, decltype(v)::kN, decltype(v)::kM>(g, op));
  });
}

template <class T>
cudaError_t RunOf(const ConvParams& p, Op op, DType in, DType out, const void* a, const void* b, const void* bias,
                  void* out_buf, void* workspace, size_t workspace_bytes, cudaStream_t s) {
  return WithVariant<T>(p, op, [&](auto v) {
    return RunTyped<T, decltype(v)::kN, decltype(v)::kM>(p, op, in, out, a, b, bias, out_buf, workspace,
                                                         workspace_bytes, s);
  });
}
}  // namespace

// Each operand type's kernels, defined in its own file by JAXCONV_GEMM1X1_DEFINE.
namespace gemm1x1 {
#define JAXCONV_GEMM1X1_DECLARE(NAME)                                                                                 \
  bool Supports##NAME(const ConvParams& p, Op op);                                                                \
  size_t Workspace##NAME(const ConvParams& p, Op op);                                                             \
  cudaError_t Run##NAME(const ConvParams& p, Op op, DType in, DType out, const void* a, const void* b,                  \
                        const void* bias, void* out_buf, void* workspace, size_t workspace_bytes, cudaStream_t s);
JAXCONV_GEMM1X1_DECLARE(BF16)
JAXCONV_GEMM1X1_DECLARE(F16)
JAXCONV_GEMM1X1_DECLARE(TF32)
#undef JAXCONV_GEMM1X1_DECLARE

#define JAXCONV_GEMM1X1_DEFINE(NAME, T)                                                                               \
  bool Supports##NAME(const ConvParams& p, Op op) { return SupportsOf<T>(p, op); }                                \
  size_t Workspace##NAME(const ConvParams& p, Op op) { return WorkspaceOf<T>(p, op); }                            \
  cudaError_t Run##NAME(const ConvParams& p, Op op, DType in, DType out, const void* a, const void* b,                  \
                        const void* bias, void* out_buf, void* workspace, size_t workspace_bytes,                     \
                        cudaStream_t s) {                                                                             \
    return RunOf<T>(p, op, in, out, a, b, bias, out_buf, workspace, workspace_bytes, s);                              \
  }
}  // namespace gemm1x1
#endif  // JAXCONV_GEMM1X1_KERNELS

}  // namespace cuda
}  // namespace jaxconv
