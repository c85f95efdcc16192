#include "moert/Parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define MOERT_PAUSE() _mm_pause()
#else
#define MOERT_PAUSE() std::this_thread::yield()
#endif

namespace moert {
namespace {

/// A fixed pool: the calling thread takes chunk 0, workers the rest.
/// Decoding one token runs a few hundred short parallel loops, so workers
/// spin briefly on the task counter before sleeping, and the caller spins
/// for their completion: a futex wake per loop would cost more than the
/// work of the small ones.
class Pool {
public:
  ~Pool() { resize(1); }

  void resize(int threads) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping.store(true);
      generation.fetch_add(1, std::memory_order_release);
    }
    wake.notify_all();
    for (std::thread &t : workers)
      t.join();
    workers.clear();
    stopping.store(false);
    size = std::max(1, threads);
    // Workers start from the current generation, read here and not in the
    // new thread: a task published before a worker first runs must not be
    // taken for an old one.
    uint64_t start = generation.load(std::memory_order_acquire);
    for (int i = 1; i < size; ++i)
      workers.emplace_back([this, i, start] { loop(i, start); });
  }

  int threads() const { return size; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)> &body, int64_t grain) {
    int chunks = static_cast<int>(
        std::min<int64_t>(size, std::max<int64_t>(1, n / std::max<int64_t>(grain, 1))));
    if (chunks <= 1 || inParallel) {
      body(0, n);
      return;
    }
    task = &body;
    total = n;
    numChunks = chunks;
    pending.store(chunks - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex);
      generation.fetch_add(1, std::memory_order_release);
    }
    wake.notify_all();
    inParallel = true;
    body(0, n / chunks);
    inParallel = false;
    while (pending.load(std::memory_order_acquire) != 0)
      MOERT_PAUSE();
  }

private:
  void loop(int index, uint64_t seen) {
    for (;;) {
      // Spin for a while (a decode step issues the next loop within
      // microseconds), then sleep until the next task.
      uint64_t now = seen;
      for (int spin = 0; spin < 20000; ++spin) {
        now = generation.load(std::memory_order_acquire);
        if (now != seen)
          break;
        MOERT_PAUSE();
      }
      if (now == seen) {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return generation.load(std::memory_order_acquire) != seen; });
        now = generation.load(std::memory_order_acquire);
      }
      seen = now;
      if (stopping.load())
        return;
      if (index >= numChunks)
        continue;
      inParallel = true;
      (*task)(total * index / numChunks, total * (index + 1) / numChunks);
      inParallel = false;
      pending.fetch_sub(1, std::memory_order_release);
    }
  }

  std::mutex mutex;
  std::condition_variable wake;
  std::vector<std::thread> workers;
  const std::function<void(int64_t, int64_t)> *task = nullptr;
  int64_t total = 0;
  int numChunks = 0, size = 1;
  std::atomic<int> pending{0};
  std::atomic<uint64_t> generation{0};
  std::atomic<bool> stopping{false};
  static thread_local bool inParallel;
};

thread_local bool Pool::inParallel = false;

Pool &pool() {
  static Pool p;
  return p;
}

} // namespace

void setNumThreads(int threads) { pool().resize(threads); }
int numThreads() { return pool().threads(); }
void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &body, int64_t grain) {
  if (n <= 0)
    return;
  pool().run(n, body, grain);
}

} // namespace moert
