// Hopper implicit-GEMM convolutions (igemm.h), host side: checks, split plans, kernel arguments and the launch
// templates of each op; sm90_kernels.cuh has the kernel types. CUTLASS 3.x conv collectives (TMA im2col loads,
// wgmma, warp-specialised producer/consumer kernel), sm_90a only.
//
// Instantiations (one per op x math x tile width; f32 accumulation everywhere), rank 3 (ConvProblemShape<op, 3>) but
// for the large-window forward:
//   fprop  bf16, f16, tf32   tile 128x128x64 (tf32: x32; k <= 64, and tf32 with fewer tiles than SMs: 128x64;
//                            16-bit with k > 64 and fewer tiles than SMs: 64x128), out =
//                            operand type, fused y = act(acc + bias[k])                              (sm90_fprop.cu)
//   dgrad  bf16, f16         tile 128x128x64 (as fprop, with c), out = operand type, unit stride only (the sm90
//                            collective has no strided dgrad), no bias/act                           (sm90_dgrad.cu)
//   scatter fprop bf16, f16, tf32: tile 128x128x64 or 128x64 (x32 for tf32), y written through strided views by
//                            the consumer warpgroups' registers (ScatterStore): the phases of strided data gradients
//                            (phased_dgrad_sm90.cu), one launch each                               (sm90_scatter.cu)
//   wgrad  bf16, f16         tile 128x64x64 (k <= 64: 64x64x64; c % 128 == 0: 128x128x64, or 64x128x64 when the
//                            split plan estimates it faster, WgTileOf; M = K, N = C of one filter tap, K = N*Z*P*Q),
//                            f32 out, deterministic split-K over N*Z*P*Q: partial sums in the workspace, reduced
//                            in a fixed order                                                        (sm90_wgrad.cu)
//   tf32 fprop on small grids (GEMM N > 64, 128x128 tiles filling at most half the SMs; SplitPlanFwd): 128x128
//                            tiles split over the reduction the same way into f32 slices; the reduction applies
//                            bias and activation (ResNet-50 res5 3x3 at batch 32, and its TF32 data gradient,
//                            which runs as a forward)                                                (sm90_fprop.cu)
//   large-window tf32 fprop (rank 2: windows up to 255 positions per dim; the TF32 filter gradient with swapped
//                            roles, swapped_wgrad_sm90.cu): 128x128 or 128x64 (k <= 64) tiles, always split over the
//                            reduction (LargeWindowPlan); the reduction of the f32 slices writes y batch-inner
//                                                                                                    (sm90_dgrad.cu)
// tf32 dgrad/wgrad do not exist: wgmma reads tf32 operands K-major only, and those ops need an MN-major operand.
// CUTLASS's sm90 conv kernel is non-persistent and takes no tile scheduler (no stream-K, no persistent or ping-pong
// schedules), so these kernels run two variants of its body with the unchanged CUTLASS collectives: fprop/dgrad
// persistent with two consumer warpgroups in ping-pong (PingpongConvKernel: one warpgroup's MMAs overlap the
// other's epilogue; it beat a one-consumer persistent kernel on 6 of 7 ResNet-50 layers at batch 128), and for the
// split forwards (small-grid and large-window tf32) over (tile, k range) units into f32 slices (faster than
// SplitKKernel on the swapped TF32 filter gradient of ResNet-50 res5 3x3); wgrad with a k-tile range per blockIdx.z
// (SplitKKernel). Cluster 1x1x1 throughout.
//
// Built only when the build's arch list has 90a (CMake defines JAXCONV_IGEMM_SM90=1 for the *sm90* files);
// otherwise this header declares nothing and sm90.cu's entry points report "not supported".
#pragma once

#include "kernels/implicit_gemm/sm90_kernels.cuh"

