// The thread pool (runtime/src/Parallel.cpp): every index of a loop runs
// once, whatever the chunking, the stealing between threads or a thread
// that is slow; errors reach the caller; nested loops run serially.
#include "moert/Parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace moert;

namespace {

struct Threads {
  explicit Threads(int n) { setNumThreads(n); }
  ~Threads() { setNumThreads(1); }
};

/// Runs parallelFor(n, ..., grain) and checks that every index ran once.
void checkCoverage(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  parallelFor(n, [&](int64_t b, int64_t e) {
    ASSERT_LE(0, b);
    ASSERT_LT(b, e);
    ASSERT_LE(e, n);
    for (int64_t i = b; i < e; ++i)
      hits[i].fetch_add(1);
  }, grain);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
}

} // namespace

TEST(ParallelTest, EveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    Threads pool(threads);
    for (int64_t n : {1, 2, 3, 7, 8, 64, 1000, 4097})
      for (int64_t grain : {1, 3, 100})
        checkCoverage(n, grain);
  }
}

TEST(ParallelTest, ManyShortLoopsInARow) {
  // As in decoding: thousands of tiny loops; workers that poll, sleep and
  // wake late must never take a chunk of the wrong loop.
  Threads pool(3);
  std::atomic<int64_t> sum{0};
  for (int64_t round = 0; round < 20000; ++round)
    parallelFor(4, [&](int64_t b, int64_t e) { sum.fetch_add((e - b) * (round % 7 + 1)); });
  int64_t expected = 0;
  for (int64_t round = 0; round < 20000; ++round)
    expected += 4 * (round % 7 + 1);
  EXPECT_EQ(sum.load(), expected);
}

TEST(ParallelTest, ASlowThreadLeavesItsChunksToTheOthers) {
  // 2 threads, 8 chunks of 8: the caller's own run is chunks 0-3. Its first
  // chunk waits (up to 10 s) until every other chunk is done, which happens
  // only if the worker takes chunks 1-3 from the caller's run.
  Threads pool(2);
  std::vector<std::atomic<int>> hits(64);
  std::atomic<int> othersDone{0};
  bool othersFinishedFirst = false;
  parallelFor(64, [&](int64_t b, int64_t e) {
    if (b == 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (othersDone.load() < 7 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      othersFinishedFirst = othersDone.load() == 7;
    }
    for (int64_t i = b; i < e; ++i)
      hits[i].fetch_add(1);
    if (b != 0)
      othersDone.fetch_add(1);
  });
  for (auto &h : hits)
    EXPECT_EQ(h.load(), 1);
  EXPECT_TRUE(othersFinishedFirst);
}

TEST(ParallelTest, ErrorsReachTheCaller) {
  Threads pool(2);
  for (int64_t bad : {0, 63}) { // the caller's first chunk, a worker's last
    std::atomic<int> ran{0};
    EXPECT_THROW(parallelFor(64, [&](int64_t b, int64_t e) {
                   ran.fetch_add(static_cast<int>(e - b));
                   if (b <= bad && bad < e)
                     throw std::runtime_error("chunk failed");
                 }),
                 std::runtime_error);
    EXPECT_EQ(ran.load(), 64); // the other chunks ran to the end
    checkCoverage(100, 1);     // and the pool still works
  }
}

TEST(ParallelTest, NestedLoopsRunSerially) {
  Threads pool(2);
  std::atomic<int> inner{0};
  parallelFor(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallelFor(10, [&](int64_t ib, int64_t ie) { inner.fetch_add(static_cast<int>(ie - ib)); });
  });
  EXPECT_EQ(inner.load(), 40);
}

TEST(ParallelTest, ResizeRightAfterStart) {
  // A worker that starts after the pool is already being stopped must see
  // the stop (it once slept forever).
  for (int i = 0; i < 200; ++i) {
    setNumThreads(2);
    setNumThreads(1);
  }
  Threads pool(2);
  checkCoverage(50, 1);
}

TEST(ParallelTest, OneThreadRunsTheLoopInline) {
  // One call over the whole range on the calling thread (a pool never
  // resized once crashed here).
  setNumThreads(1);
  int calls = 0;
  parallelFor(100, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 100);
  });
  EXPECT_EQ(calls, 1);
}
