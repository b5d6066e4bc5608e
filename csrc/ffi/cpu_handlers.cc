// XLA FFI handlers for the CPU platform: decode and validate everything (DecodeAndValidate), then run the
// kernels of csrc/cpu/conv_cpu.h (floating types) or csrc/cpu/conv_int.h (integer and bool types, forward only).
// Any problem is returned as an ffi::Error; nothing is written before the buffers have been checked against the
// params.
#include <cstring>
#include <string>

#include "cpu/conv_cpu.h"
#include "cpu/conv_int.h"
#include "ffi/ffi_common.h"
#include "xla/ffi/api/ffi.h"

namespace jaxconv {
namespace {

// The float kernels' element types (conv_cpu.h); integer and bool operands go to conv_int.h.
bool ToFloatDType(ffi::DataType t, DType* out) { return ToDType(t, out) && IsFloat(*out); }

// Validates everything; then either the float kernels' dtypes (*int_op false) or an integer op (*int_op true: the
// core dtypes are read from the buffers by the caller).
ffi::Error Prepare(Op op, ffi::Span<const int64_t> params, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                   const ffi::AnyBuffer* bias, const ffi::AnyBuffer& out, ConvParams* p, cpu::DType* in_t,
                   cpu::DType* out_t, bool* int_op) {
  if (auto e = DecodeAndValidate(op, params, a, b, bias, out, p); e.failure()) return e;
  DType core_in;
  ToDType(a.element_type(), &core_in);  // DecodeAndValidate accepted it
  *int_op = IsInteger(core_in);
  if (!*int_op && (!ToFloatDType(a.element_type(), in_t) || !ToFloatDType(out.element_type(), out_t))) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": unsupported dtype");
  }
  if (p->poison[0] == 1 && out.size_bytes() > 0) std::memset(out.untyped_data(), 0xFF, out.size_bytes());
  return ffi::Error::Success();
}

// True when the op is done without a kernel (EmptyOpOf): then the result is written here.
bool DoneWithoutKernel(Op op, const ConvParams& p, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                       ffi::AnyBuffer out) {
  const EmptyOp e = EmptyOpOf(op, p, a, b, out);
  if (e == EmptyOp::kZeros) std::memset(out.untyped_data(), 0, out.size_bytes());
  return e != EmptyOp::kNo;
}

ffi::Error Finish(Op op, const std::string& err) {
  if (err.empty()) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(TargetName(op)) + ": " + err);
}

ffi::Error FwdCpu(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y,
                  ffi::Span<const int64_t> params) {
  ConvParams p;
  cpu::DType in_t, out_t;
  bool int_op = false;
  if (auto e = Prepare(Op::kFwd, params, x, w, &bias, *y, &p, &in_t, &out_t, &int_op); e.failure()) return e;
  if (DoneWithoutKernel(Op::kFwd, p, x, w, *y)) return ffi::Error::Success();
  if (int_op) {
    DType in_d, out_d;
    ToDType(x.element_type(), &in_d);
    ToDType(y->element_type(), &out_d);
    return Finish(Op::kFwd, cpu::ConvIntFwd(p, in_d, x.untyped_data(), w.untyped_data(), out_d, y->untyped_data()));
  }
  return Finish(Op::kFwd, cpu::ConvFwd(p, in_t, x.untyped_data(), w.untyped_data(), out_t,
                                       p.has_bias[0] ? bias.untyped_data() : nullptr, y->untyped_data()));
}

ffi::Error DgradCpu(ffi::AnyBuffer dy, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> dx,
                    ffi::Span<const int64_t> params) {
  ConvParams p;
  cpu::DType in_t, out_t;
  bool int_op = false;  // DecodeAndValidate refuses integer dgrads
  if (auto e = Prepare(Op::kDgrad, params, dy, w, nullptr, *dx, &p, &in_t, &out_t, &int_op); e.failure()) return e;
  if (DoneWithoutKernel(Op::kDgrad, p, dy, w, *dx)) return ffi::Error::Success();
  return Finish(Op::kDgrad,
                cpu::ConvDgrad(p, in_t, dy.untyped_data(), w.untyped_data(), out_t, dx->untyped_data()));
}

ffi::Error WgradCpu(ffi::AnyBuffer x, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dw,
                    ffi::Span<const int64_t> params) {
  ConvParams p;
  cpu::DType in_t, out_t;
  bool int_op = false;  // DecodeAndValidate refuses integer wgrads
  if (auto e = Prepare(Op::kWgrad, params, x, dy, nullptr, *dw, &p, &in_t, &out_t, &int_op); e.failure()) return e;
  if (DoneWithoutKernel(Op::kWgrad, p, x, dy, *dw)) return ffi::Error::Success();
  return Finish(Op::kWgrad,
                cpu::ConvWgrad(p, in_t, x.untyped_data(), dy.untyped_data(), out_t, dw->untyped_data()));
}

}  // namespace
}  // namespace jaxconv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvFwdCpu, jaxconv::FwdCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // x
                                  .Arg<xla::ffi::AnyBuffer>()  // w
                                  .Arg<xla::ffi::AnyBuffer>()  // bias (k or 0 elements)
                                  .Ret<xla::ffi::AnyBuffer>()  // y
                                  .Attr<xla::ffi::Span<const int64_t>>("params"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvDgradCpu, jaxconv::DgradCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // dy
                                  .Arg<xla::ffi::AnyBuffer>()  // w
                                  .Ret<xla::ffi::AnyBuffer>()  // dx
                                  .Attr<xla::ffi::Span<const int64_t>>("params"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvWgradCpu, jaxconv::WgradCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()  // x
                                  .Arg<xla::ffi::AnyBuffer>()  // dy
                                  .Ret<xla::ffi::AnyBuffer>()  // dw
                                  .Attr<xla::ffi::Span<const int64_t>>("params"));
