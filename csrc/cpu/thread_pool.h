// A small persistent thread pool for the CPU kernels: NumThreads() - 1 workers, started on first use, that
// join the calling thread on one loop of independent work items at a time. Items are claimed dynamically
// (an atomic counter), so a core taken by another process only slows its share; callers must therefore make
// every result independent of which thread runs which item (each output element computed by one item, in a
// fixed order).
#pragma once

#include <cstdint>
#include <functional>

namespace jaxconv {
namespace cpu {

// Calls fn(item, thread) for every item in [0, n), on at most max_threads threads (the caller is thread 0;
// thread < max_threads, so per-thread scratch can be indexed by it). Returns false if any call threw (the
// remaining items may then have been skipped). A call made while the pool is busy (a concurrent or nested
// call) runs all its items on the calling thread.
bool PoolFor(int64_t n, int max_threads, const std::function<void(int64_t item, int thread)>& fn);

// The number of threads PoolFor may use: NumThreads() (conv_cpu.h).
int PoolThreads();

}  // namespace cpu
}  // namespace jaxconv
