// CPU kernel for integer and bool convolutions (the forward op; lax has no gradients of integer convolutions), with
// XLA:CPU's semantics: operands are widened to the result type (sign-extended if signed, zero-extended if unsigned,
// bool as 0/1) and multiplied and summed modulo 2^bits of the result (two's complement wraparound), so the result is
// the exact sum reduced modulo 2^bits. A bool result is the logical OR of the ANDs (the count of true products,
// nonzero). No dependency beyond the C++ standard library.
//
// Like the float kernels (conv_cpu.h), it trusts its arguments: params that passed DecodeParams and buffers whose
// shapes match ExpectedDims; every output element is written.
#pragma once

#include <string>

#include "core/conv_params.h"
#include "core/types.h"

namespace jaxconv {
namespace cpu {

// y = conv(x, w); in_t and out_t integer or bool types (IsInteger; the core enum, not conv_cpu.h's float one).
// Empty on success, else an error message.
std::string ConvIntFwd(const ConvParams& p, ::jaxconv::DType in_t, const void* x, const void* w, ::jaxconv::DType out_t,
                       void* y);

}  // namespace cpu
}  // namespace jaxconv
