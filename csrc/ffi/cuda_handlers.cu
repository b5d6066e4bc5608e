// CUDA handlers for jaxconv_fwd / jaxconv_dgrad / jaxconv_wgrad (platform "CUDA").
// Each handler validates everything first (DecodeAndValidate), then only enqueues work on XLA's stream: no
// cudaMalloc, no synchronisation, no stream queries. Every CUDA call is checked (cudaGetLastError after each
// launch) and reported as ffi::Error::Internal.
// Command buffers: fwd and dgrad only launch kernels on buffers XLA passes, so they carry kCmdBufferCompatible.
// wgrad may take device scratch from the ScratchAllocator (split-K partial sums); XLA's trait documentation asks
// compatible handlers to use only the buffers passed as arguments, so wgrad is not marked.
#include <cuda_runtime.h>

#include <mutex>
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

// Multiprocessor count of the current device (cached per device; attribute queries are not stream work).
ffi::Error GetSmCount(int* sms) {
  constexpr int kMaxDevices = 64;
  static int cache[kMaxDevices] = {0};
  static std::mutex mu;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return CudaErr("cudaGetDevice", e);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (dev >= 0 && dev < kMaxDevices && cache[dev] > 0) {
      *sms = cache[dev];
      return ffi::Error::Success();
    }
  }
  int v = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) {
    return CudaErr("cudaDeviceGetAttribute", e);
  }
  if (v <= 0) v = 1;
  std::lock_guard<std::mutex> lock(mu);
  if (dev >= 0 && dev < kMaxDevices) cache[dev] = v;
  *sms = v;
  return ffi::Error::Success();
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

// Shared body. `scratch_alloc` is null for the handlers that never need scratch (fwd, dgrad).
ffi::Error Run(Op op, cudaStream_t stream, ffi::ScratchAllocator* scratch_alloc, const ffi::AnyBuffer& a,
               const ffi::AnyBuffer& b, const ffi::AnyBuffer* bias, ffi::AnyBuffer out,
               ffi::Span<const int64_t> params) {
  ConvParams p;
  if (auto e = DecodeAndValidate(op, params, a, b, bias, out, &p); e.failure()) return e;
  const CudaOp cop = op == Op::kFwd ? CudaOp::kFwd : op == Op::kDgrad ? CudaOp::kDgrad : CudaOp::kWgrad;
  const DT in = ToDT(a.element_type()), odt = ToDT(out.element_type());
  int64_t algo = 0;
  if (auto st = cuda::ChooseAlgorithm(p, cop, &algo); !st.ok()) return ToFfi(op, st);

  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  int sms = 1;
  if (scratch_alloc != nullptr) {
    if (auto e = GetSmCount(&sms); e.failure()) return e;
    scratch_bytes = cuda::ScratchBytes(p, cop, in, algo, sms);
    if (scratch_bytes > 0) {
      auto mem = scratch_alloc->Allocate(scratch_bytes, 256);
      if (!mem.has_value() || *mem == nullptr) {
        scratch_bytes = 0;  // RunConv then runs without split-K (still correct, less parallel)
      } else {
        scratch = *mem;
      }
    }
  }
  if (p.poison[0]) {
    if (auto e = Poison(out.untyped_data(), out.size_bytes(), stream); e.failure()) return e;
    if (auto e = Poison(scratch, scratch_bytes, stream); e.failure()) return e;
  }
  const void* bias_ptr = (bias != nullptr && p.has_bias[0]) ? bias->untyped_data() : nullptr;
  auto st = cuda::RunConv(p, cop, in, odt, algo, a.untyped_data(), b.untyped_data(), bias_ptr, out.untyped_data(),
                          scratch, scratch_bytes, sms, stream);
  if (!st.ok()) return ToFfi(op, st);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaErr(OpName(op), e);
  return ffi::Error::Success();
}

ffi::Error FwdImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias,
                   ffi::Result<ffi::AnyBuffer> y, ffi::Span<const int64_t> params) {
  return Run(Op::kFwd, stream, nullptr, x, w, &bias, *y, params);
}

ffi::Error DgradImpl(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                     ffi::Span<const int64_t> params) {
  return Run(Op::kDgrad, stream, nullptr, dy, w, nullptr, *dx, params);
}

ffi::Error WgradImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x, ffi::AnyBuffer dy,
                     ffi::Result<ffi::AnyBuffer> dw, ffi::Span<const int64_t> params) {
  return Run(Op::kWgrad, stream, &scratch, x, dy, nullptr, *dw, params);
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
                                  .Attr<xla::ffi::Span<const int64_t>>("params"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvDgradCuda, jaxconv::DgradImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<xla::ffi::Span<const int64_t>>("params"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvWgradCuda, jaxconv::WgradImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::ScratchAllocator>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<xla::ffi::Span<const int64_t>>("params"));
