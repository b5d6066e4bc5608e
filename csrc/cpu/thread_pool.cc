// The persistent pool of thread_pool.h. Workers sleep on a condition variable between loops (no spinning: the
// cores may be shared with other processes and with XLA's own threads), and a loop never waits for a worker
// that has not started on it: the caller claims items too, and once none are left it only waits for the
// workers already inside.
#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu/conv_cpu.h"

namespace jaxconv {
namespace cpu {
namespace {

class Pool {
 public:
  explicit Pool(int threads) {
    for (int w = 1; w < threads; ++w) {
      try {
        workers_.emplace_back([this, w] { WorkerLoop(w); });
      } catch (...) {
        break;  // fewer workers: the loops still run, on the threads there are
      }
    }
  }

  int Threads() const { return 1 + static_cast<int>(workers_.size()); }

  bool Run(int64_t n, int max_threads, const std::function<void(int64_t, int)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    const int t = std::min<int64_t>({static_cast<int64_t>(max_threads), static_cast<int64_t>(Threads()), n});
    if (!busy.owns_lock() || t <= 1) return RunInline(n, fn);
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      participants_ = t;
      next_.store(0);
      ok_.store(true);
      open_ = true;
      active_ = 0;
      ++generation_;
    }
    cv_work_.notify_all();
    Work(0);
    // Every item is claimed: close the loop to workers that have not joined yet (a worker the OS has not
    // scheduled must not hold the caller up) and wait for those that did.
    std::unique_lock<std::mutex> lock(mu_);
    open_ = false;
    cv_done_.wait(lock, [this] { return active_ == 0; });
    fn_ = nullptr;
    return ok_.load();
  }

 private:
  static bool RunInline(int64_t n, const std::function<void(int64_t, int)>& fn) {
    try {
      for (int64_t i = 0; i < n; ++i) fn(i, 0);
    } catch (...) {
      return false;
    }
    return true;
  }

  void Work(int thread) {
    for (;;) {
      const int64_t i = next_.fetch_add(1);
      if (i >= n_) return;
      try {
        (*fn_)(i, thread);
      } catch (...) {
        ok_.store(false);
        next_.store(n_);  // stop handing out items
        return;
      }
    }
  }

  void WorkerLoop(int w) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_work_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (!open_ || w >= participants_) continue;
        ++active_;
      }
      Work(w);
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) cv_done_.notify_all();
    }
  }

  std::mutex run_mu_;  // held for a whole loop: one loop at a time
  std::mutex mu_;      // guards the fields below except the atomics
  std::condition_variable cv_work_, cv_done_;
  uint64_t generation_ = 0;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int participants_ = 0;
  bool open_ = false;  // workers may still join the current loop
  int active_ = 0;     // workers inside the current loop
  std::atomic<int64_t> next_{0};
  std::atomic<bool> ok_{true};
  std::vector<std::thread> workers_;
};

Pool& GetPool() {
  // Never destroyed: workers blocked at process exit must not be joined or destroyed from a static destructor.
  static Pool* pool = new Pool(NumThreads());
  return *pool;
}

}  // namespace

bool PoolFor(int64_t n, int max_threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return true;
  return GetPool().Run(n, std::max(1, max_threads), fn);
}

int PoolThreads() { return GetPool().Threads(); }

}  // namespace cpu
}  // namespace jaxconv
