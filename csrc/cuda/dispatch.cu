// The one place that picks the algorithm for an op and routes to the kernel family.
#include "algorithms.h"
#include "cuda/common.cuh"

namespace jaxconv {
namespace cuda {

namespace {
int DtBytes(DT t) { return t == DT::kF64 ? 8 : t == DT::kF32 ? 4 : 2; }
}  // namespace

Status ChooseAlgorithm(const ConvParams& p, CudaOp op, DT in, DT out, int64_t* algo) {
  Status st;
  // algorithms.h: the predicates, shared with the Python layer
  *algo = ResolveAlgorithm(p, ElemBytes{DtBytes(in), DtBytes(out)}, &st.msg);
  if (*algo < 0) st.code = 1;
  return st;
}

size_t ScratchBytes(const ConvParams& p, CudaOp op, DT in, int64_t algo) {
  if (algo == kAlgoImplicitGemm || algo == kAlgoImplicitGemmSm80) return ImplicitGemmWorkspaceBytes(p, op, in, algo);
  if (op != CudaOp::kWgrad) return 0;
  if (algo == kAlgoSmallChannel) {  // always scratch (one partial vector per chunk), even for one chunk
    return static_cast<size_t>(SmallChannelWgradChunks(p, in)) * static_cast<size_t>(WElements(p)) * AccBytes(in);
  }
  int64_t splits = 1;
  switch (algo) {
    case kAlgoDepthwise: splits = DepthwiseWgradSplits(p, in); break;
    case kAlgoLong1D: splits = Long1DWgradSplits(p, in); break;
    default: splits = DirectWgradSplits(p, in); break;
  }
  if (splits <= 1) return 0;
  return static_cast<size_t>(splits) * static_cast<size_t>(WElements(p)) * AccBytes(in);
}

size_t WorkspaceBytes(const ConvParams& p, CudaOp op, DT in, DT out) {
  int64_t algo = 0;
  if (!ChooseAlgorithm(p, op, in, out, &algo).ok()) return 0;
  return ScratchBytes(p, op, in, algo);
}

Status RunConv(const ConvParams& p, CudaOp op, DT in, DT out, int64_t algo, const void* a, const void* b,
               const void* bias, void* out_buf, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  Status st;
  cudaError_t e = cudaSuccess;
  if (algo == kAlgoImplicitGemm || algo == kAlgoImplicitGemmSm80) {
    e = ImplicitGemmRun(p, op, in, out, algo, a, b, bias, out_buf, scratch, scratch_bytes, stream);
    if (e != cudaSuccess) {
      st.code = 2;
      st.msg = std::string("CUDA error: ") + cudaGetErrorString(e);
    }
    return st;
  }
  switch (op) {
    case CudaOp::kFwd:
      e = algo == kAlgoSmallChannel ? SmallChannelFwd(p, in, out, a, b, bias, out_buf, stream)
          : algo == kAlgoDepthwise ? DepthwiseFwd(p, in, out, a, b, bias, out_buf, stream)
          : algo == kAlgoLong1D  ? Long1DFwd(p, in, out, a, b, bias, out_buf, stream)
                                 : DirectFwd(p, in, out, a, b, bias, out_buf, stream);
      break;
    case CudaOp::kDgrad:
      e = algo == kAlgoSmallChannel ? SmallChannelDgrad(p, in, out, a, b, out_buf, stream)
          : algo == kAlgoDepthwise ? DepthwiseDgrad(p, in, out, a, b, out_buf, stream)
          : algo == kAlgoLong1D  ? Long1DDgrad(p, in, out, a, b, out_buf, stream)
                                 : DirectDgrad(p, in, out, a, b, out_buf, stream);
      break;
    case CudaOp::kWgrad: {
      if (algo == kAlgoSmallChannel) {
        e = SmallChannelWgrad(p, in, out, a, b, out_buf, scratch, scratch_bytes, stream);
        break;
      }
      // Same split count as ScratchBytes computed; fall back to no split if the scratch is missing/short.
      int64_t splits = algo == kAlgoDepthwise ? DepthwiseWgradSplits(p, in)
                       : algo == kAlgoLong1D  ? Long1DWgradSplits(p, in)
                                              : DirectWgradSplits(p, in);
      const size_t need = splits > 1 ? static_cast<size_t>(splits) * WElements(p) * AccBytes(in) : 0;
      if (scratch == nullptr || scratch_bytes < need) splits = 1;
      e = algo == kAlgoDepthwise ? DepthwiseWgrad(p, in, out, a, b, out_buf, scratch, splits, stream)
          : algo == kAlgoLong1D  ? Long1DWgrad(p, in, out, a, b, out_buf, scratch, splits, stream)
                                 : DirectWgrad(p, in, out, a, b, out_buf, scratch, splits, stream);
      break;
    }
  }
  if (e != cudaSuccess) {
    st.code = 2;
    st.msg = std::string("CUDA error: ") + cudaGetErrorString(e);
  }
  return st;
}

}  // namespace cuda
}  // namespace jaxconv
