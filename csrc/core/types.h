// The op and element-type enums every layer shares (FFI handlers, CPU kernels, the variant registry, the CUDA
// kernels), and the Problem a kernel variant is asked about: one op of one convolution on one device.
#pragma once

#include <cstdint>

#include "core/conv_params.h"

namespace jaxconv {

// The three ops of one convolution (conv_params.h gives their relations).
enum class Op : int { kFwd = 0, kDgrad = 1, kWgrad = 2 };
inline constexpr int kNumOps = 3;

inline const char* OpName(Op op) {
  switch (op) {
    case Op::kFwd: return "fwd";
    case Op::kDgrad: return "dgrad";
    default: return "wgrad";
  }
}

// Element types of operands and results: the floating types the float kernels take (first four, in the codes older
// builds used), then the integer types and bool (kPred), which only the integer kernels take.
enum class DType : int {
  kF32 = 0, kF64 = 1, kBF16 = 2, kF16 = 3,
  kI8 = 4, kI16 = 5, kI32 = 6, kI64 = 7, kU8 = 8, kU16 = 9, kU32 = 10, kU64 = 11, kPred = 12
};
inline constexpr int kNumDTypes = 13;

inline bool IsFloat(DType t) { return static_cast<int>(t) <= static_cast<int>(DType::kF16); }
inline bool IsInteger(DType t) { return !IsFloat(t); }  // integers and bool
inline bool IsSignedInt(DType t) { return t == DType::kI8 || t == DType::kI16 || t == DType::kI32 || t == DType::kI64; }
inline int DTypeBytes(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: case DType::kU64: return 8;
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kBF16: case DType::kF16: case DType::kI16: case DType::kU16: return 2;
    default: return 1;
  }
}
inline bool Is16Bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kI8: return "int8";
    case DType::kI16: return "int16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    case DType::kU16: return "uint16";
    case DType::kU32: return "uint32";
    case DType::kU64: return "uint64";
    default: return "bool";
  }
}
// The (operand, result) pairs the ops take. Floating operands: the result in the operand type, or float32 for
// 16-bit operands. Integer and bool operands: any integer or bool result (the sums are exact modulo 2^bits of the
// result, as XLA's integer convolutions are; the Python layer admits only the pairs lax admits).
inline bool ValidDTypePair(DType in, DType out) {
  if (IsInteger(in)) return IsInteger(out);
  return out == in || (Is16Bit(in) && out == DType::kF32);
}

// What a kernel variant may know about the GPU: the compute capability, the multiprocessor count and the shared
// memory a block may opt into. The lowering fills it from the device it compiles for (a default Hopper where there
// is none, as when exporting), the handlers from the device they run on; predicates and workspace sizes read nothing
// else, so the choice the lowering makes is the choice the handler confirms.
struct Device {
  int arch = 90;                  // major * 10 + minor
  int64_t sms = 132;              // multiprocessors
  int64_t smem_optin = 227 << 10; // dynamic shared memory a block may opt into, bytes
};

// A device of this compute capability with its family's usual figures, for lowering without a GPU and for tests.
inline Device DefaultDevice(int arch) {
  Device d;
  d.arch = arch;
  d.sms = arch >= 90 ? 132 : arch == 80 ? 108 : 84;
  d.smem_optin = arch >= 90 ? (227 << 10) : arch == 80 ? (163 << 10) : (99 << 10);
  return d;
}

// One op of one convolution, as a variant's predicate, workspace size and launch see it.
struct Problem {
  ConvParams p;
  Op op = Op::kFwd;
  DType in = DType::kF32;   // operand type (fwd: x, w; dgrad: dy, w; wgrad: x, dy)
  DType out = DType::kF32;  // result type
  Device dev;
};

}  // namespace jaxconv
