// Hopper implicit-GEMM convolutions (igemm.h): CUTLASS 3.x conv collectives (TMA im2col loads, wgmma,
// warp-specialised producer/consumer kernel), sm_90a only.
//
// Instantiations (one per op x math x tile width; f32 accumulation everywhere), rank 3 (ConvProblemShape<op, 3>) but
// for the large-window forward:
//   fprop  bf16, f16, tf32   tile 128x128x64 (tf32: x32; k <= 64, and tf32 with fewer tiles than SMs: 128x64;
//                            16-bit with k > 64 and fewer tiles than SMs: 64x128), out =
//                            operand type, fused y = act(acc + bias[k])
//   dgrad  bf16, f16         tile 128x128x64 (as fprop, with c), out = operand type, unit stride only (the sm90
//                            collective has no strided dgrad), no bias/act
//   scatter fprop bf16, f16, tf32 (part 4): tile 128x128x64 or 128x64 (x32 for tf32), y written through strided
//                            views by the consumer warpgroups' registers (ScatterStore): the phases of strided data
//                            gradients (implicit_gemm.cu), one launch each
//   wgrad  bf16, f16         tile 128x64x64 (k <= 64: 64x64x64; c % 128 == 0: 128x128x64, or 64x128x64 when the
//                            split plan estimates it faster, WgTileOf; M = K, N = C of one filter tap, K = N*Z*P*Q),
//                            f32 out, deterministic split-K over N*Z*P*Q: partial sums in the workspace, reduced
//                            in a fixed order
//   tf32 fprop on small grids (GEMM N > 64, 128x128 tiles filling at most half the SMs; SplitPlanFwd): 128x128
//                            tiles split over the reduction the same way into f32 slices; the reduction applies
//                            bias and activation (ResNet-50 res5 3x3 at batch 32, and its TF32 data gradient,
//                            which runs as a forward)
//   large-window tf32 fprop (rank 2: windows up to 255 positions per dim; the TF32 filter gradient with swapped
//                            roles, implicit_gemm.cu): 128x128 or 128x64 (k <= 64) tiles, always split over the
//                            reduction (LargeWindowPlan); the reduction of the f32 slices writes y batch-inner
// tf32 dgrad/wgrad do not exist: wgmma reads tf32 operands K-major only, and those ops need an MN-major operand.
// CUTLASS's sm90 conv kernel is non-persistent and takes no tile scheduler (no stream-K, no persistent or ping-pong
// schedules), so this file runs two variants of its body with the unchanged CUTLASS collectives: fprop/dgrad
// persistent with two consumer warpgroups in ping-pong (PingpongConvKernel: one warpgroup's MMAs overlap the
// other's epilogue; on the H100 it beat a one-consumer persistent kernel on 6 of 7 ResNet-50 layers at batch
// 128), and for the split forwards (small-grid and large-window tf32) over (tile, k range) units into f32
// slices; wgrad with a k-tile range per blockIdx.z (SplitKKernel). Cluster 1x1x1 throughout. The ping-pong split
// forward against SplitKKernel on the H200 (same build, jax.profiler): the swapped TF32 filter gradient of ResNet-50
// res5 3x3 b128 115.7 -> 94.6 us, res2 b32 and res3 b128 unchanged (44.4, 87.2).
//
// Built only when the build's arch list has 90a (CMake defines JAXCONV_IGEMM_SM90=1 for that target); otherwise
// every entry point reports "not supported".
#include "kernels/implicit_gemm/igemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>

#include "kernels/shared/common.cuh"

#if defined(JAXCONV_IGEMM_SM90) && JAXCONV_IGEMM_SM90
#define JAXCONV_SM90_KERNELS 1
// Order matters: the conv collectives use KernelHardwareInfo without including it.
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/numeric_types.h"
#include "cute/tensor.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/fast_math.h"
#include "kernels/shared/cutlass_act.cuh"
#else
#define JAXCONV_SM90_KERNELS 0
#endif

// One op's kernels per part: CMake compiles this file once for each JAXCONV_SM90_PART (1 fprop, 2 dgrad and the
// large-window forward, 3 wgrad and the entry points, 4 the scatter forward), so the sets of CUTLASS instantiations
// build in parallel; 0 (no define): all of them in one translation unit.
// Helpers that some parts do not call are [[maybe_unused]].
#ifndef JAXCONV_SM90_PART
#define JAXCONV_SM90_PART 0
#endif

