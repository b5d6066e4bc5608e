// Host-side API of the CUDA kernel families (plain C++; included by the FFI handlers and the .cu files).
// Every launcher only enqueues work on `stream` (no allocation, no synchronisation) and returns the first CUDA
// error (cudaGetLastError after each launch).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "conv_params.h"

namespace jaxconv {
namespace cuda {

enum class DT { kF32, kF64, kBF16, kF16 };
enum class CudaOp { kFwd, kDgrad, kWgrad };

struct Status {
  int code = 0;  // 0 ok, 1 invalid argument, 2 internal (CUDA error)
  std::string msg;
  bool ok() const { return code == 0; }
};

// ---- dispatch.cu: the one place that picks the algorithm ----
// Resolves params.algorithm (0 = auto) for `op` with operand dtype `in` and result dtype `out`; an explicit
// algorithm whose predicate fails gives code 1.
Status ChooseAlgorithm(const ConvParams& p, CudaOp op, DT in, DT out, int64_t* algo);
// Workspace bytes the chosen algorithm needs (0: none); a function of the problem alone (see kPlanSms), so the
// Python lowering asks for the same number (workspace_bytes in the extension) and XLA allocates it as a result.
size_t ScratchBytes(const ConvParams& p, CudaOp op, DT in, int64_t algo);
// ChooseAlgorithm + ScratchBytes; 0 when the algorithm choice fails (the handler reports that error).
size_t WorkspaceBytes(const ConvParams& p, CudaOp op, DT in, DT out);
// Enqueues the op. a, b: operands in the op's order (fwd x, w; dgrad dy, w; wgrad x, dy); bias fwd only.
// A workspace shorter than ScratchBytes makes the filter gradient run unsplit (correct, less parallel).
Status RunConv(const ConvParams& p, CudaOp op, DT in, DT out, int64_t algo, const void* a, const void* b,
               const void* bias, void* out_buf, void* scratch, size_t scratch_bytes, cudaStream_t stream);

// The families' predicates are in algorithms.h.

// ---- direct.cu: every configuration ----
cudaError_t DirectFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias, void* y,
                      cudaStream_t s);
cudaError_t DirectDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx, cudaStream_t s);
int64_t DirectWgradSplits(const ConvParams& p, DT in);  // 1: no scratch
cudaError_t DirectWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw, void* scratch,
                        int64_t splits, cudaStream_t s);

// ---- depthwise.cu: groups == c == k, batch_groups == 1 ----
cudaError_t DepthwiseFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias, void* y,
                         cudaStream_t s);
cudaError_t DepthwiseDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
                           cudaStream_t s);
int64_t DepthwiseWgradSplits(const ConvParams& p, DT in);
cudaError_t DepthwiseWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw, void* scratch,
                           int64_t splits, cudaStream_t s);

// depthwise_reg.cu: the register-stencil forward, data and filter gradients (channels-last 1-D/2-D, f32/bf16/f16, c a
// multiple of 4, no dilation; data gradients of stride 1 or 2); DepthwiseFwd / DepthwiseDgrad / DepthwiseWgrad try
// them first. *launched false: not taken.
cudaError_t DepthwiseRegFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t DepthwiseRegDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);
// Its filter gradient: the splits it plans (0: not taken), and the run (then the split partials in scratch,
// reduced into dw).
int64_t DepthwiseRegWgradSplits(const ConvParams& p, DT in);
cudaError_t DepthwiseRegWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw,
                              void* scratch, int64_t splits, cudaStream_t s, bool* launched);

// depthwise_tma_sm90.cu: the Hopper 3x3 forward and unit-stride data gradient (channels-last 2-D, stride 1 or 2,
// c * sizeof(T) % 16 == 0, sm_90a builds on a 9.0 device); DepthwiseFwd / DepthwiseDgrad try it before the register
// stencil. *launched false: not taken.
cudaError_t DepthwiseTmaFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t DepthwiseTmaDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);

// depthwise_mma.cu: the tensor-core 7x7 forward, unit-stride data gradient and filter gradient (channels-last 2-D,
// unit strides, 16-bit data, c a multiple of 8, sm_80+); DepthwiseFwd / DepthwiseDgrad try it after the TMA kernel,
// DepthwiseWgrad first. *launched false: not taken. DepthwiseMmaWgradSplits: 0 when it does not take the problem.
cudaError_t DepthwiseMmaFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t DepthwiseMmaDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);
int64_t DepthwiseMmaWgradSplits(const ConvParams& p, DT in);
cudaError_t DepthwiseMmaWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw,
                              void* scratch, int64_t splits, cudaStream_t s, bool* launched);

// ---- conv1d_long.cu: one spatial dim, stride/dilations 1, few channels, long window ----
cudaError_t Long1DFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias, void* y,
                      cudaStream_t s);
