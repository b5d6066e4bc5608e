// The current CUDA device as the kernels and the registry see it (core/types.h's Device), each query cached per
// device: a handler must not synchronise, and attribute queries do not.
#include <atomic>

#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {

namespace {
// query(dev) of the current device, cached per device (a handler must not synchronise; attribute queries do not);
// 0 when the query fails or returns <= 0 (the error is cleared so the caller's launch check does not see it).
template <class Query>
int CachedPerDevice(std::atomic<int> (&cache)[64], Query query) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  if (dev < 64) {
    if (const int v = cache[dev].load(std::memory_order_relaxed); v != 0) return v;
  }
  const int v = query(dev);
  if (v <= 0) {
    cudaGetLastError();
    return 0;
  }
  if (dev < 64) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}
}  // namespace

int DeviceArch() {
  static std::atomic<int> cache[64];
  return CachedPerDevice(cache, [](int dev) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      return 0;
    }
    return major * 10 + minor;
  });
}

int64_t MultiprocessorCount() {
  static std::atomic<int> cache[64];
  const int sms = CachedPerDevice(cache, [](int dev) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? v : 0;
  });
  return sms > 0 ? sms : kPlanSms;
}

size_t SharedMemPerBlockOptin() {
  static std::atomic<int> cache[64];
  const int bytes = CachedPerDevice(cache, [](int dev) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess ? v : 0;
  });
  return bytes > 0 ? static_cast<size_t>(bytes) : size_t(48) << 10;
}

Device CurrentDevice() {
  Device d;
  d.arch = DeviceArch();
  d.sms = MultiprocessorCount();
  d.smem_optin = static_cast<int64_t>(SharedMemPerBlockOptin());
  return d;
}

bool QueryDevice(int ordinal, Device* out) {
  int major = 0, minor = 0, sms = 0, smem = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error for the caller's launch checks
    return false;
  }
  out->arch = major * 10 + minor;
  out->sms = sms;
  out->smem_optin = smem;
  return true;
}

}  // namespace cuda
}  // namespace jaxconv