namespace jaxconv {
namespace cuda {

#if JAXCONV_SM90_KERNELS
namespace {

using namespace cute;
using cutlass::conv::Operator;

// ---------------------------------------------------------------------------------------------------------------
// Tile constants shared by the host-side plan (split-K, grid checks) and the kernel types.
constexpr int kFwdTileM = 128, kFwdTileN = 128;  // fprop/dgrad: M = output pixels, N = output channels
// fprop (bf16, f16, tf32) and 16-bit dgrad whose GEMM N (fprop k, dgrad c) is at most 64 use 128x64 tiles: a
// 128-wide tile would spend half its MMAs on zero columns (ResNet's 64-channel layers). So do problems with few
// tiles in TF32 (FwdTileOf).
constexpr int kNarrowTileN = 64;
// 16-bit fprop/dgrad with GEMM N over 64 on small grids: 64x128 tiles rather than 128x64 (FwdTileOf). About as many
// tiles, but one warpgroup's m64n128k16 reads 6 KB of shared memory per 64 tensor-core cycles, where the two
// m64n64k16 of a 128x64 tile read 8 KB, all that an SM's shared memory delivers in that time.
constexpr int kTallTileM = 64;
constexpr int kWgTileM = 128, kWgTileN = 64, kWgTileK = 64;  // wgrad: M = K, N = C (one tap), K = pixels
constexpr int kWgNarrowTileM = 64;  // wgrad with k <= 64: a 128-row tile would spend half its MMAs on zero rows
constexpr int kWgWideTileN = 128;   // wgrad with c % 128 == 0 (WgTileOf)
struct WgTile {
  int64_t m, n;
};
WgTile WgTileOf(const IgemmProblem& pr);
constexpr int64_t kMaxSplits = 256;
constexpr int64_t kMaxSplitWorkspace = int64_t(256) << 20;  // bytes of wgrad partial sums at most
constexpr int64_t kMaxGridY = 65535;

// ---------------------------------------------------------------------------------------------------------------
// Kernel types.
using Cluster1 = Shape<_1, _1, _1>;  // no multicast: the filter operand is small and L2-resident

template <class T>
constexpr int Align16B() {
  return 128 / cutlass::sizeof_bits<T>::value;
}

// The tensors' layout tag by spatial rank. Every op runs rank 3 (the TMA im2col box of a 5-D tensor: pads <= 16,
// window offsets < 32), except the large-window TF32 forward (rank 2: pads <= 256, window offsets < 256).
template <int Rank>
using ActLayout = cute::conditional_t<Rank == 3, cutlass::layout::TensorNDHWC, cutlass::layout::TensorNHWC>;

// The fprop K tile: 128-byte rows (32 floats, 64 16-bit values); the split plans count TF32 k tiles with it.
template <class T>
using FwdTileK = cute::conditional_t<cute::is_same_v<T, float>, _32, _64>;

template <class T, int TileN = kFwdTileN, int Rank = 3, int TileM = kFwdTileM>
struct FpropCfg {
  static constexpr Operator kOp = Operator::kFprop;
  static constexpr bool kSplit = false;  // SplitCfg<FpropCfg>: split over the reduction
  static constexpr int kRank = Rank;
  using Element = T;
  using TileK = FwdTileK<T>;
  using TileShape = Shape<Int<TileM>, Int<TileN>, Shape<TileK>>;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<RuntimeAct, T, float, T, T, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster1,
      FullWidthEpiTile<cutlass::epilogue::TmaWarpSpecialized, TileN>, float, float, void, ActLayout<Rank>,
      Align16B<T>(), T, ActLayout<Rank>, Align16B<T>(), cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp, T, ActLayout<Rank>, Align16B<T>(), T,
      ActLayout<Rank>, Align16B<T>(), float, TileShape, Cluster1,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using Kernel =
      cutlass::conv::kernel::ConvUniversal<cutlass::conv::ConvProblemShape<kOp, Rank>, Mainloop, Epilogue>;
};

template <class T, int TileN = kFwdTileN, int TileM = kFwdTileM>
struct DgradCfg {
  static constexpr Operator kOp = Operator::kDgrad;
  static constexpr bool kSplit = false;
  static constexpr int kRank = 3;
  using Element = T;
  using TileShape = Shape<Int<TileM>, Int<TileN>, Shape<_64>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster1,
      FullWidthEpiTile<cutlass::epilogue::TmaWarpSpecialized, TileN>, float, float, void,
      cutlass::layout::TensorNDHWC, Align16B<T>(), T, cutlass::layout::TensorNDHWC, Align16B<T>(),
      cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp, T, cutlass::layout::TensorNDHWC, Align16B<T>(), T,
      cutlass::layout::TensorNDHWC, Align16B<T>(), float, TileShape, Cluster1,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using Kernel = cutlass::conv::kernel::ConvUniversal<cutlass::conv::ConvProblemShape<kOp, 3>, Mainloop, Epilogue>;
};

// dw (K, (C,S,R,T)) with a batch (L) stride: the L index is the split, so each split writes its own f32 slice.
using WgradStrideD = cute::Stride<int64_t, cute::Stride<_1, int64_t, int64_t, int64_t>, int64_t>;

template <class T, int TileM = kWgTileM, int TileN = kWgTileN>
struct WgradCfg {
  static constexpr Operator kOp = Operator::kWgrad;
  static constexpr int kRank = 3;
  using Element = T;
  using TileShape = Shape<Int<TileM>, Shape<Int<TileN>>, Shape<Int<kWgTileK>>>;
  // Register-direct epilogue (as CUTLASS's own wgrad kernels): the output is small next to the reduction.
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster1,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, WgradStrideD, 4, float, WgradStrideD, 4,
      cutlass::epilogue::NoSmemWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp, T, cutlass::layout::TensorNDHWC, Align16B<T>(), T,
      cutlass::layout::TensorNDHWC, Align16B<T>(), float, TileShape, Cluster1,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using Kernel = cutlass::conv::kernel::ConvUniversal<cutlass::conv::ConvProblemShape<kOp, 3>, Mainloop, Epilogue>;
};

// The forward split over the reduction (SplitPlanFwd: TF32 on small grids; the large-window TF32 forward): Cfg's
// mainloop with a register-direct f32 epilogue. D is the output's (pixels, channels) matrix in f32, modes
// ((q,p,z,n), ch, l) (rank 2: ((q,p,n), ch, l)), the L stride separating the splits' slices; ReduceSplitsEpilogue
// adds them and applies bias and activation.
template <int Rank>
using SplitStrideD =
    cute::conditional_t<Rank == 3, cute::Stride<cute::Stride<int64_t, int64_t, int64_t, int64_t>, _1, int64_t>,
                        cute::Stride<cute::Stride<int64_t, int64_t, int64_t>, _1, int64_t>>;

template <class Cfg>
struct SplitCfg {
  static_assert(!Cfg::kSplit, "Cfg is the unsplit kernel whose mainloop the split runs");
  static constexpr Operator kOp = Cfg::kOp;
  static constexpr bool kSplit = true;
  static constexpr int kRank = Cfg::kRank;
  using Element = typename Cfg::Element;
  using TileShape = typename Cfg::TileShape;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster1,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, SplitStrideD<kRank>, 4, float,
      SplitStrideD<kRank>, 4, cutlass::epilogue::NoSmemWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp, Element, ActLayout<kRank>, Align16B<Element>(),
      Element, ActLayout<kRank>, Align16B<Element>(), float, TileShape, Cluster1,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using Kernel =
      cutlass::conv::kernel::ConvUniversal<cutlass::conv::ConvProblemShape<kOp, kRank>, Mainloop, Epilogue>;
};

// ---------------------------------------------------------------------------------------------------------------
// Split-K for wgrad (the forwards split on PingpongConvKernel): the body of CUTLASS's
// non-persistent warp-specialised kernel (GemmUniversal for KernelTmaWarpSpecialized,
// sm90_gemm_tma_warpspecialized.hpp), with two changes: block z runs only its range of k tiles, and the epilogue
// sees L = splits with l = blockIdx.z (the L stride of dD separates the slices).
template <class Base>
struct SplitKKernel {
  using ProblemShape = typename Base::ProblemShape;
  using CollectiveMainloop = typename Base::CollectiveMainloop;
  using CollectiveEpilogue = typename Base::CollectiveEpilogue;
  using TileShape = typename Base::TileShape;
  using TiledMma = typename Base::TiledMma;
  using ArchTag = typename Base::ArchTag;
  using ClusterShape = typename Base::ClusterShape;
  using SharedStorage = typename Base::SharedStorage;
  static constexpr int SharedStorageSize = Base::SharedStorageSize;
  static constexpr uint32_t MaxThreadsPerBlock = Base::MaxThreadsPerBlock;
  static constexpr uint32_t MinBlocksPerMultiprocessor = Base::MinBlocksPerMultiprocessor;
  static_assert(cute::size(ClusterShape{}) == 1, "the split kernel assumes no clusters");

