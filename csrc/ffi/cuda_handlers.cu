// CUDA handlers for jaxconv_fwd / jaxconv_dgrad / jaxconv_wgrad (platform "CUDA").
// Each handler validates everything first (DecodeAndValidate), then only enqueues work on XLA's stream: no
// cudaMalloc, no synchronisation, no stream queries. Every CUDA call is checked (cudaGetLastError after each
// launch) and reported as ffi::Error::Internal.
// Command buffers: every handler only launches kernels on buffers XLA passes (wgrad's split-K partial sums live in
// a workspace result that the lowering sizes), so all three carry kCmdBufferCompatible. The FFI scratch allocator
// is not used: on jaxlib 0.11's CUDA plugin it returned no memory for any request.
#include <cuda_runtime.h>

#include <string>

#include "cuda/kernels.h"
#include "ffi/ffi_common.h"
#include "xla/ffi/api/ffi.h"

namespace jaxconv {
namespace {

namespace ffi = xla::ffi;
using cuda::CudaOp;
using cuda::DT;

ffi::Error CudaErr(const char* what, cudaError_t e) {
  return ffi::Error::Internal(std::string("jaxconv CUDA: ") + what + ": " + cudaGetErrorString(e));
}

DT ToDT(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F64: return DT::kF64;
    case ffi::DataType::BF16: return DT::kBF16;
    case ffi::DataType::F16: return DT::kF16;
    default: return DT::kF32;
  }
}

ffi::Error Poison(void* ptr, size_t bytes, cudaStream_t stream) {
  if (ptr == nullptr || bytes == 0) return ffi::Error::Success();
  if (cudaError_t e = cudaMemsetAsync(ptr, 0xFF, bytes, stream); e != cudaSuccess) return CudaErr("poison memset", e);
  return ffi::Error::Success();
}

ffi::Error ToFfi(const Op op, const cuda::Status& st) {
  if (st.ok()) return ffi::Error::Success();
  const std::string msg = std::string(OpName(op)) + ": " + st.msg;
  return st.code == 1 ? ffi::Error::InvalidArgument(msg) : ffi::Error::Internal(msg);
}

// Shared body. `workspace` is every op's second result (split-K partial sums, the tensor-core path's layout
// conversions), sized by the lowering with the extension's workspace_bytes (the same WorkspaceBytes as here).
ffi::Error Run(Op op, cudaStream_t stream, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
               const ffi::AnyBuffer* bias, ffi::AnyBuffer out, ffi::AnyBuffer* workspace,
               ffi::Span<const int64_t> params) {
  ConvParams p;
  if (auto e = DecodeAndValidate(op, params, a, b, bias, out, &p); e.failure()) return e;
  const CudaOp cop = op == Op::kFwd ? CudaOp::kFwd : op == Op::kDgrad ? CudaOp::kDgrad : CudaOp::kWgrad;
  const DT in = ToDT(a.element_type()), odt = ToDT(out.element_type());
  int64_t algo = 0;
  if (auto st = cuda::ChooseAlgorithm(p, cop, in, odt, &algo); !st.ok()) return ToFfi(op, st);

  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  if (workspace != nullptr) {
    if (workspace->element_type() != ffi::DataType::U8 || workspace->dimensions().size() != 1) {
      return ffi::Error::InvalidArgument(std::string(OpName(op)) + ": workspace must be a 1-D u8 buffer");
    }
    // A workspace shorter than the plan (say, from a program exported by another jaxconv version) makes
    // RunConv take a path that needs less (the unsplit filter gradient, the direct kernels): correct, slower.
    if (workspace->size_bytes() >= cuda::ScratchBytes(p, cop, in, algo)) {
      scratch = workspace->untyped_data();
      scratch_bytes = workspace->size_bytes();
    }
  }
  if (p.poison[0]) {
    if (auto e = Poison(out.untyped_data(), out.size_bytes(), stream); e.failure()) return e;
    if (auto e = Poison(scratch, scratch_bytes, stream); e.failure()) return e;
  }
  const void* bias_ptr = (bias != nullptr && p.has_bias[0]) ? bias->untyped_data() : nullptr;
  auto st = cuda::RunConv(p, cop, in, odt, algo, a.untyped_data(), b.untyped_data(), bias_ptr, out.untyped_data(),
                          scratch, scratch_bytes, stream);
  if (!st.ok()) return ToFfi(op, st);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaErr(OpName(op), e);
  return ffi::Error::Success();
}

ffi::Error FwdImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias,
                   ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> workspace,
                   ffi::Span<const int64_t> params) {
  return Run(Op::kFwd, stream, x, w, &bias, *y, &(*workspace), params);
}

ffi::Error DgradImpl(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                     ffi::Result<ffi::AnyBuffer> workspace, ffi::Span<const int64_t> params) {
  return Run(Op::kDgrad, stream, dy, w, nullptr, *dx, &(*workspace), params);
}

ffi::Error WgradImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dw,
                     ffi::Result<ffi::AnyBuffer> workspace, ffi::Span<const int64_t> params) {
  return Run(Op::kWgrad, stream, x, dy, nullptr, *dw, &(*workspace), params);
}

}  // namespace
}  // namespace jaxconv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvFwdCuda, jaxconv::FwdImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()  // workspace (u8), see Run
                                  .Attr<xla::ffi::Span<const int64_t>>("params"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvDgradCuda, jaxconv::DgradImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()  // workspace (u8), see Run
                                  .Attr<xla::ffi::Span<const int64_t>>("params"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvWgradCuda, jaxconv::WgradImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()  // dw
                                  .Ret<xla::ffi::AnyBuffer>()  // workspace (u8), see Run
                                  .Attr<xla::ffi::Span<const int64_t>>("params"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
