// Hopper implicit GEMM, device side (sm90_common.cuh has the host side): the CUTLASS 3.x kernel configurations,
// the split-K and ping-pong kernel bodies and the reductions of split partial sums. Included by the sm90_*.cu files
// only (sm_90a); without JAXCONV_IGEMM_SM90 it declares nothing.
#pragma once

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

}  // namespace
#endif  // JAXCONV_SM90_KERNELS

}  // namespace cuda
}  // namespace jaxconv