  struct Params {
    typename Base::Params base;
    int k_tiles_per_split;
    int splits;
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    enum class WarpGroupRole { Producer = 0, Consumer = 1 };

    SharedStorage& shared_storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int thread_idx = int(threadIdx.x);
    const int lane_idx = cutlass::canonical_lane_idx();
    const int warp_idx = cutlass::canonical_warp_idx_sync();
    const int warp_idx_in_warp_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
    const int warp_group_thread_idx = thread_idx % cutlass::NumThreadsPerWarpGroup;
    const auto warp_group_role = WarpGroupRole(cutlass::canonical_warp_group_idx());
    const bool is_load_warp = warp_group_role == WarpGroupRole::Producer && warp_idx_in_warp_group == 0;
    const int lane_predicate = cute::elect_one_sync();
    const uint32_t block_rank_in_cluster = cute::block_rank_in_cluster();

    if (warp_idx == 0 && lane_predicate) {
      CollectiveMainloop::prefetch_tma_descriptors(params.base.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.base.epilogue);
    }

    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (is_load_warp) mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (warp_group_role == WarpGroupRole::Consumer) {
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    }
    mainloop_pipeline_params.is_leader = warp_group_thread_idx == 0;
    mainloop_pipeline_params.num_consumers = cutlass::NumThreadsPerWarpGroup;
    mainloop_pipeline_params.transaction_bytes = params.base.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (is_load_warp) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (warp_group_role == WarpGroupRole::Consumer) {
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    }
    epi_load_pipeline_params.dst_blockid = block_rank_in_cluster;
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = cutlass::NumThreadsPerWarpGroup;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_pipeline_params.transaction_bytes = params.base.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename CollectiveMainloop::PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    auto mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_load_pipe_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    auto epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    __syncthreads();  // pipeline barriers initialised before anyone uses them (cluster of one)

    auto blk_shape = TileShape{};
    TiledMma tiled_mma;
    auto problem_shape_MNKL = append<4>(params.base.problem_shape, Int<1>{});

    CollectiveMainloop collective_mainloop;
    CollectiveEpilogue collective_epilogue(params.base.epilogue, shared_storage.tensors.epilogue);

    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.base.mainloop);
    cute::Tensor gA_mkl = get<0>(load_inputs);
    cute::Tensor gB_nkl = get<1>(load_inputs);

    auto m_coord = idx2crd(int(blockIdx.x), shape<2>(gA_mkl));
    auto n_coord = idx2crd(int(blockIdx.y), shape<2>(gB_nkl));
    auto blk_coord = make_coord(m_coord, n_coord, _, Int<0>{});

    // This block's k tiles (the host plan leaves no split empty).
    const int k_tiles = int(size<3>(gA_mkl));
    const int k_begin = int(blockIdx.z) * params.k_tiles_per_split;
    const int k_tile_count = max(0, min(params.k_tiles_per_split, k_tiles - k_begin));
    auto k_tile_iter = cute::make_coord_iterator(idx2crd(k_begin, shape<3>(gA_mkl)), shape<3>(gA_mkl));

    // The epilogue's view: L = splits, this block writes slice blockIdx.z.
    auto epi_shape_MNKL = make_shape(get<0>(problem_shape_MNKL), get<1>(problem_shape_MNKL),
                                     get<2>(problem_shape_MNKL), params.splits);
    auto epi_coord = make_coord(m_coord, n_coord, _, int(blockIdx.z));

