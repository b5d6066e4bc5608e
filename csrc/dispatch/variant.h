// A kernel variant: one technique that runs some ops of some convolutions, as one entry of the registry
// (dispatch/variants.def lists them all, in the order `auto` tries them).
//
// Each variant provides three functions in namespace jaxconv::variants::<id>, defined next to its kernels:
//   std::string Applies(const Problem&)   empty when the variant runs the problem, else why not (one sentence).
//                                         Pure host code: it reads the problem and its Device, nothing else, so
//                                         the lowering and the handler reach the same answer.
//   size_t Workspace(const Problem&)      device bytes it needs (XLA allocates them at compile time), a function of
//                                         the problem; 0 when it needs none. Only asked where Applies is empty.
//   cudaError_t Launch(const Problem&, const Buffers&, cudaStream_t)
//                                         enqueues the op (no allocation, no synchronisation) and returns the first
//                                         CUDA error. Called only where Applies is empty and the workspace has the
//                                         bytes Workspace asked for; it launches its own kernels and no other
//                                         variant's.
// Builds without CUDA keep every entry's metadata (the table is documentation too) without the functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"

#ifdef JAXCONV_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace jaxconv {

// The buffers of one op, in the op's order: fwd (x, w) -> y, dgrad (dy, w) -> dx, wgrad (x, dy) -> dw; bias is fwd's
// (null without one). ws: the variant's workspace, 256-byte aligned, contents undefined on entry.
struct Buffers {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
};

using AppliesFn = std::string (*)(const Problem&);
using WorkspaceFn = size_t (*)(const Problem&);
#ifdef JAXCONV_WITH_CUDA
using LaunchFn = cudaError_t (*)(const Problem&, const Buffers&, cudaStream_t);
#else
using LaunchFn = void*;
#endif

// Bit masks of the ops and operand dtypes a variant implements at most (its predicate may take fewer problems).
inline constexpr unsigned OpBit(Op op) { return 1u << static_cast<int>(op); }
inline constexpr unsigned kFwdOp = 1u, kDgradOp = 2u, kWgradOp = 4u, kAllOps = 7u;
inline constexpr unsigned DTypeBit(DType t) { return 1u << static_cast<int>(t); }
inline constexpr unsigned kF32 = 1u, kF64 = 2u, kBF16 = 4u, kF16 = 8u;
// kAllTypes is every floating type: the float variants' masks stay float-only, so no float kernel is asked about
// integer operands.
inline constexpr unsigned k16Bit = kBF16 | kF16, kTensorCoreTypes = kF32 | k16Bit, kAllTypes = 15u;
// Integer and bool operand types (the integer family's).
inline constexpr unsigned kI8 = 1u << 4, kI16 = 1u << 5, kI32 = 1u << 6, kI64 = 1u << 7, kU8 = 1u << 8,
                          kU16 = 1u << 9, kU32 = 1u << 10, kU64 = 1u << 11, kPred = 1u << 12;
inline constexpr unsigned kIntTypes = kI8 | kI16 | kI32 | kI64 | kU8 | kU16 | kU32 | kU64 | kPred;
static_assert(kI8 == DTypeBit(DType::kI8) && kPred == DTypeBit(DType::kPred), "dtype masks follow the DType codes");

// auto's preference for a variant that applies (a cost rule): empty to take it, else why auto passes it over
// (forced requests ignore it).
using PreferFn = std::string (*)(const Problem&);

struct Variant {
  const char* name;     // "<family>.<technique>", what `algorithm=` and autotune name
  const char* family;   // what `algorithm=<family>` selects (with `also`)
  const char* also;     // a second selector name, or ""
  unsigned ops;         // OpBit mask
  unsigned dtypes;      // DTypeBit mask of the operand types
  const char* file;     // where its kernels live, relative to csrc/
  const char* summary;  // the technique in one line
  PreferFn prefer;      // auto's cost rule, or null (always preferred when it applies)
  AppliesFn applies;    // null in builds without CUDA
  WorkspaceFn workspace;
  LaunchFn launch;
};

}  // namespace jaxconv
