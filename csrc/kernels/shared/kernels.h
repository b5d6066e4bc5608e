// Host API shared by the CUDA kernels (plain C++): the device queries and the fixed-order sum of split-K partials.
// Every launcher only enqueues work on its stream (no allocation, no synchronisation) and returns the first CUDA
// error (cudaGetLastError after each launch).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/conv_params.h"
#include "core/types.h"

namespace jaxconv {
namespace cuda {

// ---- device.cu: the current device, each query cached per device ----
// Compute capability (major * 10 + minor), 0 if unknown.
int DeviceArch();
// Multiprocessors, an H100's count (kPlanSms) if unknown.
int64_t MultiprocessorCount();
// The dynamic shared memory a block may opt into, 48 KiB if unknown.
size_t SharedMemPerBlockOptin();
// The three as the registry's Device (core/types.h).
Device CurrentDevice();
// The Device of CUDA device `ordinal`; false when the runtime cannot describe it (no GPU, no driver).
bool QueryDevice(int ordinal, Device* out);

// ---- reduce_splits.cu: out[e] = sum_{s < splits} scratch[s * count + e] in fixed order ----
cudaError_t ReduceSplits(DType in, DType out, const void* scratch, int64_t splits, int64_t count, void* dst,
                         cudaStream_t s);
// ... for a float32 forward split over its reduction, (m, k) row-major: dst[e] = act(sum + bias[e % k]), bias may be
// null.
cudaError_t ReduceSplitsBiasAct(const float* scratch, int64_t splits, int64_t count, int64_t k, const float* bias,
                                int64_t act, float* dst, cudaStream_t s);

}  // namespace cuda
}  // namespace jaxconv