    if (warp_group_role == WarpGroupRole::Producer) {
      if (warp_idx_in_warp_group == 0) {
        cutlass::arch::wait_on_dependent_grids();
        collective_mainloop.load(params.base.mainloop, mainloop_pipeline, mainloop_pipe_producer_state, load_inputs,
                                 blk_coord, k_tile_iter, k_tile_count, lane_idx, block_rank_in_cluster,
                                 shared_storage.tensors.mainloop);
        mainloop_pipe_producer_state.advance(k_tile_count);
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
        if (collective_epilogue.is_producer_load_needed()) {
          __syncwarp();
          epi_load_pipe_producer_state =
              collective_epilogue.load(epi_load_pipeline, epi_load_pipe_producer_state, epi_shape_MNKL, blk_shape,
                                       epi_coord, tiled_mma, lane_idx, shared_storage.tensors.epilogue);
          collective_epilogue.load_tail(epi_load_pipeline, epi_load_pipe_producer_state);
        }
      }
    } else if (warp_group_role == WarpGroupRole::Consumer) {
      cute::Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
      if (k_tile_count == 0) cute::clear(accumulators);  // mma() only zeroes them with its first k tile
      collective_mainloop.mma(mainloop_pipeline, mainloop_pipe_consumer_state, accumulators, k_tile_count,
                              warp_group_thread_idx, shared_storage.tensors.mainloop, params.base.mainloop);
      collective_mainloop.mma_tail(mainloop_pipeline, mainloop_pipe_consumer_state, k_tile_count);
      cutlass::arch::launch_dependent_grids();
      auto [epi_load_next, epi_store_next] = collective_epilogue.store(
          epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
          epi_shape_MNKL, blk_shape, epi_coord, accumulators, tiled_mma, warp_group_thread_idx,
          shared_storage.tensors.epilogue);
      collective_epilogue.store_tail(epi_load_pipeline, epi_load_next, epi_store_pipeline, epi_store_next);
    }
#endif
  }
};

// The scatter epilogue's destination (IgemmSm90ScatterFwdRun): GEMM row m, the output pixel (n, z, p, q) of
// m = ((n * Z + z) * P + p) * Q + q, goes to ptr + n * stride[0] + z * stride[1] + p * stride[2] + q * stride[3]
// (elements), its `cols` channels contiguous.
struct ScatterOut {
  void* ptr = nullptr;
  int64_t stride[4] = {};
  cutlass::FastDivmod q, p, z;
  int rows = 0, cols = 0;
};

// Stores one warpgroup's 128 x TileN f32 accumulator tile (rows from m0, columns from n0) through `o`, rounded to T,
// two adjacent columns per store. wgmma's accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N): values (0, v1, v2) and
// (1, v1, v2) are adjacent columns of one row, v1 steps 8 rows, v2 8 columns; each thread decodes its 2 * MMA_M rows
// once. cols is even, so a pair is in range when its first column is.
template <class T, class TileShape, class Accum, class ThrMma>
CUTLASS_DEVICE void ScatterStore(const ScatterOut& o, const Accum& acc, const ThrMma& thr_mma, int m0, int n0) {
  using namespace cute;
  using Values = decltype(shape<0>(typename Accum::layout_type{}));
  static_assert(rank_v<Values> == 3 && decltype(size<0>(Values{}))::value == 2 &&
                    decltype(size<1>(Values{}))::value == 2,
                "the wgmma accumulator layout");
  const auto tCcD = thr_mma.partition_C(make_identity_tensor(take<0, 2>(TileShape{})));  // (m, n) in the tile
  T* const base = static_cast<T*>(o.ptr);
  CUTLASS_PRAGMA_UNROLL
  for (int mi = 0; mi < size<1>(acc); ++mi) {
    CUTLASS_PRAGMA_UNROLL
    for (int v1 = 0; v1 < 2; ++v1) {
      const int m = m0 + int(get<0>(tCcD(make_coord(make_coord(0, v1, 0), mi, 0))));
      if (m >= o.rows) continue;
      int r = 0, q = 0, p = 0, z = 0, n = 0;
      o.q(r, q, m);
      o.p(r, p, r);
      o.z(n, z, r);
      T* const row = base + n * o.stride[0] + z * o.stride[1] + p * o.stride[2] + q * o.stride[3];
      CUTLASS_PRAGMA_UNROLL
      for (int ni = 0; ni < size<2>(acc); ++ni) {
        CUTLASS_PRAGMA_UNROLL
        for (int v2 = 0; v2 < size<0, 2>(acc); ++v2) {
          const auto lo = make_coord(make_coord(0, v1, v2), mi, ni), hi = make_coord(make_coord(1, v1, v2), mi, ni);
          const int col = n0 + int(get<1>(tCcD(lo)));
          if (col >= o.cols) continue;
          cutlass::AlignedArray<T, 2> v;
          v[0] = T(acc(lo));
          v[1] = T(acc(hi));
          *reinterpret_cast<cutlass::AlignedArray<T, 2>*>(row + col) = v;
        }
      }
    }
  }
}

// Ping-pong fprop/dgrad (the schedule of CUTLASS's KernelTmaWarpSpecializedPingpong GEMM, which its sm90 conv
// dispatch does not offer): two consumer warpgroups take alternate tiles of the block's walk (blockIdx.x +
// (2i + w) * gridDim.x for warpgroup w), each a whole tile with the one-warpgroup TiledMma of the unchanged
// collectives. An ordered barrier lets one warpgroup's MMAs run while the other's epilogue drains, so the tensor
// cores stay busy through epilogues (what limits short reductions and 64-wide layers). The producer warp loads
// every tile in walk order; each consumer skips the other's k tiles in the shared pipeline.
// Split (SplitCfg kernels, whose register epilogue writes f32 slices): the walk is over units u = s * tiles + t,
// tile t's k tiles [s * k_tiles_per_split, + k_tiles_per_split) into slice s (the epilogue's L index).
// ScatterT: void, or the element type of the scatter epilogue (ScatterStore replaces the collective epilogue: the
// phases of strided data gradients, IgemmSm90ScatterFwdRun).
template <class Base, bool Split = false, class ScatterT = void>
struct PingpongConvKernel {
  using ProblemShape = typename Base::ProblemShape;
  using CollectiveMainloop = typename Base::CollectiveMainloop;
  using CollectiveEpilogue = typename Base::CollectiveEpilogue;
  using TileShape = typename Base::TileShape;
  using TiledMma = typename Base::TiledMma;
  using ArchTag = typename Base::ArchTag;
  using ClusterShape = typename Base::ClusterShape;
  static_assert(cute::size(ClusterShape{}) == 1, "the ping-pong kernel assumes no clusters");
  static_assert(cute::size(TiledMma{}) == cutlass::NumThreadsPerWarpGroup, "one warpgroup per tile");
  static constexpr uint32_t NumMmaWarpGroups = 2;
  static constexpr uint32_t MaxThreadsPerBlock = (1 + NumMmaWarpGroups) * cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;
  static constexpr uint32_t LoadRegisters = 40, MmaRegisters = 232;  // CUTLASS's split of the register file
  using MathOrderBarrier = cutlass::OrderedSequenceBarrier<2, NumMmaWarpGroups>;  // stages: mainloop, epilogue

