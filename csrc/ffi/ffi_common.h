// Decoding and validation shared by the CPU and CUDA handlers: the handlers trust nothing XLA passes them and
// return ffi::Error before any kernel runs if the params and buffers disagree.
#pragma once

#include <cstdint>
#include <string>

#include "conv_params.h"
#include "xla/ffi/api/ffi.h"

namespace jaxconv {

namespace ffi = xla::ffi;

enum class Op { kFwd, kDgrad, kWgrad };

inline const char* OpName(Op op) {
  switch (op) {
    case Op::kFwd: return "jaxconv_fwd";
    case Op::kDgrad: return "jaxconv_dgrad";
    default: return "jaxconv_wgrad";
  }
}

inline bool IsFloatType(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::F64 || t == ffi::DataType::BF16 ||
         t == ffi::DataType::F16;
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
    return ffi::Error::InvalidArgument(std::string(OpName(op)) + ": buffer " + name + " has shape " +
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
  if (!err.empty()) return ffi::Error::InvalidArgument(std::string(OpName(op)) + ": " + err);
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
  if (!IsFloatType(in_t) || b.element_type() != in_t) {
    return ffi::Error::InvalidArgument(std::string(OpName(op)) + ": operands " + na + " and " + nb +
                                       " must share one dtype of f32, f64, bf16, f16");
  }
  const bool out_ok = out_t == in_t || (out_t == ffi::DataType::F32 && in_t != ffi::DataType::F64);
  if (!out_ok) {
    return ffi::Error::InvalidArgument(std::string(OpName(op)) + ": result " + nout +
                                       " must have the operands' dtype or f32");
  }
  if (op != Op::kFwd && (p->has_bias[0] != 0 || p->activation[0] != kActNone)) {
    return ffi::Error::InvalidArgument(std::string(OpName(op)) + ": bias/activation apply to fwd only");
  }
  if (bias != nullptr) {
    const int64_t want = p->has_bias[0] ? p->k[0] : 0;
    if (bias->dimensions().size() != 1 || bias->dimensions()[0] != want || bias->element_type() != out_t) {
      return ffi::Error::InvalidArgument(std::string(OpName(op)) + ": bias must be a vector of " +
                                         std::to_string(want) + " elements of the result dtype, got " +
                                         DimsString(bias->dimensions()));
    }
  }
  return ffi::Error::Success();
}

}  // namespace jaxconv
