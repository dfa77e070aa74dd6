// The thread pool our CPU primitives (the rows kernels, attention) run their
// tasks on: a fixed set of workers shared by the whole process.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MTP_X86 1
#endif

// A named namespace, not an anonymous one: every file that includes this
// must see the one pool (`Pool::get`'s static is shared across them).
namespace mtp_mlx::rows {

// A fixed set of worker threads that, with the caller, run the tasks
// 0..count of one job; `run` returns when every task has finished and every
// worker that joined the job has left it (so none holds a stale job).
class Pool {
 public:
  static Pool& get() {
    // Leaked on purpose: a worker may still be parked at process exit.
    static Pool* pool = new Pool();
    return *pool;
  }

  // Threads a job runs on: the workers and the caller.
  int threads() const { return workers_ + 1; }

  void run(int count, const std::function<void(int)>& task) {
    if (count <= 1 || workers_ == 0) {
      for (int i = 0; i < count; ++i) task(i);
      return;
    }
    std::lock_guard<std::mutex> one_job(job_lock_);
    {
      std::lock_guard<std::mutex> g(mutex_);
      task_ = &task;
      count_ = count;
      next_.store(0);
      done_.store(0);
      ++generation_;
      posted_.store(generation_, std::memory_order_release);
    }
    wake_.notify_all();
    work(&task, count);
    std::unique_lock<std::mutex> g(mutex_);
    finished_.wait(g, [&] { return done_.load() == count_ && joined_ == 0; });
    task_ = nullptr;
  }

 private:
  Pool() {
    unsigned hw = std::thread::hardware_concurrency();
    workers_ = static_cast<int>(std::clamp(hw, 1u, 8u)) - 1;
    for (int i = 0; i < workers_; ++i) std::thread([this] { loop(); }).detach();
  }

  // Takes tasks of the current job until none are left.
  void work(const std::function<void(int)>* task, int count) {
    for (int i = next_.fetch_add(1); i < count; i = next_.fetch_add(1)) {
      (*task)(i);
      if (done_.fetch_add(1) + 1 == count) {
        std::lock_guard<std::mutex> g(mutex_);
        finished_.notify_all();
      }
    }
  }

  void loop() {
    unsigned long seen = 0;
    const auto spin = std::chrono::microseconds(spin_us());
    for (;;) {
      const std::function<void(int)>* task;
      int count;
      if (spin.count() > 0) {
        // The clock is read every 64 polls: reading it each time showed as
        // 3 % of a 24l run's samples.
        const auto until = std::chrono::steady_clock::now() + spin;
        for (unsigned polls = 1; posted_.load(std::memory_order_acquire) == seen; ++polls) {
#ifdef MTP_X86
          _mm_pause();
#endif
          if (polls % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
        }
      }
      {
        std::unique_lock<std::mutex> g(mutex_);
        wake_.wait(g, [&] { return generation_ != seen && task_ != nullptr; });
        seen = generation_;
        task = task_;
        count = count_;
        ++joined_;
      }
      work(task, count);
      {
        std::lock_guard<std::mutex> g(mutex_);
        --joined_;
      }
      finished_.notify_all();
    }
  }

  int workers_ = 0;
  std::mutex job_lock_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  const std::function<void(int)>* task_ = nullptr;
  int count_ = 0;
  int joined_ = 0;
  unsigned long generation_ = 0;
  std::atomic<unsigned long> posted_{0};

  // How long a worker that finished a job polls for the next one before it
  // sleeps on the condition variable (`MTP_POOL_SPIN_US`, 0: never polls).
  // A forward posts a job per product and attention, tens of microseconds
  // apart; woken from sleep, the worker joined each one late. tiny-mtp f32
  // on 2 Zen 4 cores, eleven alternating pairs of processes, 100 µs against
  // none, medians: plain 233.5 against 223.0 tokens/s, depth 3 341.3 against
  // 343.9 (no gain: the verify's jobs are longer); the 24l shape
  // (bandwidth-bound) within the noise either way.
  static long spin_us() {
    const char* v = std::getenv("MTP_POOL_SPIN_US");
    return v == nullptr ? 100 : std::max(0L, std::strtol(v, nullptr, 10));
  }
  std::atomic<int> next_{0};
  std::atomic<int> done_{0};
};

}  // namespace mtp_mlx::rows
