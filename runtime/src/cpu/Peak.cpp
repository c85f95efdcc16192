// The measured multiply-add peak (moert/cpu/Peak.h): 12 independent
// accumulators per thread hide the FMA latency.
#include "moert/cpu/Peak.h"
#include "moert/Parallel.h"
#include "moert/cpu/Isa.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace moert::cpu {
namespace {

/// The sum of 12 accumulators' lanes (through memory: GCC 12 warns about
/// _mm512_reduce_add_ps's internals).
__attribute__((target("avx512f"))) double sum12(const __m512 (&acc)[12]) {
  alignas(64) float lanes[16];
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm512_store_ps(lanes, acc[i]);
    for (float lane : lanes)
      sum += lane;
  }
  return sum;
}

/// `iterations` x 12 FMAs of 16 (AVX-512) or 8 (AVX2) lanes: 12 independent
/// accumulators hide the FMA latency (4-5 cycles x 2 ports).
__attribute__((target("avx512f"))) double fmaLoopAvx512(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i)
    acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i)
      acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  return sum12(acc);
}

__attribute__((target("avx2,fma"))) double fmaLoopAvx2(int64_t iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i)
    acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i)
      acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  alignas(32) float lanes[8];
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float lane : lanes)
      sum += lane;
  }
  return sum;
}

/// `iterations` x 12 vdpbf16ps: each is 32 bf16 products summed pairwise
/// into 16 f32 lanes (64 FLOP).
__attribute__((target("avx512f,avx512bf16"))) double bf16DotLoop(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i)
    acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i)
      acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  return sum12(acc);
}

/// Multiply-adds of the generic kernels (what the compiler makes of plain
/// C++ for x86-64: no FMA instruction; counted as scalar).
double fmaLoopScalar(int64_t iterations) {
  float acc[12];
  for (int i = 0; i < 12; ++i)
    acc[i] = 0.001f * i;
  for (int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i)
      acc[i] = acc[i] * 0.999999f + 1e-7f;
  float sum = 0;
  for (float v : acc)
    sum += v;
  return sum;
}

} // namespace

PeakFlops measurePeakFlops(int threads, int64_t iterations, int repeats) {
  const Isa isa = activeIsa();
  const int lanes = isa >= Isa::Avx512 ? 16 : isa == Isa::Avx2 ? 8 : 1;
  if (lanes == 1)
    iterations *= 2;
  auto best = [&](auto loop, double flopPerIteration) {
    double flops = 0;
    for (int rep = 0; rep < repeats; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      parallelFor(threads, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          volatile double sink = loop(iterations);
          (void)sink;
        }
      });
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      flops = std::max(flops, threads * iterations * flopPerIteration / s);
    }
    return flops;
  };
  PeakFlops peak;
  peak.fma = lanes == 16  ? best(fmaLoopAvx512, 12.0 * 16 * 2)
             : lanes == 8 ? best(fmaLoopAvx2, 12.0 * 8 * 2)
                          : best(fmaLoopScalar, 12.0 * 2);
  if (isa >= Isa::Avx512Bf16)
    peak.bf16 = best(bf16DotLoop, 12.0 * 64);
  return peak;
}

} // namespace moert::cpu