namespace jaxconv {
namespace cuda {

#if JAXCONV_SM90_KERNELS
namespace {

using namespace cute;
using cutlass::conv::Operator;

// ---------------------------------------------------------------------------------------------------------------
// Host side: checks and plans (pure), argument construction.

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bounds every plan needs: extents >= 1, the output extent as CUTLASS (and lax) computes it, the TMA im2col limits of
// rank 2 (CUTLASS's can_implement checks the box corners and window offsets of the rank it runs), and bounds that keep
// CUTLASS's int arithmetic (ConvProblemShape holds int extents) from overflowing before can_implement runs.
bool ExtentChecks(const IgemmProblem& pr, int64_t align) {
  if (pr.n < 1 || pr.c < 1 || pr.k < 1) return false;
  if (pr.c % align != 0 || pr.k % align != 0) return false;  // 16-byte rows for TMA
  constexpr int64_t kBig = int64_t(1) << 30;
  if (pr.n > kBig || pr.c > kBig || pr.k > kBig) return false;
  for (int i = 0; i < 3; ++i) {
    if (pr.in[i] < 1 || pr.win[i] < 1 || pr.out[i] < 1 || pr.in[i] > kBig || pr.out[i] > kBig) return false;
    if (pr.stride[i] < 1 || pr.dil[i] < 1) return false;
    if (pr.stride[i] > 8) return false;  // TMA im2col traversal stride (elementStrides) is 1..8
    if (pr.pad_lo[i] < 0 || pr.pad_hi[i] < 0 || pr.pad_lo[i] > 256 || pr.pad_hi[i] > 256) return false;
    if (pr.win[i] > 256 || pr.dil[i] > 255 || (pr.win[i] - 1) * pr.dil[i] >= 255) return false;
    const int64_t span = pr.in[i] + pr.pad_lo[i] + pr.pad_hi[i] - (pr.win[i] - 1) * pr.dil[i] - 1;
    if (span < 0 || span / pr.stride[i] + 1 != pr.out[i]) return false;
  }
  // Linearised GEMM extents are int32 in the kernels (im2col coordinates, FastDivmod).
  const int64_t in_px = pr.in[0] * pr.in[1] * pr.in[2], out_px = pr.out[0] * pr.out[1] * pr.out[2];
  if (in_px > INT32_MAX || out_px > INT32_MAX) return false;
  if (pr.n * in_px > INT32_MAX || pr.n * out_px > INT32_MAX) return false;
  // Tensor sizes: TMA strides < 2^40 bytes, 64-bit offsets everywhere; a generous cap (2^36 elements).
  constexpr int64_t kMaxElems = int64_t(1) << 36;
  const int64_t taps = pr.win[0] * pr.win[1] * pr.win[2];
  if (pr.c > kMaxElems / (pr.n * in_px) || pr.k > kMaxElems / (pr.n * out_px)) return false;
  return pr.c * taps <= INT32_MAX && pr.k * pr.c * taps <= kMaxElems;
}

// ExtentChecks plus what the rank-3 kernels (every op's) need.
[[maybe_unused]] bool BasicChecks(const IgemmProblem& pr, Op op, IgemmMath math) {
  if (math == IgemmMath::k3xTF32) return false;             // igemm_sm80.cu
  if (math == IgemmMath::kTF32 && op != Op::kFwd) return false;  // tf32 wgmma is K-major only
  if (!ExtentChecks(pr, math == IgemmMath::kTF32 ? 4 : 8)) return false;
  for (int i = 0; i < 3; ++i) {
    if (op == Op::kDgrad && pr.stride[i] != 1) return false;  // no strided dgrad on sm90
    // TMA im2col, 3-D: padding <= 16, filter offset (win-1)*dil < 31 (can_implement checks both again).
    if (pr.pad_lo[i] > 16 || pr.pad_hi[i] > 16 || (pr.win[i] - 1) * pr.dil[i] >= 31) return false;
  }
  // wgrad's grid has the N tiles in y (at most 65535); fprop/dgrad use a 1-D persistent grid.
  const int64_t taps = pr.win[0] * pr.win[1] * pr.win[2];
  return op != Op::kWgrad || CeilDiv(pr.c, WgTileOf(pr).n) * taps <= kMaxGridY;
}

// The large-window TF32 forward runs rank 2: the depth dim must be trivial.
[[maybe_unused]] bool LargeWindowChecks(const IgemmProblem& pr) {
  return ExtentChecks(pr, 4) && pr.in[0] == 1 && pr.win[0] == 1 && pr.out[0] == 1 && pr.pad_lo[0] == 0 &&
         pr.pad_hi[0] == 0 && pr.stride[0] == 1 && pr.dil[0] == 1;
}

// Split-K plan: `splits` ranges of k_tiles_per_split k tiles each (the last may be shorter, none empty).
struct SplitPlan {
  int64_t splits = 1, k_tiles_per_split = 1;
};

// The split of a reduction of k_tiles over tiles_mn output tiles that minimises an estimated time in units of one k
// tile's MMA work on one SM: waves(s) * (k tiles per split + per-CTA overhead) + partial-sum traffic and the
// reduction launch, for s in [1, min(kMaxSplits, k_tiles)]; the partial sums (s * out_elems f32) stay within
// kMaxSplitWorkspace.
// work: one k tile's MMA work relative to the 128-row tiles' (64-row tiles: 0.5); cost: the estimate, if wanted.
SplitPlan PlanSplits(int64_t k_tiles, int64_t tiles_mn, int64_t out_elems, double work = 1.0,
                     double* cost = nullptr) {
  constexpr double kCtaOverhead = 4.0;      // prologue fill + epilogue, in k tiles
  constexpr double kPerPartialElem = 1e-5;  // write + read one f32 partial, in k tiles (spread over the GPU)
  constexpr double kReduceLaunch = 10.0;    // the extra kernel
  SplitPlan best;
  best.k_tiles_per_split = k_tiles;
  double best_cost = double(CeilDiv(tiles_mn, kPlanSms)) * (double(k_tiles) + kCtaOverhead) * work;
  const int64_t max_s = std::min<int64_t>(kMaxSplits, k_tiles);
  for (int64_t s = 2; s <= max_s; ++s) {
    const int64_t per = CeilDiv(k_tiles, s);
    const int64_t splits = CeilDiv(k_tiles, per);
    if (splits != s) continue;  // the same plan as a smaller s
    if (splits * out_elems * int64_t(sizeof(float)) > kMaxSplitWorkspace) break;
    const double c = double(CeilDiv(tiles_mn * splits, kPlanSms)) * (double(per) + kCtaOverhead) * work +
                     double(splits) * double(out_elems) * kPerPartialElem + kReduceLaunch;
    if (c < best_cost) {
      best_cost = c;
      best.splits = splits;
      best.k_tiles_per_split = per;
    }
  }
  if (cost != nullptr) *cost = best_cost;
  return best;
}

// The wgrad split plan with tile t (and its estimated cost, if wanted). The reduction is N*Z*P*Q pixels in kWgTileK
// blocks; 64x128 tiles weigh half a 128-row tile's MMA work per k tile (the 64x64 ones, older, keep weight 1).
[[maybe_unused]] SplitPlan WgradPlanFor(const IgemmProblem& pr, const WgTile& t, double* cost = nullptr) {
  const int64_t taps = pr.win[0] * pr.win[1] * pr.win[2];
  const int64_t k_tiles = CeilDiv(pr.n * pr.out[0] * pr.out[1] * pr.out[2], kWgTileK);
  const int64_t tiles_mn = CeilDiv(pr.k, t.m) * CeilDiv(pr.c, t.n) * taps;
  const double work = t.m == kTallTileM && t.n == kWgWideTileN ? 0.5 : 1.0;
  return PlanSplits(k_tiles, tiles_mn, pr.k * taps * pr.c, work, cost);
}

// wgrad's tile (M = K rows, N = C columns of one tap). k <= 64: 64x64. c % 128 == 0: 128-wide N tiles; a 64-wide
// one's wgmma (m64n64k16, both operands from shared memory) reads 4 KB per 32 tensor-core cycles, all the 128 B/clk
// an SM's shared memory delivers, 128 wide reads 6 KB per 64 cycles. Of those, 64x128 (kTallTileM rows) when its
// split plan is estimated faster than 128x128's: half the MMA work per tile, twice the tiles (ResNet-50 res5 3x3
// at batch 32: 144 128x128 tiles take two waves of 132 SMs, 288 64x128 ones three half-length waves). Else 128x64.
[[maybe_unused]] WgTile WgTileOf(const IgemmProblem& pr) {
  if (pr.k <= kWgNarrowTileM) return {kWgNarrowTileM, kWgTileN};
  if (pr.c % kWgWideTileN != 0) return {kWgTileM, kWgTileN};
  const WgTile wide{kWgTileM, kWgWideTileN}, tall{kTallTileM, kWgWideTileN};
  double wide_cost = 0, tall_cost = 0;
  WgradPlanFor(pr, wide, &wide_cost);
  WgradPlanFor(pr, tall, &tall_cost);
  return tall_cost < wide_cost ? tall : wide;
}

[[maybe_unused]] SplitPlan WgradPlan(const IgemmProblem& pr) { return WgradPlanFor(pr, WgTileOf(pr)); }

[[maybe_unused]] size_t WgradWorkspace(const IgemmProblem& pr) {
  const SplitPlan plan = WgradPlan(pr);
  if (plan.splits <= 1) return 0;
  const int64_t dw_elems = pr.k * pr.win[0] * pr.win[1] * pr.win[2] * pr.c;
  return static_cast<size_t>(plan.splits * dw_elems) * sizeof(float);
}

// The TF32 forward split over the reduction: when the GEMM N (k) is over 64 and the 128x128 tiles fill at most half
// the SMs, the reduction is cut into `splits` ranges so that tiles * splits still fits one wave; at least
// kMinSplitKTiles k tiles per split. On ResNet-50 res5 3x3 at batch 32 (52 tiles of 144 TF32 k tiles; unsplit, 104
// half-width tiles with each block's second consumer warpgroup idle) the split made the TF32 forward and the TF32 data
// gradient (the flipped forward) about a tenth faster and the 16-bit ones slightly slower, so 16-bit problems keep
// the unsplit plan.
constexpr int64_t kMinSplitKTiles = 8;

// The TF32 fprop's k tiles: every window tap times the input channels in FwdTileK<float> blocks.
int64_t Tf32FwdKTiles(const IgemmProblem& pr) {
  return pr.win[0] * pr.win[1] * pr.win[2] * CeilDiv(pr.c, FwdTileK<float>::value);
}

SplitPlan SplitPlanFwd(const IgemmProblem& pr, IgemmMath math) {
  SplitPlan plan;
  if (math != IgemmMath::kTF32) return plan;
  const int64_t pixels = pr.out[0] * pr.out[1] * pr.out[2];
  const int64_t k_tiles = Tf32FwdKTiles(pr);
  plan.k_tiles_per_split = k_tiles;
  if (pr.k <= kNarrowTileN) return plan;
  const int64_t tiles = CeilDiv(pr.n * pixels, kFwdTileM) * CeilDiv(pr.k, kFwdTileN);
  const int64_t s = std::min(kPlanSms / tiles, k_tiles / kMinSplitKTiles);
  if (s < 2) return plan;
  const int64_t per = CeilDiv(k_tiles, s), splits = CeilDiv(k_tiles, per);
  if (splits < 2 || splits * pr.n * pixels * pr.k * int64_t(sizeof(float)) > kMaxSplitWorkspace) return plan;
  plan.splits = splits;
  plan.k_tiles_per_split = per;
  return plan;
}

// Bytes of a split plan's f32 partial sums: one output-sized slice per split.
size_t SplitBytes(const IgemmProblem& pr, const SplitPlan& plan) {
  return static_cast<size_t>(plan.splits * pr.n * pr.out[0] * pr.out[1] * pr.out[2] * pr.k) * sizeof(float);
}

[[maybe_unused]] size_t SplitFwdWorkspace(const IgemmProblem& pr, IgemmMath math) {
  const SplitPlan plan = SplitPlanFwd(pr, math);
  return plan.splits <= 1 ? 0 : SplitBytes(pr, plan);
}

// The large-window TF32 forward: few output tiles over a long reduction (the filter gradient's swapped roles,
// implicit_gemm.cu), always through the split kernel and the slices (also with one split), 128 x 64 tiles when k is
// at most 64.
int64_t LargeWindowTileN(const IgemmProblem& pr) { return pr.k <= kNarrowTileN ? kNarrowTileN : kFwdTileN; }

[[maybe_unused]] SplitPlan LargeWindowPlan(const IgemmProblem& pr) {
  const int64_t pixels = pr.out[0] * pr.out[1] * pr.out[2];
  const int64_t tiles = CeilDiv(pr.n * pixels, kFwdTileM) * CeilDiv(pr.k, LargeWindowTileN(pr));
  return PlanSplits(Tf32FwdKTiles(pr), tiles, pr.n * pixels * pr.k);
}

template <Operator Op, int Rank = 3>
cutlass::conv::ConvProblemShape<Op, Rank> MakeProblemShape(const IgemmProblem& pr) {
  using PS = cutlass::conv::ConvProblemShape<Op, Rank>;
  constexpr int d0 = 3 - Rank;  // rank 2 drops the depth dim (trivial: LargeWindowChecks)
  typename PS::TensorExtent act{}, flt{};
  typename PS::ShapePadding lo{}, hi{};
  typename PS::TraversalStride st{};
  typename PS::ShapeDilation dl{};
  act[0] = int(pr.n);
  flt[0] = int(pr.k);
  act[Rank + 1] = flt[Rank + 1] = int(pr.c);
  for (int i = 0; i < Rank; ++i) {
    act[1 + i] = int(pr.in[d0 + i]);
    flt[1 + i] = int(pr.win[d0 + i]);
    lo[i] = int(pr.pad_lo[d0 + i]);
    hi[i] = int(pr.pad_hi[d0 + i]);
    st[i] = int(pr.stride[d0 + i]);
    dl[i] = int(pr.dil[d0 + i]);
  }
  return PS(cutlass::conv::Mode::kCrossCorrelation, act, PS::packed_stride_right_major(act), flt,
            PS::packed_stride_right_major(flt), lo, hi, st, dl, /*groups=*/1);
}

// Self-check: the (N,Z,P,Q,K) shape CUTLASS derived is the caller's output (fprop C, dgrad/wgrad A).
template <Operator Op, int Rank>
bool ShapeMatches(const cutlass::conv::ConvProblemShape<Op, Rank>& ps, const IgemmProblem& pr) {
  const auto& y = Op == Operator::kFprop ? ps.shape_C : ps.shape_A;
  if (y[0] != pr.n || y[Rank + 1] != pr.k) return false;
  for (int i = 0; i < Rank; ++i) {
    if (y[1 + i] != pr.out[3 - Rank + i]) return false;
  }
  return true;
}

// Kernel arguments; pointers may be null (Supports builds them for can_implement only).
template <class Cfg>
typename Cfg::Kernel::Arguments MakeArguments(const IgemmProblem& pr, const IgemmArgs& a, void* d_ptr) {
  using Kernel = typename Cfg::Kernel;
  using T = typename Cfg::Element;
  using Args = typename Kernel::Arguments;
  const auto ps = MakeProblemShape<Cfg::kOp, Cfg::kRank>(pr);
  Args args{};
  args.problem_shape = ps;
  args.hw_info.device_id = 0;  // unused by the non-persistent kernel (no SM-count dependent plan)
  args.hw_info.sm_count = int(kPlanSms);
  if constexpr (Cfg::kOp == Operator::kWgrad) {
    // CUTLASS wgrad: A = dy (NZPQK), B = x (NDHWC); ours: a = x, b = dy.
    args.mainloop.ptr_A = static_cast<const T*>(a.b);
    args.mainloop.ptr_B = static_cast<const T*>(a.a);
    const int64_t taps_c = pr.win[0] * pr.win[1] * pr.win[2] * pr.c;
    WgradStrideD d{};
    get<0>(d) = taps_c;                              // K
    get<1, 1>(d) = pr.c;                             // S
    get<1, 2>(d) = pr.win[2] * pr.c;                 // R
    get<1, 3>(d) = pr.win[1] * pr.win[2] * pr.c;     // T
    get<2>(d) = pr.k * taps_c;                       // split slice
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = d;
    args.epilogue.ptr_D = static_cast<float*>(d_ptr);
    args.epilogue.dD = d;
  } else {
    args.mainloop.ptr_A = static_cast<const T*>(a.a);  // fprop x, dgrad dy
    args.mainloop.ptr_B = static_cast<const T*>(a.b);  // w
    // D: fprop y (N,Z,P,Q,K), dgrad dx (N,D,H,W,C), packed; modes ((q,p,z,n), k, l) (rank 2: ((q,p,n), k, l)).
    // Keep them packed: the split's register epilogue tiles the hierarchical M mode by 128 rows, and with permuted
    // strides (dw's layout written directly, tried for the large-window forward) it wrote out of bounds (H200).
    const int64_t* sp = Cfg::kOp == Operator::kFprop ? pr.out : pr.in;
    const int64_t ch = Cfg::kOp == Operator::kFprop ? pr.k : pr.c;
    typename Kernel::StrideD d{};
    get<0, 0>(d) = ch;
    get<0, 1>(d) = sp[2] * ch;
    if constexpr (Cfg::kRank == 3) {
      get<0, 2>(d) = sp[1] * sp[2] * ch;
      get<0, 3>(d) = sp[0] * sp[1] * sp[2] * ch;
    } else {
      get<0, 2>(d) = sp[1] * sp[2] * ch;  // n (sp[0] == 1)
    }
    if constexpr (Cfg::kSplit) get<2>(d) = pr.n * sp[0] * sp[1] * sp[2] * ch;  // SplitCfg: one f32 slice a split
    args.epilogue.dC = d;
    args.epilogue.dD = d;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.ptr_D = static_cast<cute::conditional_t<Cfg::kSplit, float, T>*>(d_ptr);
    auto& f = args.epilogue.thread;
    f.alpha = 1.f;
    f.beta = 0.f;
    if constexpr (Cfg::kOp == Operator::kFprop && !Cfg::kSplit) {
      f.bias_ptr = static_cast<const T*>(a.bias);  // null: CUTLASS broadcasts 0
      f.activation.act = int(a.act);
    }
  }
  return args;
}

template <class Cfg>
bool CanImplement(const IgemmProblem& pr) {
  const auto args = MakeArguments<Cfg>(pr, IgemmArgs{}, nullptr);
  if (!ShapeMatches(args.problem_shape, pr)) return false;
  return Cfg::Kernel::can_implement(args);
}

// pdl: launched as a programmatic dependent of the previous kernel in the stream (it may start before that one ends).
template <class K>
cudaError_t LaunchKernel(const typename K::Params& params, dim3 grid, cudaStream_t stream, bool pdl = false) {
  constexpr int smem = K::SharedStorageSize;
  static_assert(smem <= 227 * 1024, "more shared memory than an sm_90 block can have");
  auto* fn = &cutlass::device_kernel<K>;
  if constexpr (smem >= (48 << 10)) {
    // The opt-in is per device; remember where it was done (devices 0..63; others set it every call).
    static std::atomic<uint64_t> done{0};
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
    if (bit == 0 || (done.load(std::memory_order_relaxed) & bit) == 0) {
      e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
      done.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  if (pdl) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(K::MaxThreadsPerBlock, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, fn, params);
  }
  fn<<<grid, K::MaxThreadsPerBlock, smem, stream>>>(params);
  return cudaGetLastError();
}

// The unsplit fprop/dgrad tile (SplitPlanFwd first). GEMM N (fprop k, dgrad c) at most 64: 128 x kNarrowTileN. Fewer
// 128x128 tiles than an H100 has SMs: tiles of half the size put about twice as many SMs to work, 64x128 (kTallTileM)
// for 16-bit operands, 128 x kNarrowTileN for TF32 (no tall instantiation). Else 128x128. kPlanSms, not the
// device's count: Supports must not query the device.
enum class FwdTile { kWide, kNarrow, kTall };
[[maybe_unused]] FwdTile FwdTileOf(const IgemmProblem& pr, Op op, IgemmMath math) {
  const int64_t n = op == Op::kFwd ? pr.k : pr.c;
  if (n <= kNarrowTileN) return FwdTile::kNarrow;
  const int64_t pixels = op == Op::kFwd ? pr.out[0] * pr.out[1] * pr.out[2] : pr.in[0] * pr.in[1] * pr.in[2];
  if (CeilDiv(pr.n * pixels, kFwdTileM) * CeilDiv(n, kFwdTileN) >= kPlanSms) return FwdTile::kWide;
  return math == IgemmMath::kTF32 ? FwdTile::kNarrow : FwdTile::kTall;
}

// SplitCfg (forward) with `plan`: the split kernel into f32 slices in the workspace, then ReduceSplitsEpilogue into y
// (batch_inner: ReduceSplitsEpilogue's).
template <class Cfg>
cudaError_t RunSplitFwd(const IgemmProblem& pr, const IgemmArgs& a, const SplitPlan& plan, bool batch_inner,
                        cudaStream_t stream) {
  static_assert(Cfg::kOp == Operator::kFprop && Cfg::kSplit, "the split forward");
  using Base = typename Cfg::Kernel;
  using Pingpong = PingpongConvKernel<Base, /*Split=*/true>;
  if (plan.splits < 1) return cudaErrorNotSupported;
  if (a.workspace == nullptr || !Aligned16(a.workspace) || a.workspace_bytes < SplitBytes(pr, plan)) {
    return cudaErrorInvalidValue;
  }
  const auto args = MakeArguments<Cfg>(pr, a, a.workspace);
  if (!ShapeMatches(args.problem_shape, pr) || !Base::can_implement(args)) return cudaErrorNotSupported;
  typename Pingpong::Params params;
  params.base = Base::to_underlying_arguments(args, nullptr);
  params.k_tiles_per_split = int(plan.k_tiles_per_split);
  params.splits = int(plan.splits);
  const dim3 grid = Base::get_grid_shape(params.base);  // (m tiles, n tiles, 1)
  const int64_t pixels = pr.out[0] * pr.out[1] * pr.out[2];
  constexpr int64_t tile_n = cute::size<1>(typename Cfg::TileShape{});
  if (int64_t(grid.x) != CeilDiv(pr.n * pixels, kFwdTileM) || int64_t(grid.y) != CeilDiv(pr.k, tile_n) ||
      grid.z != 1) {
    return cudaErrorNotSupported;  // the plan's tile count
  }
  params.tiles_m = int(grid.x);
  params.tiles_n = int(grid.y);
  // Persistent, one block per SM: each block's two consumer warpgroups walk its (tile, split) units.
  const int64_t units = int64_t(grid.x) * grid.y * plan.splits;
  if (units > INT32_MAX) return cudaErrorNotSupported;
  const int64_t blocks = std::min<int64_t>(units, MultiprocessorCount());
  if (const cudaError_t e = LaunchKernel<Pingpong>(params, dim3(unsigned(blocks), 1, 1), stream); e != cudaSuccess) {
    return e;
  }
  using T = typename Cfg::Element;
  const int64_t count4 = pr.n * pixels * pr.k / 4;  // k % 4 == 0 (ExtentChecks)
  const int threads = 256;
  const int64_t reduce_blocks = std::min<int64_t>(CeilDiv(count4, threads), 16 * kPlanSms);
  ReduceSplitsEpilogue<T><<<unsigned(reduce_blocks), threads, 0, stream>>>(
      static_cast<const float4*>(a.workspace), plan.splits, count4, pr.k, static_cast<const T*>(a.bias), int(a.act),
      batch_inner ? pr.n : 0, static_cast<cutlass::AlignedArray<T, 4>*>(a.out));
  return cudaGetLastError();
}

template <class Cfg>
cudaError_t RunFwdOrDgrad(const IgemmProblem& pr, const IgemmArgs& a, IgemmMath math, cudaStream_t stream) {
  using Kernel = typename Cfg::Kernel;
  constexpr bool kFwd = Cfg::kOp == Operator::kFprop;  // dgrad ignores bias and act (igemm.h)
  if (!Aligned16(a.a) || !Aligned16(a.b) || !Aligned16(a.out)) return cudaErrorInvalidValue;
  if (kFwd && (!Aligned16(a.bias) || a.act < kActNone || a.act > kActSilu)) return cudaErrorInvalidValue;
  if constexpr (Cfg::kSplit) {
    const SplitPlan plan = SplitPlanFwd(pr, math);
    if (plan.splits <= 1) return cudaErrorNotSupported;
    return RunSplitFwd<Cfg>(pr, a, plan, false, stream);
  } else {
    const auto args = MakeArguments<Cfg>(pr, a, a.out);
    if (!ShapeMatches(args.problem_shape, pr) || !Kernel::can_implement(args)) return cudaErrorNotSupported;
    using Pingpong = PingpongConvKernel<Kernel>;
    typename Pingpong::Params params;
    // Encodes the TMA descriptors on the host (driver entry point via the runtime; no workspace).
    params.base = Kernel::to_underlying_arguments(args, nullptr);
    const dim3 tiles = Kernel::get_grid_shape(params.base);  // (m tiles, n tiles, 1)
    if (tiles.z != 1 || int64_t(tiles.x) * tiles.y > INT32_MAX) return cudaErrorNotSupported;
    params.tiles_m = int(tiles.x);
    params.tiles_n = int(tiles.y);
    // One block per SM: each block's two consumer warpgroups walk its tiles.
    const int64_t blocks = std::min<int64_t>(int64_t(tiles.x) * tiles.y, MultiprocessorCount());
    return LaunchKernel<Pingpong>(params, dim3(unsigned(blocks), 1, 1), stream);
  }
}

// The forwards through strided views (IgemmSm90ScatterFwdRun): Cfg's kernel type (SplitCfg: the fprop mainloop and a
// register epilogue, which the scatter kernel replaces with ScatterStore), unsplit, persistent, ping-pong; one launch
// per phase, the later ones overlapping the earlier ones' tails. One launch for all phases was tried: its per-unit
// phase lookup spilled registers in the 40-register producer warp and slowed every ping-pong kernel by up to a
// quarter.
template <class Cfg>
cudaError_t RunScatterFwd(const IgemmScatterPhase* phases, int count, const int64_t out_stride[4],
                          cudaStream_t stream) {
  static_assert(Cfg::kOp == Operator::kFprop && Cfg::kSplit && Cfg::kRank == 3, "SplitCfg of a rank-3 forward");
  using Base = typename Cfg::Kernel;
  using T = typename Cfg::Element;
  using K = PingpongConvKernel<Base, /*Split=*/false, T>;
  if (count < 1 || count > kMaxScatterPhases) return cudaErrorNotSupported;
  for (int i = 0; i < 4; ++i) {  // pairs of T per store: out and every stride even (in elements); k is (ExtentChecks)
    if (out_stride[i] < 0 || out_stride[i] % 2 != 0) return cudaErrorInvalidValue;
  }
  constexpr int64_t tile_m = cute::size<0>(typename Cfg::TileShape{});
  constexpr int64_t tile_n = cute::size<1>(typename Cfg::TileShape{});
  typename K::Params params[kMaxScatterPhases];
  for (int ph = 0; ph < count; ++ph) {  // every phase's checks before the first launch
    const IgemmScatterPhase& f = phases[ph];
    const IgemmProblem& pr = f.pr;
    if (!Aligned16(f.a) || !Aligned16(f.b) || f.out == nullptr ||
        reinterpret_cast<uintptr_t>(f.out) % (2 * sizeof(T)) != 0) {
      return cudaErrorInvalidValue;
    }
    IgemmArgs a;
    a.a = f.a;
    a.b = f.b;
    const auto args = MakeArguments<Cfg>(pr, a, nullptr);
    if (!ShapeMatches(args.problem_shape, pr) || !Base::can_implement(args)) return cudaErrorNotSupported;
    params[ph].base = Base::to_underlying_arguments(args, nullptr);
    const dim3 tiles = Base::get_grid_shape(params[ph].base);  // (m tiles, n tiles, 1)
    const int64_t rows = pr.n * pr.out[0] * pr.out[1] * pr.out[2];
    // ScatterStore's rows are tile index * tile_m: the grid must be the plain tiling of (rows, k).
    if (int64_t(tiles.x) != CeilDiv(rows, tile_m) || int64_t(tiles.y) != CeilDiv(pr.k, tile_n) || tiles.z != 1 ||
        int64_t(tiles.x) * tiles.y > INT32_MAX) {
      return cudaErrorNotSupported;
    }
    params[ph].tiles_m = int(tiles.x);
    params[ph].tiles_n = int(tiles.y);
    ScatterOut& o = params[ph].scatter;
    o.ptr = f.out;
    for (int i = 0; i < 4; ++i) o.stride[i] = out_stride[i];
    o.q = cutlass::FastDivmod(int(pr.out[2]));
    o.p = cutlass::FastDivmod(int(pr.out[1]));
    o.z = cutlass::FastDivmod(int(pr.out[0]));
    o.rows = int(rows);  // < 2^31 (ExtentChecks)
    o.cols = int(pr.k);
  }
  // Phases after the first launch as programmatic dependents: their blocks take the SMs that the previous phase's
  // tail frees (the kernel's griddepcontrol comments say why that is safe).
  for (int ph = 0; ph < count; ++ph) {
    const int64_t blocks = std::min<int64_t>(int64_t(params[ph].tiles_m) * params[ph].tiles_n, MultiprocessorCount());
    if (const cudaError_t e = LaunchKernel<K>(params[ph], dim3(unsigned(blocks), 1, 1), stream, /*pdl=*/ph > 0);
        e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

template <class Cfg>
cudaError_t RunWgrad(const IgemmProblem& pr, const IgemmArgs& a, cudaStream_t stream) {
  using Base = typename Cfg::Kernel;
  using Split = SplitKKernel<Base>;
  if (!Aligned16(a.a) || !Aligned16(a.b) || !Aligned16(a.out)) return cudaErrorInvalidValue;
  const SplitPlan plan = WgradPlan(pr);
  const int64_t dw_elems = pr.k * pr.win[0] * pr.win[1] * pr.win[2] * pr.c;
  float* dst = static_cast<float*>(a.out);
  if (plan.splits > 1) {
    if (a.workspace == nullptr || a.workspace_bytes < WgradWorkspace(pr)) return cudaErrorInvalidValue;
    if (!Aligned16(a.workspace)) return cudaErrorInvalidValue;
    dst = static_cast<float*>(a.workspace);
  }
  const auto args = MakeArguments<Cfg>(pr, a, dst);
  if (!ShapeMatches(args.problem_shape, pr) || !Base::can_implement(args)) return cudaErrorNotSupported;
  typename Split::Params params;
  params.base = Base::to_underlying_arguments(args, nullptr);
  params.k_tiles_per_split = int(plan.k_tiles_per_split);
  params.splits = int(plan.splits);
  dim3 grid = Base::get_grid_shape(params.base);
  // Self-check against the plan's tile counts (the split ranges assume them).
  const int64_t taps = pr.win[0] * pr.win[1] * pr.win[2];
  const WgTile tile = WgTileOf(pr);
  if (int64_t(grid.x) != CeilDiv(pr.k, tile.m) || int64_t(grid.y) != CeilDiv(pr.c, tile.n) * taps ||
      grid.z != 1) {
    return cudaErrorNotSupported;
  }
  grid.z = unsigned(plan.splits);
  cudaError_t e = LaunchKernel<Split>(params, grid, stream);
  if (e != cudaSuccess || plan.splits <= 1) return e;
  const int64_t count4 = dw_elems / 4;  // c % 8 == 0
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(CeilDiv(count4, threads), 16 * kPlanSms);
  ReduceWgradSplits<<<unsigned(blocks), threads, 0, stream>>>(static_cast<const float4*>(a.workspace), plan.splits,
                                                               count4, static_cast<float4*>(a.out));
  return cudaGetLastError();
}

// Calls f(WgradCfg<T, tile M, tile N>{}) with the problem's wgrad tile (WgTileOf).
template <class T, class F>
auto WithWgradCfg(const IgemmProblem& pr, F&& f) {
  const WgTile t = WgTileOf(pr);
  if (t.n == kWgWideTileN) {
    if (t.m == kTallTileM) return f(WgradCfg<T, kTallTileM, kWgWideTileN>{});
    return f(WgradCfg<T, kWgTileM, kWgWideTileN>{});
  }
  if (t.m == kWgNarrowTileM) return f(WgradCfg<T, kWgNarrowTileM>{});
  return f(WgradCfg<T>{});
}

// FpropCfg and DgradCfg by (T, tile N, tile M).
template <class T, int TileN, int TileM>
using FpropTiles = FpropCfg<T, TileN, 3, TileM>;
template <class T, int TileN, int TileM>
using DgradTiles = DgradCfg<T, TileN, TileM>;

// Calls f(Cfg<T, tile N, tile M>{}) (FpropTiles or DgradTiles) with the problem's tiles: SplitCfg on 128x128 tiles
// when SplitPlanFwd splits (the TF32 forward, so instantiated for FpropCfg<float> only), else FwdTileOf's.
template <template <class, int, int> class Cfg, class T, class F>
auto WithFwdCfg(const IgemmProblem& pr, Op op, IgemmMath math, F&& f) {
  using Wide = Cfg<T, kFwdTileN, kFwdTileM>;
  if constexpr (cute::is_same_v<T, float> && Wide::kOp == Operator::kFprop) {
    if (SplitPlanFwd(pr, math).splits > 1) return f(SplitCfg<Wide>{});
  }
  const FwdTile tile = FwdTileOf(pr, op, math);
  if constexpr (!cute::is_same_v<T, float>) {
    if (tile == FwdTile::kTall) return f(Cfg<T, kFwdTileN, kTallTileM>{});
  }
  if (tile == FwdTile::kNarrow) return f(Cfg<T, kNarrowTileN, kFwdTileM>{});
  return f(Wide{});
}

// Calls f(SplitCfg<FpropCfg<float, tile N, rank 2>>{}): the large-window TF32 forward's kernel.
template <class F>
auto WithLargeWindowCfg(const IgemmProblem& pr, F&& f) {
  if (LargeWindowTileN(pr) == kNarrowTileN) return f(SplitCfg<FpropCfg<float, kNarrowTileN, 2>>{});
  return f(SplitCfg<FpropCfg<float, kFwdTileN, 2>>{});
}

// Calls f(SplitCfg<FpropTiles<T, tile N, 128>>{}) for the scatter forward's phases (one tile shape for all): 128x128
// tiles when GEMM N (k) is over 64 and the phases together have at least an H100's SMs of them, else 128x64 (as
// FwdTileOf, but with no 64-row instantiation).
template <class T, class F>
auto WithScatterCfg(const IgemmProblem* prs, int count, F&& f) {
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) {
    const IgemmProblem& pr = prs[i];
    tiles += CeilDiv(pr.n * pr.out[0] * pr.out[1] * pr.out[2], kFwdTileM) * CeilDiv(pr.k, kFwdTileN);
  }
  if (count > 0 && prs[0].k > kNarrowTileN && tiles >= kPlanSms) {
    return f(SplitCfg<FpropTiles<T, kFwdTileN, kFwdTileM>>{});
  }
  return f(SplitCfg<FpropTiles<T, kNarrowTileN, kFwdTileM>>{});
}

}  // namespace

// The kernels of each op, one file each (sm90_fprop.cu, sm90_dgrad.cu, sm90_wgrad.cu, sm90_scatter.cu), so that
// their CUTLASS instantiations build in parallel; sm90.cu's entry points call them.
namespace sm90 {
bool FwdSupports(const IgemmProblem& pr, IgemmMath math);
cudaError_t FwdRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream);
bool DgradSupports(const IgemmProblem& pr, IgemmMath math);
cudaError_t DgradRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream);
bool WgradSupports(const IgemmProblem& pr, IgemmMath math);
cudaError_t WgradRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream);
bool LargeWindowSupports(const IgemmProblem& pr);
cudaError_t LargeWindowRun(const IgemmProblem& pr, const IgemmArgs& args, cudaStream_t stream);
bool ScatterFwdSupports(const IgemmProblem* prs, int count, IgemmMath math);
cudaError_t ScatterFwdRun(const IgemmScatterPhase* phases, int count, IgemmMath math, const int64_t out_stride[4],
                          cudaStream_t stream);
}  // namespace sm90
#endif  // JAXCONV_SM90_KERNELS

}  // namespace cuda
}  // namespace jaxconv
