// In-stream timer for the benchmarks (GUIDE section 4): a side-effecting custom call, jaxconv_timer_mark, that
// records when the device reaches it in program order, so the harness can time a span of a compiled program on
// the device itself. The host's dispatch work per operand (tens of microseconds an input set) never enters the
// span, as it entered the wall-clock slope.
//   CUDA: a cudaEvent recorded on XLA's stream (not command-buffer compatible on purpose: an event record must
//         run as its own thunk, between the command buffers of the timed ops);
//   CPU:  a steady-clock time taken when the thunk runs (its operands order it after the ops it depends on).
// A timer is an id with two slots (0: start, 1: end); TimerElapsedUs reads the span of the last marks.
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/api.h"

namespace jaxconv {

// A new timer id (never reused while the process lives).
int64_t TimerCreate();
// Microseconds from slot 0 to slot 1 of the timer's last marks; waits for the end mark's event on CUDA. A
// negative value with *err set when the timer is unknown or a slot has not been marked.
double TimerElapsedUs(int64_t id, std::string* err);
// Frees the timer's events; later marks with this id fail.
void TimerRelease(int64_t id);

}  // namespace jaxconv

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvTimerMarkCpu);
#ifdef JAXCONV_WITH_CUDA
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvTimerMarkCuda);
#endif
