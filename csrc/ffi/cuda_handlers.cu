// CUDA handlers for jaxconv_fwd / jaxconv_dgrad / jaxconv_wgrad (platform "CUDA").
// Each handler validates everything first (DecodeAndValidate), confirms the variant the lowering chose on the device
// it runs on (the registry chooses again, within the workspace it was given, if that variant does not apply here: a
// program compiled for another GPU), then only enqueues work on XLA's stream: no cudaMalloc, no synchronisation, no
// stream queries. Every CUDA call is checked (cudaGetLastError after each launch) and reported as ffi::Error.
// Command buffers: every handler only launches kernels on buffers XLA passes (split-K partial sums and staging live in
// a workspace result that the lowering sizes), so all three carry kCmdBufferCompatible. The FFI scratch allocator
// is not used: on jaxlib 0.11's CUDA plugin it returned no memory for any request.
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dispatch/registry.h"
#include "ffi/ffi_common.h"
#include "kernels/shared/kernels.h"
#include "xla/ffi/api/ffi.h"

namespace jaxconv {
namespace {

namespace ffi = xla::ffi;

ffi::Error CudaErr(Op op, const char* what, cudaError_t e) {
  return ffi::Error::Internal(std::string(TargetName(op)) + ": " + what + ": " + cudaGetErrorString(e));
}

// The variant to run: the lowering's choice where it applies on this device and fits the workspace, else the
// registry's choice for the same request within that workspace.
ffi::Error ChooseVariant(Op op, const Problem& pr, size_t ws_bytes, int* index) {
  const int64_t request = pr.p.algorithm[0];
  if (RequestName(request).empty()) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": invalid params.algorithm = " +
                                       std::to_string(request));
  }
  const int chosen = static_cast<int>(pr.p.variant[0]);
  if (chosen >= 0 && chosen < NumVariants() && !LoweredByXla(chosen) && Selects(request, chosen) &&
      VariantError(chosen, pr).empty() && VariantAt(chosen).workspace(pr) <= ws_bytes) {
    *index = chosen;
    return ffi::Error::Success();
  }
  std::string why;
  *index = Resolve(pr, request, &why, ws_bytes, /*launchable=*/true);
  if (*index < 0) return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": " + why);
  return ffi::Error::Success();
}

// ChooseVariant, remembered per (params, op, dtypes, device, workspace size): the choice is a pure function of them,
// and a call that only launches a few microseconds of work must not evaluate predicates every time.
ffi::Error PickVariant(Op op, const Problem& pr, size_t ws_bytes, int* index) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return ChooseVariant(op, pr, ws_bytes, index);
  }
  const int64_t tail[5] = {static_cast<int64_t>(op), static_cast<int64_t>(pr.in), static_cast<int64_t>(pr.out),
                           device, static_cast<int64_t>(ws_bytes)};
  std::string key(reinterpret_cast<const char*>(&pr.p), sizeof(pr.p));
  key.append(reinterpret_cast<const char*>(tail), sizeof(tail));
  static std::mutex mu;
  static std::unordered_map<std::string, int> chosen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = chosen.find(key); it != chosen.end()) {
      *index = it->second;
      return ffi::Error::Success();
    }
  }
  if (auto e = ChooseVariant(op, pr, ws_bytes, index); e.failure()) return e;
  std::lock_guard<std::mutex> lock(mu);
  if (chosen.size() < 100000) chosen.emplace(std::move(key), *index);  // bounded: programs have few distinct calls
  return ffi::Error::Success();
}

// Shared body. `workspace` is every op's second result (split-K partial sums, staging), sized by the lowering with the
// chosen variant's Workspace.
ffi::Error Run(Op op, cudaStream_t stream, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
               const ffi::AnyBuffer* bias, ffi::AnyBuffer out, ffi::AnyBuffer workspace,
               ffi::Span<const int64_t> params) {
  Problem pr;
  if (auto e = DecodeAndValidate(op, params, a, b, bias, out, &pr.p); e.failure()) return e;
  if (workspace.element_type() != ffi::DataType::U8 || workspace.dimensions().size() != 1) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": workspace must be a 1-D u8 buffer");
  }
  pr.op = op;
  ToDType(a.element_type(), &pr.in);
  ToDType(out.element_type(), &pr.out);
  pr.dev = cuda::CurrentDevice();
  if (pr.p.poison[0]) {
    if (cudaError_t e = cudaMemsetAsync(out.untyped_data(), 0xFF, out.size_bytes(), stream); e != cudaSuccess) {
      return CudaErr(op, "poison memset", e);
    }
  }
  switch (EmptyOpOf(op, pr.p, a, b, out)) {
    case EmptyOp::kNothingToWrite: return ffi::Error::Success();
    case EmptyOp::kZeros:
      if (cudaError_t e = cudaMemsetAsync(out.untyped_data(), 0, out.size_bytes(), stream); e != cudaSuccess) {
        return CudaErr(op, "zero fill", e);
      }
      return ffi::Error::Success();
    default: break;
  }
  int index = -1;
  if (auto e = PickVariant(op, pr, workspace.size_bytes(), &index); e.failure()) return e;
  Buffers buf;
  buf.a = a.untyped_data();
  buf.b = b.untyped_data();
  buf.bias = (bias != nullptr && pr.p.has_bias[0]) ? bias->untyped_data() : nullptr;
  buf.out = out.untyped_data();
  buf.ws = workspace.untyped_data();
  buf.ws_bytes = workspace.size_bytes();
  if (pr.p.poison[0] && buf.ws_bytes > 0) {
    if (cudaError_t e = cudaMemsetAsync(buf.ws, 0xFF, buf.ws_bytes, stream); e != cudaSuccess) {
      return CudaErr(op, "poison memset", e);
    }
  }
  if (cudaError_t e = VariantAt(index).launch(pr, buf, stream); e != cudaSuccess) {
    return CudaErr(op, VariantAt(index).name, e);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaErr(op, VariantAt(index).name, e);
  return ffi::Error::Success();
}

ffi::Error FwdImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias,
                   ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> workspace,
                   ffi::Span<const int64_t> params) {
  return Run(Op::kFwd, stream, x, w, &bias, *y, *workspace, params);
}

ffi::Error DgradImpl(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                     ffi::Result<ffi::AnyBuffer> workspace, ffi::Span<const int64_t> params) {
  return Run(Op::kDgrad, stream, dy, w, nullptr, *dx, *workspace, params);
}

ffi::Error WgradImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dw,
                     ffi::Result<ffi::AnyBuffer> workspace, ffi::Span<const int64_t> params) {
  return Run(Op::kWgrad, stream, x, dy, nullptr, *dw, *workspace, params);
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
