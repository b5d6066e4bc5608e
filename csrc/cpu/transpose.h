// Blocked 2-D transposes of 4- and 8-byte elements for the layout passes (convert.h): AVX2 8x8 / 4x4 register
// transposes when UseAvx2(), else scalar loops. A plain strided copy runs into cache-set conflicts on the
// power-of-two-ish strides of channels-first tensors; the register blocks write whole vectors per row.
#pragma once

#include <cstdint>

namespace jaxconv {
namespace cpu {

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols.
void TransposeBlock(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows, int64_t cols);
void TransposeBlock(const double* src, int64_t lds, double* dst, int64_t ldd, int64_t rows, int64_t cols);

}  // namespace cpu
}  // namespace jaxconv
