#include "moert/Parallel.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace moert {
namespace {

/// A fixed pool: the calling thread takes chunk 0, workers the rest.
class Pool {
public:
  ~Pool() { resize(1); }

  void resize(int threads) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      stopping = true;
      ++generation;
    }
    wake.notify_all();
    for (std::thread &t : workers)
      t.join();
    workers.clear();
    stopping = false;
    size = std::max(1, threads);
    for (int i = 1; i < size; ++i)
      workers.emplace_back([this, i] { loop(i); });
  }

  int threads() const { return size; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)> &body, int64_t grain) {
    int chunks = static_cast<int>(std::min<int64_t>(size, std::max<int64_t>(1, n / std::max<int64_t>(grain, 1))));
    if (chunks <= 1 || inParallel) {
      body(0, n);
      return;
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      task = &body;
      total = n;
      numChunks = chunks;
      pending = chunks - 1;
      ++generation;
    }
    wake.notify_all();
    inParallel = true;
    body(0, n / chunks);
    inParallel = false;
    std::unique_lock<std::mutex> lock(mutex);
    done.wait(lock, [&] { return pending == 0; });
    task = nullptr;
  }

private:
  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)> *body;
      int64_t n;
      int chunks;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return generation != seen; });
        seen = generation;
        if (stopping)
          return;
        if (!task || index >= numChunks)
          continue;
        body = task;
        n = total;
        chunks = numChunks;
      }
      inParallel = true;
      (*body)(n * index / chunks, n * (index + 1) / chunks);
      inParallel = false;
      std::unique_lock<std::mutex> lock(mutex);
      if (--pending == 0)
        done.notify_one();
    }
  }

  std::mutex mutex;
  std::condition_variable wake, done;
  std::vector<std::thread> workers;
  const std::function<void(int64_t, int64_t)> *task = nullptr;
  int64_t total = 0;
  int numChunks = 0, pending = 0, size = 1;
  uint64_t generation = 0;
  bool stopping = false;
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