  struct SharedStorage {
    struct TensorStorage {
      typename CollectiveMainloop::TensorStorage mainloop;
      typename CollectiveEpilogue::TensorStorage epilogue;
    } tensors;
    struct PipelineStorage : cute::aligned_struct<16, _1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
      alignas(16) typename MathOrderBarrier::SharedStorage math_order;
    } pipelines;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);

  struct Params {
    typename Base::Params base;
    int tiles_m, tiles_n;  // tile t -> (m = t / tiles_n, n = t % tiles_n): blocks running together share A rows
    int splits = 1, k_tiles_per_split = 0;  // Split only (the host plan leaves no split empty)
    ScatterOut scatter;                     // Scatter only
  };
  static constexpr bool Scatter = !cute::is_void_v<ScatterT>;
  static_assert(!(Split && Scatter), "the scatter epilogue writes whole reductions");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    if constexpr (Scatter) {
      // The phases of one data gradient write disjoint rows and read only what was complete before the first phase
      // started: the next phase (launched as a programmatic dependent) may take SMs as this one's blocks finish.
      asm volatile("griddepcontrol.launch_dependents;");
    }
    SharedStorage& shared_storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int thread_idx = int(threadIdx.x);
    const int lane_idx = cutlass::canonical_lane_idx();
    const int warp_idx = cutlass::canonical_warp_idx_sync();
    const int warp_idx_in_warp_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
    const int warp_group_thread_idx = thread_idx % cutlass::NumThreadsPerWarpGroup;
    const int warp_group = cutlass::canonical_warp_group_idx();  // 0 producer, 1 and 2 consumers
    const bool is_load_warp = warp_group == 0 && warp_idx_in_warp_group == 0;
    const bool is_epi_load_warp = warp_group == 0 && warp_idx_in_warp_group == 1;
    const int lane_predicate = cute::elect_one_sync();
    const uint32_t block_rank_in_cluster = cute::block_rank_in_cluster();

    if (warp_idx == 0 && lane_predicate) {
      CollectiveMainloop::prefetch_tma_descriptors(params.base.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.base.epilogue);
    }

    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (is_load_warp) mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (warp_group > 0) mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_pipeline_params.is_leader = warp_group_thread_idx == 0;
    mainloop_pipeline_params.num_consumers = cutlass::NumThreadsPerWarpGroup;  // one warpgroup per stage
    mainloop_pipeline_params.transaction_bytes = params.base.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (is_epi_load_warp) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (warp_group > 0) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_pipeline_params.dst_blockid = block_rank_in_cluster;
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = cutlass::NumThreadsPerWarpGroup;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_pipeline_params.transaction_bytes = params.base.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename MathOrderBarrier::Params math_order_params;
    math_order_params.group_id = warp_group > 0 ? warp_group - 1 : 0;  // the producer never uses it
    math_order_params.group_size = cutlass::NumThreadsPerWarpGroup;
    MathOrderBarrier math_order(shared_storage.pipelines.math_order, math_order_params);

    typename CollectiveMainloop::PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    auto mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_load_pipe_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    auto epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    __syncthreads();  // pipeline and order barriers initialised before anyone uses them (cluster of one)

    auto blk_shape = TileShape{};
    TiledMma tiled_mma;
    auto problem_shape_MNKL = append<4>(params.base.problem_shape, Int<1>{});

