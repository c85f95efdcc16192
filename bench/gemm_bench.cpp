// Microbenchmark of moert::cpu::linear with bf16 (or f32, or FP8 e4m3 with
// 128 x 128 block scales, as a BF16 model's, or int8 with a scale per row and
// 128 columns, as --weight-format int8 makes them) weights of a
// Mixtral-layout MLP (hidden 1024, intermediate 2816): GFLOP/s of the
// prefill GEMM (512 tokens) and GB/s of weights read by the decode GEMV
// (1..8 tokens), on 1 and 2 threads. Decode cycles through enough weight
// copies to miss the last-level cache, as a model's layers do. With --mmap
// the weights live in a file mapped read-only (page-cache pages, as moert
// maps a checkpoint) instead of heap memory.
//
//   moe-gemm-bench [repetitions] [--f32 | --fp8 | --int8] [--mmap]
#include "moert/Parallel.h"
#include "moert/Tensor.h"
#include "moert/cpu/Kernels.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
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

/// One weight matrix: bf16 or f32 values in `data` (heap or mmapped).
struct Weights {
  int64_t rows, cols;
  DType dtype;
  const void *data = nullptr;
  const BlockScales *blocks = nullptr; ///< FP8
  cpu::Matrix matrix() const {
    cpu::Matrix m;
    if (blocks)
      m.scales = *blocks;
    m.dtype = dtype;
    m.data = data;
    m.rows = rows;
    m.cols = cols;
    m.rowStride = cols;
    return m;
  }
};

/// Bytes of random weights in U(-0.05, 0.05) for `count` matrices of
/// rows x cols, in heap memory or written to an unlinked file and mapped.
struct WeightStore {
  std::vector<char> heap;
  void *mapped = nullptr;
  size_t bytes = 0;
  WeightStore(size_t bytes, DType dtype, bool useMmap, std::mt19937 &rng) : bytes(bytes) {
    std::vector<char> values(bytes);
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    if (dtype == DType::F8E4M3)
      for (size_t i = 0; i < bytes; ++i)
        values[i] = static_cast<char>(floatToE4m3(dist(rng) * 448 / 0.05f));
    else if (dtype == DType::I8)
      for (size_t i = 0; i < bytes; ++i)
        values[i] = static_cast<char>(std::lround(dist(rng) * 127 / 0.05f));
    else if (dtype == DType::F32)
      for (size_t i = 0; i < bytes / 4; ++i) {
        const float v = dist(rng);
        std::memcpy(values.data() + 4 * i, &v, 4);
      }
    else
      for (size_t i = 0; i < bytes / 2; ++i) {
        const uint16_t v = floatToBf16(dist(rng));
        std::memcpy(values.data() + 2 * i, &v, 2);
      }
    if (!useMmap) {
      heap = std::move(values);
      return;
    }
    char path[] = "/tmp/moe-gemm-bench-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0 || unlink(path) != 0 ||
        write(fd, values.data(), bytes) != static_cast<ssize_t>(bytes)) {
      std::perror("moe-gemm-bench: weight file");
      std::exit(2);
    }
    mapped = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED) {
      std::perror("moe-gemm-bench: mmap");
      std::exit(2);
    }
  }
  ~WeightStore() {
    if (mapped)
      munmap(mapped, bytes);
  }
  const char *data() const { return mapped ? static_cast<const char *>(mapped) : heap.data(); }
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
  int reps = 5;
  DType dtype = DType::BF16;
  bool useMmap = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--f32"))
      dtype = DType::F32;
    else if (!std::strcmp(argv[i], "--fp8"))
      dtype = DType::F8E4M3;
    else if (!std::strcmp(argv[i], "--int8"))
      dtype = DType::I8;
    else if (!std::strcmp(argv[i], "--mmap"))
      useMmap = true;
    else
      reps = std::max(1, std::atoi(argv[i]));
  }
  const char *dtypeName = dtype == DType::F32      ? "f32"
                          : dtype == DType::F8E4M3 ? "fp8"
                          : dtype == DType::I8     ? "int8"
                                                   : "bf16";
  const int64_t size = static_cast<int64_t>(dtypeSize(dtype));
  // FP8: one scale (0.05 / 448) per 128 x 128 block of a BF16 model's weight.
  std::vector<float> scales(22 * 22, 0.05f / 448);
  // int8: one (0.05 / 127) per row and 128 columns.
  std::vector<float> rowScales(2816 * 22, 0.05f / 127);
  const BlockScales blocks[2] = {{scales.data(), 8, 128, 128, 0, 0, DType::BF16},
                                 {scales.data(), 22, 128, 128, 0, 0, DType::BF16}};
  const BlockScales int8Blocks[2] = {{rowScales.data(), 8, 1, 128, 0, 0, DType::BF16},
                                     {rowScales.data(), 22, 1, 128, 0, 0, DType::BF16}};
  std::mt19937 rng(42);
  const int64_t shapes[][2] = {{2816, 1024}, {1024, 2816}}; // [out, in]
  // 24 copies of each matrix (132 MiB in bf16), well past a 32 MiB L3.
  const int copies = 24;
  const size_t matrixBytes = static_cast<size_t>(2816 * 1024 * size);
  WeightStore store(2 * copies * matrixBytes, dtype, useMmap, rng);
  std::vector<Weights> up, down;
  for (int c = 0; c < copies; ++c) {
    const BlockScales *scaled = dtype == DType::F8E4M3 ? blocks
                                : dtype == DType::I8   ? int8Blocks
                                                       : nullptr;
    up.push_back({shapes[0][0], shapes[0][1], dtype, store.data() + (2 * c) * matrixBytes,
                  scaled ? &scaled[0] : nullptr});
    down.push_back({shapes[1][0], shapes[1][1], dtype, store.data() + (2 * c + 1) * matrixBytes,
                    scaled ? &scaled[1] : nullptr});
  }
  std::printf("weights: %s, %s\n", dtypeName, useMmap ? "mmapped file (page cache)" : "heap");
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
      std::printf("threads=%d  T=%-4lld W=[%lld,%lld] %s  %8.1f GFLOP/s  (%.2f ms)\n", threads,
                  static_cast<long long>(T), static_cast<long long>(N), static_cast<long long>(K),
                  dtypeName, 2.0 * T * N * K / t * 1e-9, t * 1e3);
    }
    for (int64_t T : {1, 2, 4, 8, 12, 16, 17, 24, 32, 48}) {
      for (int s = 0; s < 2; ++s) {
        const std::vector<Weights> &w = s == 0 ? up : down;
        const int64_t N = shapes[s][0], K = shapes[s][1];
        // One timed call per copy: each reads a matrix the others evicted.
        double t = bestTime(reps, [&] {
          for (int c = 0; c < copies; ++c)
            cpu::linear(x.data(), T, w[c].matrix(), nullptr, y.data());
        }) / copies;
        std::printf("threads=%d  T=%-4lld W=[%lld,%lld] %s  %8.1f GB/s      (%.3f ms, %.1f GFLOP/s)\n",
                    threads, static_cast<long long>(T), static_cast<long long>(N),
                    static_cast<long long>(K), dtypeName, double(size) * N * K / t * 1e-9, t * 1e3,
                    2.0 * T * N * K / t * 1e-9);
      }
    }
  }
  return 0;
}
