// Decoding and validation shared by the CPU and CUDA handlers: the handlers trust nothing XLA passes them and
// return ffi::Error before any kernel runs if the params and buffers disagree.
#pragma once

#include <cstdint>
#include <string>

#include "core/conv_params.h"
#include "core/types.h"
#include "xla/ffi/api/ffi.h"

namespace jaxconv {

namespace ffi = xla::ffi;

// The custom-call target of an op, for error messages.
inline const char* TargetName(Op op) {
  switch (op) {
    case Op::kFwd: return "jaxconv_fwd";
    case Op::kDgrad: return "jaxconv_dgrad";
    default: return "jaxconv_wgrad";
  }
}

// The element type of a buffer, false for types the ops do not take.
inline bool ToDType(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::kF32; return true;
    case ffi::DataType::F64: *out = DType::kF64; return true;
    case ffi::DataType::BF16: *out = DType::kBF16; return true;
    case ffi::DataType::F16: *out = DType::kF16; return true;
    case ffi::DataType::S8: *out = DType::kI8; return true;
    case ffi::DataType::S16: *out = DType::kI16; return true;
    case ffi::DataType::S32: *out = DType::kI32; return true;
    case ffi::DataType::S64: *out = DType::kI64; return true;
    case ffi::DataType::U8: *out = DType::kU8; return true;
    case ffi::DataType::U16: *out = DType::kU16; return true;
    case ffi::DataType::U32: *out = DType::kU32; return true;
    case ffi::DataType::U64: *out = DType::kU64; return true;
    case ffi::DataType::PRED: *out = DType::kPred; return true;
    default: return false;
  }
}
inline bool IsFloatType(ffi::DataType t) {
  DType d;
  return ToDType(t, &d) && IsFloat(d);
}

inline std::string DimsString(ffi::Span<const int64_t> d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

inline ffi::Error CheckBuffer(const ConvParams& p, Op op, Tensor t, const char* name, const ffi::AnyBuffer& buf) {
  int64_t dims[5];
  const int rank = ExpectedDims(p, t, dims);
  auto got = buf.dimensions();
  bool ok = static_cast<int>(got.size()) == rank;
  for (int i = 0; ok && i < rank; ++i) ok = got[i] == dims[i];
  if (!ok) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": buffer " + name + " has shape " +
                                       DimsString(got) + ", expected " +
                                       DimsString(ffi::Span<const int64_t>(dims, rank)));
  }
  return ffi::Error::Success();
}

// Validates params and the operand/result buffers of one op. `a`, `b` are the operands in the op's order
// (fwd: x, w; dgrad: dy, w; wgrad: x, dy), `out` the result; `bias` is fwd's third operand (else nullptr).
inline ffi::Error DecodeAndValidate(Op op, ffi::Span<const int64_t> values, const ffi::AnyBuffer& a,
                                    const ffi::AnyBuffer& b, const ffi::AnyBuffer* bias,
                                    const ffi::AnyBuffer& out, ConvParams* p) {
  std::string err = DecodeParams(values.begin(), static_cast<int64_t>(values.size()), p);
  if (!err.empty()) return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": " + err);
  const Tensor ta = op == Op::kDgrad ? Tensor::kY : Tensor::kX;
  const Tensor tb = op == Op::kWgrad ? Tensor::kY : Tensor::kW;
  const Tensor tout = op == Op::kFwd ? Tensor::kY : op == Op::kDgrad ? Tensor::kX : Tensor::kW;
  const char* na = op == Op::kDgrad ? "dy" : "x";
  const char* nb = op == Op::kWgrad ? "dy" : "w";
  const char* nout = op == Op::kFwd ? "y" : op == Op::kDgrad ? "dx" : "dw";
  if (auto e = CheckBuffer(*p, op, ta, na, a); e.failure()) return e;
  if (auto e = CheckBuffer(*p, op, tb, nb, b); e.failure()) return e;
  if (auto e = CheckBuffer(*p, op, tout, nout, out); e.failure()) return e;
  const ffi::DataType in_t = a.element_type(), out_t = out.element_type();
  DType in_d, out_d;
  if (!ToDType(in_t, &in_d) || b.element_type() != in_t) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": operands " + na + " and " + nb +
                                       " must share one dtype of f32, f64, bf16, f16, an integer type or bool");
  }
  if (!ToDType(out_t, &out_d) || !ValidDTypePair(in_d, out_d)) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": result " + nout +
                                       (IsFloat(in_d) ? " must have the operands' dtype or f32"
                                                      : " must have an integer or bool dtype for integer operands"));
  }
  if (IsInteger(in_d) && op != Op::kFwd) {  // lax has no gradients of integer convolutions, nor do the kernels
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": integer operands run the forward op only");
  }
  if (IsInteger(in_d) && (p->has_bias[0] != 0 || p->activation[0] != kActNone)) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": integer convolutions take no bias or activation");
  }
  if (op != Op::kFwd && (p->has_bias[0] != 0 || p->activation[0] != kActNone)) {
    return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": bias/activation apply to fwd only");
  }
  if (bias != nullptr) {
    const int64_t want = p->has_bias[0] ? p->k[0] : 0;
    if (bias->dimensions().size() != 1 || bias->dimensions()[0] != want || bias->element_type() != out_t) {
      return ffi::Error::InvalidArgument(std::string(TargetName(op)) + ": bias must be a vector of " +
                                         std::to_string(want) + " elements of the result dtype, got " +
                                         DimsString(bias->dimensions()));
    }
  }
  return ffi::Error::Success();
}

// Ops that need no kernel: an empty result, or an empty reduction (an operand with no elements), whose result is
// zeros except for a forward with a bias (act(bias) everywhere, which the kernels write without looping over the
// reduction). The declared geometry of an empty operand may be huge: no kernel may loop over it.
enum class EmptyOp { kNo, kNothingToWrite, kZeros };
inline EmptyOp EmptyOpOf(Op op, const ConvParams& p, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                         const ffi::AnyBuffer& out) {
  if (out.element_count() == 0) return EmptyOp::kNothingToWrite;
  if (a.element_count() != 0 && b.element_count() != 0) return EmptyOp::kNo;
  return op == Op::kFwd && p.has_bias[0] ? EmptyOp::kNo : EmptyOp::kZeros;
}

}  // namespace jaxconv
