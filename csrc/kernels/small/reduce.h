// The few-channel family's fixed-order reduction of a filter gradient's partial filters (reduce.cu): each small.*
// filter gradient writes `chunks` partial filters of `welems` accumulators (f32, f64 for f64) to its workspace and
// adds them with this, in the same order for every run (bitwise deterministic, no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/types.h"

namespace jaxconv {
namespace cuda {
namespace small_channel {

// dw[e] = sum_{c < chunks} partials[c * welems + e], converted to `out`.
cudaError_t ReduceChunks(DType in, DType out, const void* partials, int64_t chunks, int64_t welems, void* dw,
                         cudaStream_t s);

}  // namespace small_channel
}  // namespace cuda
}  // namespace jaxconv