cudaError_t Long1DDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx, cudaStream_t s);
int64_t Long1DWgradSplits(const ConvParams& p, DT in);
cudaError_t Long1DWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw, void* scratch,
                        int64_t splits, cudaStream_t s);

// ---- small_channel.cu: channels-last, groups == batch_groups == 1, 1 <= c <= 16, 1 <= k <= 64 ----
// fwd/dgrad fall back to the direct kernels internally when the staged filter does not fit in shared memory.
cudaError_t SmallChannelFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s);
cudaError_t SmallChannelDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
                              cudaStream_t s);
// wgrad always uses scratch: chunks * WElements accumulators (chunks from SmallChannelWgradChunks: spatial
// tiles on the tiled path, position chunks on the gather path); without enough scratch it falls back to the
// direct wgrad without split.
int64_t SmallChannelWgradChunks(const ConvParams& p, DT in);
cudaError_t SmallChannelWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw,
                              void* scratch, size_t scratch_bytes, cudaStream_t s);

// ---- plane_stencil.cu: c == k == 1 2-D stencils (unit stride, "same" column padding, width % 8 == 0; see the
// file); the small-channel family's fast path. *launched false: not taken (the caller runs its own kernels). ----
bool PlaneStencilApplies(const ConvParams& p, DT in);
cudaError_t PlaneStencilFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
                            void* y, cudaStream_t s, bool* launched);
cudaError_t PlaneStencilDgrad(const ConvParams& p, DT in, DT out, const void* dy, const void* w, void* dx,
                              cudaStream_t s, bool* launched);
// wgrad writes PlaneWgradBlocks(p) partial filters (f32, win taps each) to `partials`; the caller reduces them.
int64_t PlaneWgradBlocks(const ConvParams& p);
cudaError_t PlaneStencilWgrad(const ConvParams& p, DT in, const void* x, const void* dy, float* partials,
                              cudaStream_t s, bool* launched);

// c -> 1 forward (k == 1, 2 <= c, channels-last, 3x3, unit stride, c / (one 8- or 16-byte vector) a power of two
// <= 32), the same file; *launched as above.
bool ReduceStencilApplies(const ConvParams& p, DT in);
cudaError_t ReduceStencilFwd(const ConvParams& p, DT in, DT out, const void* x, const void* w, const void* bias,
                             void* y, cudaStream_t s, bool* launched);

// c -> 1 filter gradient (k == 1, channels-last 2-D, c % 4 == 0, 3x3, any stride, dilation and padding), the same
// file; taken by the direct family. COneWgradSplits: its splits (0: not applicable), which size the direct family's
// workspace; COneWgrad runs only with that many (*launched false otherwise).
int64_t COneWgradSplits(const ConvParams& p, DT in);
cudaError_t COneWgrad(const ConvParams& p, DT in, DT out, const void* x, const void* dy, void* dw, void* scratch,
                      int64_t splits, cudaStream_t s, bool* launched);

// Compute capability (major * 10 + minor) of the current device, 0 if unknown (implicit_gemm.cu).
int DeviceArch();
// Multiprocessors of the current device, an H100's count (kPlanSms) if unknown (implicit_gemm.cu).
int64_t MultiprocessorCount();
// The dynamic shared memory a block of the current device may opt into, 48 KiB if unknown (implicit_gemm.cu). All
// three cached per device.
size_t SharedMemPerBlockOptin();

// ---- implicit_gemm.cu: tensor cores through CUTLASS (igemm.h), ImplicitGemmApplies in algorithms.h ----
// algo: kAlgoImplicitGemm (the Hopper kernels where they apply, else mma.sync) or kAlgoImplicitGemmSm80.
size_t ImplicitGemmWorkspaceBytes(const ConvParams& p, CudaOp op, DT in, int64_t algo);
// With a workspace shorter than ImplicitGemmWorkspaceBytes, or for a problem no tensor-core kernel takes, the
// op runs on the direct kernels.
cudaError_t ImplicitGemmRun(const ConvParams& p, CudaOp op, DT in, DT out, int64_t algo, const void* a,
                            const void* b, const void* bias, void* out_buf, void* workspace,
                            size_t workspace_bytes, cudaStream_t s);

// ---- shared: out[e] = sum_{s < splits} scratch[s * count + e] in fixed order (direct.cu) ----
cudaError_t ReduceSplits(DT in, DT out, const void* scratch, int64_t splits, int64_t count, void* dst,
                         cudaStream_t s);
// ... for a float32 forward split over its reduction, (m, k) row-major: dst[e] = act(sum + bias[e % k]), bias may be
// null (direct.cu).
cudaError_t ReduceSplitsBiasAct(const float* scratch, int64_t splits, int64_t count, int64_t k, const float* bias,
                                int64_t act, float* dst, cudaStream_t s);

}  // namespace cuda
}  // namespace jaxconv