    CollectiveMainloop collective_mainloop;
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.base.mainloop);
    cute::Tensor gA_mkl = get<0>(load_inputs);
    cute::Tensor gB_nkl = get<1>(load_inputs);
    const int k_tiles = int(size<3>(gA_mkl));
    const auto c_tile_count = CollectiveEpilogue::get_load_pipe_increment(blk_shape);
    const auto d_tile_count = CollectiveEpilogue::get_store_pipe_increment(blk_shape);
    const int tiles = params.tiles_m * params.tiles_n;
    const int units = Split ? tiles * params.splits : tiles;
    const int per = Split ? params.k_tiles_per_split : k_tiles;
    auto k_begin = [&](int u) { return Split ? (u / tiles) * per : 0; };
    auto k_count = [&](int u) { return Split ? max(0, min(per, k_tiles - k_begin(u))) : k_tiles; };
    auto tile_coord = [&](int u) {
      const int t = Split ? u % tiles : u;
      return make_coord(idx2crd(t / params.tiles_n, shape<2>(gA_mkl)), idx2crd(t % params.tiles_n, shape<2>(gB_nkl)),
                        _, Int<0>{});
    };
    // The epilogue's view: split units write slice u / tiles of L = splits.
    auto epi_shape = [&] {
      if constexpr (Split) {
        return make_shape(get<0>(problem_shape_MNKL), get<1>(problem_shape_MNKL), get<2>(problem_shape_MNKL),
                          params.splits);
      } else {
        return problem_shape_MNKL;
      }
    }();
    auto epi_coord = [&](int u) {
      if constexpr (Split) {
        const int t = u % tiles;
        return make_coord(idx2crd(t / params.tiles_n, shape<2>(gA_mkl)), idx2crd(t % params.tiles_n, shape<2>(gB_nkl)),
                          _, u / tiles);
      } else {
        return tile_coord(u);
      }
    };

    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<LoadRegisters>();
      if (is_load_warp) {
        cutlass::arch::wait_on_dependent_grids();
        for (int u = int(blockIdx.x); u < units; u += int(gridDim.x)) {
          const int kc = k_count(u);
          auto k_tile_iter = cute::make_coord_iterator(idx2crd(k_begin(u), shape<3>(gA_mkl)), shape<3>(gA_mkl));
          collective_mainloop.load(params.base.mainloop, mainloop_pipeline, mainloop_pipe_producer_state,
                                   load_inputs, tile_coord(u), k_tile_iter, kc, lane_idx, block_rank_in_cluster,
                                   shared_storage.tensors.mainloop);
          mainloop_pipe_producer_state.advance(kc);
        }
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
      } else if (is_epi_load_warp) {
        CollectiveEpilogue collective_epilogue(params.base.epilogue, shared_storage.tensors.epilogue);
        if (collective_epilogue.is_producer_load_needed()) {
          cutlass::arch::wait_on_dependent_grids();
          for (int u = int(blockIdx.x); u < units; u += int(gridDim.x)) {
            epi_load_pipe_producer_state =
                collective_epilogue.load(epi_load_pipeline, epi_load_pipe_producer_state, epi_shape, blk_shape,
                                         epi_coord(u), tiled_mma, lane_idx, shared_storage.tensors.epilogue);
          }
          collective_epilogue.load_tail(epi_load_pipeline, epi_load_pipe_producer_state);
        }
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<MmaRegisters>();
      const int wg = warp_group - 1;
      CollectiveEpilogue collective_epilogue(params.base.epilogue, shared_storage.tensors.epilogue);
      // The block's units in walk order: warpgroup wg runs those with j % 2 == wg and skips the other's stages in
      // every shared pipeline.
      for (int j = 0, u = int(blockIdx.x); u < units; ++j, u += int(gridDim.x)) {
        const int kc = k_count(u);
        if ((j & 1) != wg) {
          mainloop_pipe_consumer_state.advance(kc);
          epi_load_pipe_consumer_state.advance(c_tile_count);
          epi_store_pipe_producer_state.advance(d_tile_count);
          continue;
        }
        cute::Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
        if (kc == 0) cute::clear(accumulators);  // mma() zeroes them with its first k tile only
        math_order.wait();  // MMAs of the two warpgroups in turn
        collective_mainloop.mma(mainloop_pipeline, mainloop_pipe_consumer_state, accumulators, kc,
                                warp_group_thread_idx, shared_storage.tensors.mainloop, params.base.mainloop);
        math_order.arrive();
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_pipe_consumer_state, kc);
        mainloop_pipe_consumer_state.advance(kc);
        math_order.wait();  // epilogues in turn: they share the epilogue's shared memory
        if constexpr (Scatter) {  // registers to global memory: no shared memory, no pipeline
          ScatterStore<ScatterT, TileShape>(params.scatter, accumulators,
                                            tiled_mma.get_thread_slice(warp_group_thread_idx),
                                            (u / params.tiles_n) * int(size<0>(blk_shape)),
                                            (u % params.tiles_n) * int(size<1>(blk_shape)));
        } else {
          auto [epi_load_next, epi_store_next] = collective_epilogue.store(
              epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
              epi_shape, blk_shape, epi_coord(u), accumulators, tiled_mma, warp_group_thread_idx,
              shared_storage.tensors.epilogue);
          // This warpgroup's TMA stores must finish before the other warpgroup's epilogue reuses the buffers.
          auto [epi_load_done, epi_store_done] =
              collective_epilogue.store_tail(epi_load_pipeline, epi_load_next, epi_store_pipeline, epi_store_next);
          epi_load_pipe_consumer_state = epi_load_done;
          epi_store_pipe_producer_state = epi_store_done;
        }
        math_order.arrive();
      }
      cutlass::arch::launch_dependent_grids();
    }
    if constexpr (Scatter) {
      // Complete only after the previous phase has (a no-op unless launched as a programmatic dependent): work after
      // the last phase in the stream then sees every phase done.
      asm volatile("griddepcontrol.wait;" ::: "memory");
    }
#endif
  }
};

// sum_{s < splits} part[s * count4 + e], s ascending (deterministic).
__device__ __forceinline__ float4 SumSplits(const float4* __restrict__ part, int64_t splits, int64_t count4,
                                            int64_t e) {
  float4 acc = part[e];
  for (int64_t s = 1; s < splits; ++s) {
    const float4 v = part[s * count4 + e];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  return acc;
}

// dw[e] = sum_{s < splits} part[s * count + e]. count % 4 == 0, 16-byte aligned.
[[maybe_unused]] __global__ void ReduceWgradSplits(const float4* __restrict__ part, int64_t splits,
                                                   int64_t count4, float4* __restrict__ dw) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count4; e += int64_t(gridDim.x) * blockDim.x) {
    dw[e] = SumSplits(part, splits, count4, e);
  }
}

