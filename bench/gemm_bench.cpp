// Microbenchmark of moert::cpu::linear with bf16 weights of a Mixtral-layout
// MLP (hidden 1024, intermediate 2816): GFLOP/s of the prefill GEMM
// (512 tokens) and GB/s of weights read by the decode GEMV (1..8 tokens),
// on 1 and 2 threads. Decode cycles through enough weight copies to miss the
// last-level cache, as a model's layers do.
//
//   moe-gemm-bench [repetitions]
#include "moert/Parallel.h"
#include "moert/Tensor.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace moert;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Weights {
  int64_t rows, cols;
  std::vector<uint16_t> data;
  Weights(int64_t rows, int64_t cols, std::mt19937 &rng) : rows(rows), cols(cols) {
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    data.resize(static_cast<size_t>(rows * cols));
    for (uint16_t &v : data)
      v = floatToBf16(dist(rng));
  }
  cpu::Matrix matrix() const {
    cpu::Matrix m;
    m.dtype = DType::BF16;
    m.data = data.data();
    m.rows = rows;
    m.cols = cols;
    m.rowStride = cols;
    return m;
  }
};

/// Best time of `reps` calls of f (after one warm-up call).
template <typename F>
double bestTime(int reps, F &&f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return best;
}

} // namespace

int main(int argc, char **argv) {
  int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::mt19937 rng(42);
  const int64_t shapes[][2] = {{2816, 1024}, {1024, 2816}}; // [out, in]
  // 24 copies of a 5.5 MiB matrix: 132 MiB, well past a 32 MiB L3.
  const int copies = 24;
  std::vector<Weights> up, down;
  for (int c = 0; c < copies; ++c) {
    up.emplace_back(shapes[0][0], shapes[0][1], rng);
    down.emplace_back(shapes[1][0], shapes[1][1], rng);
  }
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(512 * 2816), y(512 * 2816);
  for (float &v : x)
    v = dist(rng);

  for (int threads : {1, 2}) {
    setNumThreads(threads);
    for (int s = 0; s < 2; ++s) {
      const std::vector<Weights> &w = s == 0 ? up : down;
      const int64_t N = shapes[s][0], K = shapes[s][1];
      const int64_t T = 512;
      double t = bestTime(reps, [&] { cpu::linear(x.data(), T, w[0].matrix(), nullptr, y.data()); });
      std::printf("threads=%d  T=%-4lld W=[%lld,%lld] bf16  %8.1f GFLOP/s  (%.2f ms)\n", threads,
                  static_cast<long long>(T), static_cast<long long>(N), static_cast<long long>(K),
                  2.0 * T * N * K / t * 1e-9, t * 1e3);
    }
    for (int64_t T : {1, 2, 4, 8}) {
      for (int s = 0; s < 2; ++s) {
        const std::vector<Weights> &w = s == 0 ? up : down;
        const int64_t N = shapes[s][0], K = shapes[s][1];
        // One timed call per copy: each reads a matrix the others evicted.
        double t = bestTime(reps, [&] {
          for (int c = 0; c < copies; ++c)
            cpu::linear(x.data(), T, w[c].matrix(), nullptr, y.data());
        }) / copies;
        std::printf("threads=%d  T=%-4lld W=[%lld,%lld] bf16  %8.1f GB/s      (%.3f ms, %.1f GFLOP/s)\n",
                    threads, static_cast<long long>(T), static_cast<long long>(N),
                    static_cast<long long>(K), 2.0 * N * K / t * 1e-9, t * 1e3,
                    2.0 * T * N * K / t * 1e-9);
      }
    }
  }
  return 0;
}
