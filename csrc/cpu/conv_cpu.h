// CPU kernels for the three jaxconv ops (fwd with fused bias + activation, dgrad, wgrad), with exactly the
// semantics documented in conv_params.h, for both native layouts. No dependency beyond the C++ standard
// library; no XLA types here (the FFI handlers in csrc/ffi/cpu_handlers.cc translate).
//
// The kernels trust their arguments: call them only with params that passed DecodeParams and buffers whose
// shapes match ExpectedDims (DecodeAndValidate does both). Every output element is written (empty sums give
// 0, or act(bias) for fwd). Results are deterministic and independent of the number of threads and of
// scheduling: each output element is summed in an order fixed by the problem's shape alone (one thread sums
// it, except that a wgrad output too small to share out sums its positions in a shape-determined number of
// parts, added in order; see conv_gemm.h). They may differ between machines with and without AVX2+FMA.
#pragma once

#include <cstdint>
#include <string>

#include "core/conv_params.h"
#include "core/types.h"

namespace jaxconv {
namespace cpu {

using ::jaxconv::DType;  // the one element-type enum (core/types.h)

// Each returns an empty string on success, else an error message (e.g. out of memory, unsupported dtype pair).
// `bias` is ignored (may be null) unless p.has_bias[0] == 1; it has the output dtype and p.k[0] elements.
std::string ConvFwd(const ConvParams& p, DType in_t, const void* x, const void* w, DType out_t,
                    const void* bias, void* y);
std::string ConvDgrad(const ConvParams& p, DType in_t, const void* dy, const void* w, DType out_t, void* dx);
std::string ConvWgrad(const ConvParams& p, DType in_t, const void* x, const void* dy, DType out_t, void* dw);

// Threads used for large problems: env JAXCONV_CPU_THREADS if set (>= 1), else the hardware concurrency.
int NumThreads();

// bf16/f16 <-> f32 by bit manipulation; float -> half types round to nearest even (NaN stays NaN).
float BF16ToFloat(uint16_t h);
uint16_t FloatToBF16(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

}  // namespace cpu
}  // namespace jaxconv