// out[e'] = act(sum_{s < splits} part[s * count + e] + bias[e % ch]) rounded to T, e' = e, or with batch_inner > 0
// the element of y's (pixel, n) row moved to row (pixel, n): the slices hold y as (n, pixels, ch) with n =
// batch_inner, the output is (pixels, n, ch). 4 consecutive elements per step (ch % 4 == 0, so they share a row).
// bias may be null.
template <class T>
__global__ void ReduceSplitsEpilogue(const float4* __restrict__ part, int64_t splits, int64_t count4, int64_t ch,
                                     const T* __restrict__ bias, int act, int64_t batch_inner,
                                     cutlass::AlignedArray<T, 4>* __restrict__ out) {
  const int64_t ch4 = ch / 4, pixels = batch_inner > 0 ? count4 / ch4 / batch_inner : 0;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count4; e += int64_t(gridDim.x) * blockDim.x) {
    const float4 acc = SumSplits(part, splits, count4, e);
    const float v[4] = {acc.x, acc.y, acc.z, acc.w};
    const int64_t row = e / ch4, k4 = e - row * ch4;
    cutlass::AlignedArray<T, 4> r;
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = T(Activate(bias != nullptr ? v[i] + float(bias[4 * k4 + i]) : v[i], act));
    out[batch_inner > 0 ? ((row % pixels) * batch_inner + row / pixels) * ch4 + k4 : e] = r;
  }
}

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
// kMinSplitKTiles k tiles per split. ResNet-50
// res5 3x3 at batch 32 (52 tiles of 144 TF32 k tiles; unsplit, 104 half-width tiles with each block's second consumer
// warpgroup idle), H200, kernel times of the same build: TF32 fwd 47.5 -> 42.1 µs, TF32 data gradient (the flipped
// forward) 50.8 -> 46.3; bf16 fwd 29.5 -> 30.1 and dgrad 29.3 -> 30.6, so 16-bit problems keep the unsplit plan.
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
// quarter (H200, runs 106-107).
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

// Each part's ops (JAXCONV_SM90_PART, at the top).
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

#if JAXCONV_SM90_PART == 0 || JAXCONV_SM90_PART == 1
bool FwdSupports(const IgemmProblem& pr, IgemmMath math) {
  constexpr Op op = Op::kFwd;
  auto can = [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<FpropTiles, cutlass::bfloat16_t>(pr, op, math, can);
  if (math == IgemmMath::kF16) return WithFwdCfg<FpropTiles, cutlass::half_t>(pr, op, math, can);
  return WithFwdCfg<FpropTiles, float>(pr, op, math, can);
}

cudaError_t FwdRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream) {
  constexpr Op op = Op::kFwd;
  // kF32 out is the operand type for tf32 (f32 operands); 16-bit operands write 16-bit only.
  if (args.out_type != IgemmOut::kSame && math != IgemmMath::kTF32) return cudaErrorNotSupported;
  auto run = [&](auto cfg) { return RunFwdOrDgrad<decltype(cfg)>(pr, args, math, stream); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<FpropTiles, cutlass::bfloat16_t>(pr, op, math, run);
  if (math == IgemmMath::kF16) return WithFwdCfg<FpropTiles, cutlass::half_t>(pr, op, math, run);
  return WithFwdCfg<FpropTiles, float>(pr, op, math, run);
}
#endif

#if JAXCONV_SM90_PART == 0 || JAXCONV_SM90_PART == 2
bool DgradSupports(const IgemmProblem& pr, IgemmMath math) {
  constexpr Op op = Op::kDgrad;
  auto can = [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<DgradTiles, cutlass::bfloat16_t>(pr, op, math, can);
  return WithFwdCfg<DgradTiles, cutlass::half_t>(pr, op, math, can);
}

cudaError_t DgradRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream) {
  constexpr Op op = Op::kDgrad;
  if (args.out_type != IgemmOut::kSame) return cudaErrorNotSupported;
  auto run = [&](auto cfg) { return RunFwdOrDgrad<decltype(cfg)>(pr, args, math, stream); };
  if (math == IgemmMath::kBF16) return WithFwdCfg<DgradTiles, cutlass::bfloat16_t>(pr, op, math, run);
  return WithFwdCfg<DgradTiles, cutlass::half_t>(pr, op, math, run);
}

// The large-window TF32 forward builds with the data gradients, the lightest part.
bool LargeWindowSupports(const IgemmProblem& pr) {
  return WithLargeWindowCfg(pr, [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); });
}

cudaError_t LargeWindowRun(const IgemmProblem& pr, const IgemmArgs& args, cudaStream_t stream) {
  if (!Aligned16(args.a) || !Aligned16(args.b) || !Aligned16(args.out)) return cudaErrorInvalidValue;
  return WithLargeWindowCfg(pr, [&](auto cfg) {
    return RunSplitFwd<decltype(cfg)>(pr, args, LargeWindowPlan(pr), /*batch_inner=*/true, stream);
  });
}
#endif

#if JAXCONV_SM90_PART == 0 || JAXCONV_SM90_PART == 4
bool ScatterFwdSupports(const IgemmProblem* prs, int count, IgemmMath math) {
  auto can = [&](auto cfg) {
    for (int i = 0; i < count; ++i) {
      if (!CanImplement<decltype(cfg)>(prs[i])) return false;
    }
    return true;
  };
  if (math == IgemmMath::kBF16) return WithScatterCfg<cutlass::bfloat16_t>(prs, count, can);
  if (math == IgemmMath::kF16) return WithScatterCfg<cutlass::half_t>(prs, count, can);
  return WithScatterCfg<float>(prs, count, can);
}

cudaError_t ScatterFwdRun(const IgemmScatterPhase* phases, int count, IgemmMath math, const int64_t out_stride[4],
                          cudaStream_t stream) {
  IgemmProblem prs[kMaxScatterPhases];
  for (int i = 0; i < count; ++i) prs[i] = phases[i].pr;
  auto run = [&](auto cfg) { return RunScatterFwd<decltype(cfg)>(phases, count, out_stride, stream); };
  if (math == IgemmMath::kBF16) return WithScatterCfg<cutlass::bfloat16_t>(prs, count, run);
  if (math == IgemmMath::kF16) return WithScatterCfg<cutlass::half_t>(prs, count, run);
  return WithScatterCfg<float>(prs, count, run);
}
#endif

