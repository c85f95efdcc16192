#include "moert/Parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define MOERT_PAUSE() _mm_pause()
#else
#define MOERT_PAUSE() std::this_thread::yield()
#endif

namespace moert {
namespace {

using Clock = std::chrono::steady_clock;

/// How long an idle worker polls for the next loop before it sleeps, and a
/// caller polls for the loop's last chunks before it yields its core.
/// Decoding one token runs ~130 short loops a few microseconds apart, so a
/// futex wake per loop would cost more than the small ones; but a thread
/// that polls longer competes with a busy neighbour for the core the
/// serial work between loops needs.
constexpr auto kIdleSpin = std::chrono::microseconds(50);
constexpr auto kWaitSpin = std::chrono::microseconds(20);
/// Chunks per thread: a thread slowed by a neighbour on its core finishes
/// fewer of them while the others take the rest.
constexpr int kChunksPerThread = 4;

/// A fixed pool. A loop is split into chunks; each taking thread (the
/// caller is participant 0) first works through its own contiguous run of
/// chunks (the same split every time, so data a thread touched in one loop
/// is in its cache for the next over the same range), then takes what is
/// left of the others' runs.
///
/// Entering a loop is a compare-and-swap on `state` (the loop's generation
/// in the high half, then a "closed" bit and the count of workers inside),
/// so the caller never waits for a worker that has not started: once every
/// chunk is done it closes the loop and waits only for the workers inside.
class Pool {
public:
  ~Pool() { resize(1); }

  void resize(int threads) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping.store(true);
      state.fetch_add(kGeneration, std::memory_order_release);
    }
    wake.notify_all();
    for (std::thread &t : workers)
      t.join();
    workers.clear();
    stopping.store(false);
    size = std::max(1, threads);
    runs = std::vector<Run>(static_cast<size_t>(size));
    // Workers start from the current generation, read here and not in the
    // new thread: one that starts late must still see the next stop.
    const uint64_t start = state.load(std::memory_order_acquire) >> 32;
    for (int i = 1; i < size; ++i)
      workers.emplace_back([this, i, start] { loop(i, start); });
  }

  int threads() const { return size; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)> &body, int64_t grain) {
    const int64_t pieces = n / std::max<int64_t>(grain, 1);
    const int chunks =
        static_cast<int>(std::clamp<int64_t>(pieces, 1, int64_t(size) * kChunksPerThread));
    if (chunks <= 1 || size == 1 || inParallel) {
      body(0, n);
      return;
    }
    task = &body;
    total = n;
    numChunks = chunks;
    participants = std::min(size, chunks);
    for (int p = 0; p < participants; ++p) {
      runs[p].next.store(chunks * p / participants, std::memory_order_relaxed);
      runs[p].end = chunks * (p + 1) / participants;
    }
    remaining.store(chunks, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex);
      // A new generation, open, nobody inside: the release publishes the
      // task to the workers that enter it (acquire).
      uint64_t generation = (state.load(std::memory_order_relaxed) >> 32) + 1;
      state.store(generation << 32, std::memory_order_release);
    }
    wake.notify_all();
    inParallel = true;
    work(0);
    inParallel = false;
    waitUntil([&] { return remaining.load(std::memory_order_acquire) == 0; });
    // Close the loop to late workers, then let those inside leave it.
    uint64_t s = state.load(std::memory_order_relaxed);
    while (!state.compare_exchange_weak(s, s | kClosed, std::memory_order_acq_rel))
      ;
    waitUntil([&] { return (state.load(std::memory_order_acquire) & kInside) == 0; });
    if (error) // the first chunk that threw, on any thread: the caller's error
      std::rethrow_exception(std::exchange(error, nullptr));
  }

private:
  static constexpr uint64_t kGeneration = uint64_t(1) << 32;
  static constexpr uint64_t kClosed = uint64_t(1) << 31;
  static constexpr uint64_t kInside = kClosed - 1;

  struct alignas(64) Run {
    std::atomic<int> next{0};
    int end = 0;
  };

  /// Takes chunks, own run first, until none is left.
  void work(int self) {
    for (int k = 0; k < participants; ++k) {
      Run &r = runs[(self + k) % participants];
      for (;;) {
        const int chunk = r.next.fetch_add(1, std::memory_order_relaxed);
        if (chunk >= r.end)
          break;
        try {
          (*task)(total * chunk / numChunks, total * (chunk + 1) / numChunks);
        } catch (...) {
          std::lock_guard<std::mutex> lock(errorMutex);
          if (!error)
            error = std::current_exception();
        }
        remaining.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  /// Polls `done` for kWaitSpin, then yields the core between polls.
  template <typename F>
  static void waitUntil(F &&done) {
    const auto until = Clock::now() + kWaitSpin;
    for (int i = 0; !done(); ++i) {
      if (i < 64 || Clock::now() < until)
        MOERT_PAUSE();
      else
        std::this_thread::yield();
    }
  }

  /// Worker `index` (1..size-1): participant `index` of the loops it enters.
  void loop(int index, uint64_t seen) {
    for (;;) {
      // Poll for a while (a decode step issues the next loop within
      // microseconds), then sleep until the next one.
      uint64_t s = state.load(std::memory_order_acquire);
      const auto until = Clock::now() + kIdleSpin;
      for (int i = 0; (s >> 32) == seen; ++i) {
        if (i >= 64 && Clock::now() >= until) {
          std::unique_lock<std::mutex> lock(mutex);
          wake.wait(lock, [&] { return (state.load(std::memory_order_acquire) >> 32) != seen; });
        } else {
          MOERT_PAUSE();
        }
        s = state.load(std::memory_order_acquire);
      }
      seen = s >> 32;
      if (stopping.load())
        return;
      // Enter the loop unless it is closed (or already superseded).
      bool entered = false;
      while (!(s & kClosed) && (s >> 32) == seen) {
        if (state.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) {
          entered = true;
          break;
        }
      }
      if (!entered)
        continue;
      inParallel = true;
      work(index < participants ? index : 0);
      inParallel = false;
      state.fetch_sub(1, std::memory_order_release);
    }
  }

  std::mutex mutex, errorMutex;
  std::condition_variable wake;
  std::exception_ptr error;
  std::vector<std::thread> workers;
  std::vector<Run> runs;
  const std::function<void(int64_t, int64_t)> *task = nullptr;
  int64_t total = 0;
  int numChunks = 0, participants = 0, size = 1;
  std::atomic<int> remaining{0};
  std::atomic<uint64_t> state{0};
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
