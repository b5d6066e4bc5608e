// The benchmarks' in-stream timer (see stream_timer.h).
#include "ffi/stream_timer.h"

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "xla/ffi/api/ffi.h"

#ifdef JAXCONV_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace jaxconv {
namespace {

namespace ffi = xla::ffi;
using Clock = std::chrono::steady_clock;

struct Timer {
  Clock::time_point host[2];
  bool host_set[2] = {false, false};
#ifdef JAXCONV_WITH_CUDA
  cudaEvent_t ev[2] = {nullptr, nullptr};
  bool ev_set[2] = {false, false};
  int device = -1;
#endif
};

std::mutex g_mu;
std::map<int64_t, Timer> g_timers;
int64_t g_next = 1;

ffi::Error CheckSlot(int64_t id, int64_t slot, Timer** t) {
  if (slot != 0 && slot != 1) return ffi::Error::InvalidArgument("jaxconv_timer_mark: slot must be 0 or 1");
  auto it = g_timers.find(id);
  if (it == g_timers.end()) return ffi::Error::InvalidArgument("jaxconv_timer_mark: unknown timer id");
  *t = &it->second;
  return ffi::Error::Success();
}

ffi::Error CheckToken(const ffi::AnyBuffer& token) {
  if (token.element_type() != ffi::DataType::S32 || token.element_count() != 1) {
    return ffi::Error::InvalidArgument("jaxconv_timer_mark: the result must be one int32");
  }
  return ffi::Error::Success();
}

// Results: a token, then the operands passed through (the lowering aliases each to its operand, so nothing is
// copied and whatever uses them follows the mark). The operands are never read. The token's value is the slot on
// the CPU and unspecified on CUDA.
ffi::Error MarkCpu(ffi::RemainingArgs, ffi::RemainingRets rets, int64_t id, int64_t slot) {
  auto token = rets.get<ffi::AnyBuffer>(0);
  if (!token.has_value()) return token.error();
  if (auto e = CheckToken(**token); e.failure()) return e;
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Timer* t = nullptr;
    if (auto e = CheckSlot(id, slot, &t); e.failure()) return e;
    t->host[slot] = now;
    t->host_set[slot] = true;
  }
  const int32_t v = static_cast<int32_t>(slot);
  std::memcpy((*token)->untyped_data(), &v, sizeof(v));
  return ffi::Error::Success();
}

#ifdef JAXCONV_WITH_CUDA
ffi::Error CudaErr(const char* what, cudaError_t e) {
  return ffi::Error::Internal(std::string("jaxconv_timer_mark: ") + what + ": " + cudaGetErrorString(e));
}

ffi::Error MarkCuda(cudaStream_t stream, ffi::RemainingArgs, ffi::RemainingRets rets, int64_t id, int64_t slot) {
  auto token = rets.get<ffi::AnyBuffer>(0);
  if (!token.has_value()) return token.error();
  if (auto e = CheckToken(**token); e.failure()) return e;
  int device = -1;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return CudaErr("cudaGetDevice", e);
  std::lock_guard<std::mutex> lock(g_mu);
  Timer* t = nullptr;
  if (auto e = CheckSlot(id, slot, &t); e.failure()) return e;
  if (t->device >= 0 && t->device != device) {
    return ffi::Error::InvalidArgument("jaxconv_timer_mark: a timer's marks must run on one device");
  }
  t->device = device;
  if (t->ev[slot] == nullptr) {
    if (cudaError_t e = cudaEventCreate(&t->ev[slot]); e != cudaSuccess) return CudaErr("cudaEventCreate", e);
  }
  // The token is not written: a memset would be a device event in the profiler's busy time of the span.
  if (cudaError_t e = cudaEventRecord(t->ev[slot], stream); e != cudaSuccess) return CudaErr("cudaEventRecord", e);
  t->ev_set[slot] = true;
  return ffi::Error::Success();
}
#endif

}  // namespace

int64_t TimerCreate() {
  std::lock_guard<std::mutex> lock(g_mu);
  const int64_t id = g_next++;
  g_timers[id] = Timer{};
  return id;
}

double TimerElapsedUs(int64_t id, std::string* err) {
  Timer t;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_timers.find(id);
    if (it == g_timers.end()) {
      *err = "unknown timer id";
      return -1.0;
    }
    t = it->second;  // the event handles stay valid until TimerRelease; wait for them outside the lock
  }
#ifdef JAXCONV_WITH_CUDA
  if (t.ev_set[0] || t.ev_set[1]) {
    if (!(t.ev_set[0] && t.ev_set[1])) {
      *err = "a slot of the timer was not marked";
      return -1.0;
    }
    float ms = 0.f;
    cudaError_t e = cudaEventSynchronize(t.ev[1]);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, t.ev[0], t.ev[1]);
    if (e != cudaSuccess) {
      *err = std::string("cudaEventElapsedTime: ") + cudaGetErrorString(e);
      return -1.0;
    }
    return 1e3 * static_cast<double>(ms);
  }
#endif
  if (!(t.host_set[0] && t.host_set[1])) {
    *err = "a slot of the timer was not marked";
    return -1.0;
  }
  return std::chrono::duration<double, std::micro>(t.host[1] - t.host[0]).count();
}

void TimerRelease(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_timers.find(id);
  if (it == g_timers.end()) return;
#ifdef JAXCONV_WITH_CUDA
  for (cudaEvent_t ev : it->second.ev) {
    if (ev != nullptr) cudaEventDestroy(ev);  // nothing to report to: the timer is gone either way
  }
#endif
  g_timers.erase(it);
}

}  // namespace jaxconv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvTimerMarkCpu, jaxconv::MarkCpu,
                              xla::ffi::Ffi::Bind()
                                  .RemainingArgs()  // values the mark passes through (not read)
                                  .RemainingRets()  // token (one int32), then the values, aliased to the operands
                                  .Attr<int64_t>("timer")
                                  .Attr<int64_t>("slot"));

#ifdef JAXCONV_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxconvTimerMarkCuda, jaxconv::MarkCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()  // values the mark passes through (not read)
                                  .RemainingRets()  // token (one int32), then the values, aliased to the operands
                                  .Attr<int64_t>("timer")
                                  .Attr<int64_t>("slot"));
#endif
