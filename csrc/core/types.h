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

// Element types of operands and results.
enum class DType : int { kF32 = 0, kF64 = 1, kBF16 = 2, kF16 = 3 };
inline constexpr int kNumDTypes = 4;

inline int DTypeBytes(DType t) { return t == DType::kF64 ? 8 : t == DType::kF32 ? 4 : 2; }
inline bool Is16Bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kBF16: return "bfloat16";
    default: return "float16";
  }
}
// The (operand, result) pairs the ops take: the result in the operand type, or float32 for 16-bit operands.
inline bool ValidDTypePair(DType in, DType out) { return out == in || (Is16Bit(in) && out == DType::kF32); }

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