#if JAXCONV_SM90_PART == 0 || JAXCONV_SM90_PART == 3
bool WgradSupports(const IgemmProblem& pr, IgemmMath math) {
  auto can = [&](auto cfg) { return CanImplement<decltype(cfg)>(pr); };
  if (math == IgemmMath::kBF16) return WithWgradCfg<cutlass::bfloat16_t>(pr, can);
  return WithWgradCfg<cutlass::half_t>(pr, can);
}

cudaError_t WgradRun(const IgemmProblem& pr, IgemmMath math, const IgemmArgs& args, cudaStream_t stream) {
  auto run = [&](auto cfg) { return RunWgrad<decltype(cfg)>(pr, args, stream); };
  if (math == IgemmMath::kBF16) return WithWgradCfg<cutlass::bfloat16_t>(pr, run);
  return WithWgradCfg<cutlass::half_t>(pr, run);
}
#endif
}  // namespace sm90
#endif  // JAXCONV_SM90_KERNELS

#if JAXCONV_SM90_PART == 0 || JAXCONV_SM90_PART == 3
bool IgemmSm90Supports(const IgemmProblem& pr, Op op, IgemmMath math) {
#if JAXCONV_SM90_KERNELS
  if (!BasicChecks(pr, op, math)) return false;
  switch (op) {
    case Op::kFwd: return sm90::FwdSupports(pr, math);
    case Op::kDgrad: return sm90::DgradSupports(pr, math);
    case Op::kWgrad: return sm90::WgradSupports(pr, math);
  }
  return false;
#else
  (void)pr;
  (void)op;
  (void)math;
  return false;
#endif
}

size_t IgemmSm90WorkspaceBytes(const IgemmProblem& pr, Op op, IgemmMath math) {
#if JAXCONV_SM90_KERNELS
  // CUTLASS's conv kernel needs none; only the split partial sums.
  if (!IgemmSm90Supports(pr, op, math)) return 0;
  switch (op) {
    case Op::kFwd: return SplitFwdWorkspace(pr, math);
    case Op::kWgrad: return WgradWorkspace(pr);
    default: return 0;
  }
#else
  (void)pr;
  (void)op;
  (void)math;
  return 0;
#endif
}

bool IgemmSm90LargeWindowSupports(const IgemmProblem& pr) {
#if JAXCONV_SM90_KERNELS
  return LargeWindowChecks(pr) && sm90::LargeWindowSupports(pr);
#else
  (void)pr;
  return false;
#endif
}

size_t IgemmSm90LargeWindowWorkspaceBytes(const IgemmProblem& pr) {
#if JAXCONV_SM90_KERNELS
  return IgemmSm90LargeWindowSupports(pr) ? SplitBytes(pr, LargeWindowPlan(pr)) : 0;
#else
  (void)pr;
  return 0;
#endif
}

cudaError_t IgemmSm90LargeWindowRun(const IgemmProblem& pr, const IgemmArgs& args, cudaStream_t stream) {
#if JAXCONV_SM90_KERNELS
  if (!LargeWindowChecks(pr)) return cudaErrorNotSupported;
  if (args.bias != nullptr || args.act != kActNone) return cudaErrorNotSupported;
  return sm90::LargeWindowRun(pr, args, stream);
#else
  (void)pr;
  (void)args;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

#if JAXCONV_SM90_KERNELS
// The scatter entry points' checks: 1..kMaxScatterPhases forwards of one k (even: ExtentChecks' alignment), each one
// the rank-3 kernels take. pr(i): phase i's problem.
template <class PrOf>
bool ScatterChecks(int count, IgemmMath math, PrOf pr) {
  if (count < 1 || count > kMaxScatterPhases) return false;
  for (int i = 0; i < count; ++i) {
    if (!BasicChecks(pr(i), Op::kFwd, math) || pr(i).k != pr(0).k) return false;
  }
  return true;
}
#endif

bool IgemmSm90ScatterFwdSupports(const IgemmProblem* prs, int count, IgemmMath math) {
#if JAXCONV_SM90_KERNELS
  if (!ScatterChecks(count, math, [&](int i) -> const IgemmProblem& { return prs[i]; })) return false;
  return sm90::ScatterFwdSupports(prs, count, math);
#else
  (void)prs;
  (void)count;
  (void)math;
  return false;
#endif
}

cudaError_t IgemmSm90ScatterFwdRun(const IgemmScatterPhase* phases, int count, IgemmMath math,
                                   const int64_t out_stride[4], cudaStream_t stream) {
#if JAXCONV_SM90_KERNELS
  if (!ScatterChecks(count, math, [&](int i) -> const IgemmProblem& { return phases[i].pr; })) {
    return cudaErrorNotSupported;
  }
  return sm90::ScatterFwdRun(phases, count, math, out_stride, stream);
#else
  (void)phases;
  (void)count;
  (void)math;
  (void)out_stride;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

cudaError_t IgemmSm90Run(const IgemmProblem& pr, Op op, IgemmMath math, const IgemmArgs& args,
                         cudaStream_t stream) {
#if JAXCONV_SM90_KERNELS
  if (!BasicChecks(pr, op, math)) return cudaErrorNotSupported;
  switch (op) {
    case Op::kFwd: return sm90::FwdRun(pr, math, args, stream);
    case Op::kDgrad: return sm90::DgradRun(pr, math, args, stream);
    case Op::kWgrad: return sm90::WgradRun(pr, math, args, stream);
  }
  return cudaErrorNotSupported;
#else
  (void)pr;
  (void)op;
  (void)math;
  (void)args;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}
#endif  // the entry points' part

}  // namespace cuda
}  // namespace jaxconv
