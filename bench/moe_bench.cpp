// moe-bench: the CPU runtime's speed on a generated model, printed beside the
// machine's measured limits and the peers' figures.
//
//   moe-bench weights PLAN DIR [--dtype bf16|f32] [--seed S]
//       writes DIR/model.safetensors with random weights for PLAN's model
//       (FP8 blocks and their scales where PLAN's slices say F8_E4M3)
//   moe-bench run PLAN DIR [--threads N]
//       prefill of 512 and 128 tokens (last position's logits only, as
//       llama.cpp measures), decode of 128 tokens, peak RSS
//   moe-bench machine [--threads N]
//       measured fp32 FMA peak, STREAM triad and read-only bandwidth
//   moe-bench routing [--tokens T] [--threads N]
//       router GEMM + softmax + top-2 + renormalise + per-expert positions +
//       gather into expert order, at Mixtral-8x7B's sizes (hidden 4096,
//       8 experts, bf16 activations), in tokens/s
#include "moert/Checkpoint.h"
#include "moert/Comm.h"
#include "moert/RankExecutor.h"
#include "moert/StepTimes.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/Plan.h"
#include "moert/SafetensorsWriter.h"
#include "moert/cpu/Dispatch.h"
#include "moert/cpu/Isa.h"
#include "moert/cpu/Kernels.h"
#include "moert/cpu/Peak.h"

#include <fmt/core.h>

#include <immintrin.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

using namespace moert;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double peakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

const char *option(int argc, char **argv, const char *name, const char *fallback) {
  for (int i = 0; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name))
      return argv[i + 1];
  return fallback;
}

// ---------------------------------------------------------------- weights

int makeWeights(int argc, char **argv) {
  Plan plan = Plan::load(argv[2]);
  std::string dir = argv[3];
  std::string dtypeName = option(argc, argv, "--dtype", "bf16");
  DType dtype = dtypeName == "f32" ? DType::F32 : DType::BF16;
  uint64_t seed = std::stoull(option(argc, argv, "--seed", "1"));
  std::vector<TensorToWrite> tensors;
  for (const PlanWeight &w : plan.weights) {
    int64_t count = std::max<int64_t>(1, w.experts);
    for (int64_t e = 0; e < count; ++e) {
      std::string name = w.experts ? w.expertName(e) : w.name;
      std::vector<int64_t> shape = w.tensorShape();
      // Norm weights are 1 (as initialised), matrices ~ U(-a, a) with the
      // 1/sqrt(fan_in) scale of a trained layer, so activations stay O(1).
      bool isNorm = shape.size() == 1;
      double scale = isNorm ? 0 : std::sqrt(3.0 / shape.back());
      uint64_t tensorSeed = seed * 1000003 + tensors.size();
      // An FP8 plan's weight (a config with quantization_config): e4m3
      // values of U(-a, a) with one scale a / 448 for every block.
      const PlanSlice *slice = plan.layout ? plan.layout->slice(0, name) : nullptr;
      if (slice && !slice->block.empty()) {
        const float blockScale = static_cast<float>(scale / 448);
        tensors.push_back({name, DType::F8E4M3, shape, [=](char *out) {
          std::mt19937_64 rng(tensorSeed);
          std::uniform_real_distribution<float> uniform(-448.0f, 448.0f);
          for (int64_t i = 0; i < shape[0] * shape[1]; ++i)
            out[i] = static_cast<char>(floatToE4m3(uniform(rng)));
        }});
        std::vector<int64_t> grid{(shape[0] + slice->block[0] - 1) / slice->block[0],
                                  (shape[1] + slice->block[1] - 1) / slice->block[1]};
        tensors.push_back({name + "_scale_inv", DType::F32, grid, [=](char *out) {
          for (int64_t i = 0; i < grid[0] * grid[1]; ++i)
            std::memcpy(out + 4 * i, &blockScale, 4);
        }});
        continue;
      }
      tensors.push_back({name, dtype, shape, [=](char *out) {
        std::mt19937_64 rng(tensorSeed);
        std::uniform_real_distribution<float> uniform(-scale, scale);
        int64_t n = 1;
        for (int64_t d : shape)
          n *= d;
        for (int64_t i = 0; i < n; ++i) {
          float v = isNorm ? 1.0f : uniform(rng);
          if (dtype == DType::BF16) {
            uint16_t b = floatToBf16(v);
            std::memcpy(out + 2 * i, &b, 2);
          } else {
            std::memcpy(out + 4 * i, &v, 4);
          }
        }
      }});
    }
  }
  writeSafetensors(dir + "/model.safetensors", tensors);
  fmt::print("wrote {} tensors to {}/model.safetensors ({})\n", tensors.size(), dir, dtypeName);
  return 0;
}

// ---------------------------------------------------------------- machine

/// Sum of n floats with 4 independent accumulators (a read stream).
__attribute__((target("avx2"))) double sumAvx2(const float *p, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(p + i + 8 * j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  double sum = 0;
  for (float lane : lanes)
    sum += lane;
  for (; i < n; ++i)
    sum += p[i];
  return sum;
}

struct MachineFigures {
  double flops = 0, triad = 0;
  double read = 0; // read-only streaming (what decode's weight reads are)
  double bf16Flops = 0; // the bf16 dot instruction's peak, where the level has one
  cpu::Isa isa = cpu::Isa::Generic;
};

MachineFigures measureMachine(int threads) {
  setNumThreads(threads);
  MachineFigures m;
  m.isa = cpu::activeIsa();
  // The multiply-add peaks of the level the kernels use (moert/cpu/Peak.h).
  const cpu::PeakFlops peak = cpu::measurePeakFlops(threads);
  m.flops = peak.fma;
  m.bf16Flops = peak.bf16;
  // STREAM triad a = b + s*c over arrays far larger than the caches.
  const int64_t n = 32 << 20;
  std::vector<float> a(n, 1), b(n, 2), c(n, 3);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    parallelFor(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        a[i] = b[i] + 3.0f * c[i];
    });
    best = std::max(best, 3.0 * n * 4 / seconds(t0, Clock::now()));
  }
  m.triad = best;
  // Read-only: the sum of b (decode reads its weights and writes little).
  best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> sums(64, 0);
    auto t0 = Clock::now();
    parallelFor(n, [&](int64_t lo, int64_t hi) {
      volatile double sink = m.isa >= cpu::Isa::Avx2 ? sumAvx2(b.data() + lo, hi - lo) : 0;
      (void)sink;
    });
    best = std::max(best, n * 4.0 / seconds(t0, Clock::now()));
  }
  m.read = m.isa >= cpu::Isa::Avx2 ? best : 0;
  return m;
}

int machine(int argc, char **argv) {
  int threads = std::atoi(option(argc, argv, "--threads", "2"));
  MachineFigures m = measureMachine(threads);
  fmt::print("machine ({} threads): fp32 FMA peak {:.0f} GFLOP/s ({}), STREAM triad {:.1f} GB/s",
             threads, m.flops / 1e9, cpu::isaName(m.isa), m.triad / 1e9);
  if (m.read > 0)
    fmt::print(", read {:.1f} GB/s", m.read / 1e9);
  if (m.bf16Flops > 0)
    fmt::print(", bf16 dot peak {:.0f} GFLOP/s (vdpbf16ps)", m.bf16Flops / 1e9);
  fmt::print("\n");
  return 0;
}

// ---------------------------------------------------------------- model

/// Elements of weight `j` of step `s` that one token reads: all of it, the
/// routing width's share of an expert stack, one row of an embedding table.
double tokenElements(const PlanProgram &program, const PlanStep &s, size_t j) {
  const PlanWeight &w = program.weights[s.weights[j]];
  TensorView v{w.dtype, w.shape, nullptr};
  double numel = static_cast<double>(v.numel());
  if (s.op->name == "experts") // k of the experts: the routing width
    numel = numel / w.experts * program.buffers[s.in[1]].width;
  if (s.op->name == "embedding")
    numel = w.shape[1]; // one row
  return numel;
}

/// The bytes of one element of program weight `w` as held: its dtype's, an
/// FP8 slice's (plus its block scales, ignored), or an int8 weight's (with
/// its f32 scale per block).
double storedElementBytes(const Plan &plan, const PlanWeight &w) {
  if (w.int8Block)
    return 1.0 + 4.0 / static_cast<double>(w.int8Block);
  const PlanSlice *slice =
      plan.layout ? plan.layout->slice(0, w.experts ? w.expertName(0) : w.name) : nullptr;
  return static_cast<double>(dtypeSize(slice && !slice->block.empty() ? slice->dtype : w.dtype));
}

/// Bytes of weights step `i` reads for one token.
double stepWeightBytes(const Plan &plan, const PlanProgram &program, size_t i) {
  const PlanStep &s = program.steps[i];
  double bytes = 0;
  for (size_t j = 0; j < s.weights.size(); ++j)
    bytes += tokenElements(program, s, j) * storedElementBytes(plan, program.weights[s.weights[j]]);
  return bytes;
}

/// Active parameters and weight bytes per token: what one token's forward
/// reads.
double activeParams(const PlanProgram &program) {
  double n = 0;
  for (const PlanStep &s : program.steps)
    for (size_t j = 0; j < s.weights.size(); ++j)
      n += tokenElements(program, s, j);
  return n;
}
double totalParams(const PlanProgram &program) {
  double n = 0;
  for (const PlanWeight &w : program.weights)
    n += static_cast<double>(TensorView{w.dtype, w.shape, nullptr}.numel());
  return n;
}
double activeBytes(const Plan &plan, const PlanProgram &program) {
  double bytes = 0;
  for (size_t i = 0; i < program.steps.size(); ++i)
    bytes += stepWeightBytes(plan, program, i);
  return bytes;
}

/// " op 12% ..." for the op kinds with at least 1% of the time spent
/// between two readings of the device's per-step seconds (`since` empty:
/// from the start). With `tokens`, each kind also says at what rate it read
/// its weights for that many tokens, one token at a time (decode).
std::string opSplit(const Plan &plan, const PlanProgram &program, const std::vector<double> &now,
                    const std::vector<double> &since, int64_t tokens = 0) {
  const std::vector<OpTime> kinds = timeByOp(program, now, since, [&](size_t i) {
    return stepWeightBytes(plan, program, i) * static_cast<double>(tokens);
  });
  double total = 0;
  for (const OpTime &k : kinds)
    total += k.seconds;
  std::string split;
  for (const OpTime &k : kinds) {
    if (total <= 0 || k.seconds / total < 0.01)
      continue;
    split += fmt::format(" {} {:.0f}%", k.op, 100 * k.seconds / total);
    if (tokens > 0 && k.bytes > 0)
      split += fmt::format(" ({:.1f} GB/s)", k.bytes / k.seconds / 1e9);
  }
  return split;
}

int runModel(int argc, char **argv) {
  Plan plan = Plan::load(argv[2]);
  std::string dir = argv[3];
  int threads = std::atoi(option(argc, argv, "--threads", "2"));
  setNumThreads(threads);
  auto checkpoint = Checkpoint::open(dir);
  auto device = RankExecutor::create(DeviceKind::Cpu);
  auto comm = createComm(&argc, &argv); // a world of one: the bench runs rank 0
  device->prepare(plan, 0, *checkpoint, *comm);
  const PlanProgram &program = plan.programOf(0);
  std::vector<float> logits;
  std::mt19937 rng(7);
  auto prompt = [&](int64_t n) {
    Batch b;
    for (int64_t i = 0; i < n; ++i) {
      b.tokens.push_back(static_cast<int32_t>(rng() % plan.vocabSize));
      b.positions.push_back(static_cast<int32_t>(i));
      b.slots.push_back(0);
    }
    b.logitRows = {n - 1};
    return b;
  };
  std::string dtype = dtypeName(plan.weights[0].dtype);
  fmt::print("model: {} ({} weights, {:.0f} M parameters, {:.0f} M active per token), "
             "dtype {}, {} threads\n",
             plan.modelType, plan.weights.size(), totalParams(program) / 1e6,
             activeParams(program) / 1e6, dtype, threads);
  device->forward(prompt(16), logits); // warm-up: page in the weights
  for (int64_t n : {512, 128}) {
    if (n > plan.maxBatchTokens)
      continue;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      Batch b = prompt(n);
      auto t0 = Clock::now();
      device->forward(b, logits);
      best = std::min(best, seconds(t0, Clock::now()));
    }
    fmt::print("prefill {:4} tokens: {:7.1f} tok/s\n", n, n / best);
  }
  // Where prefill time goes (the runs above), by op kind.
  fmt::print("  prefill time by op:{}\n", opSplit(plan, program, device->stepSeconds(), {}));
  // Decode 128 tokens after a 16-token prompt, one token per step.
  device->forward(prompt(16), logits);
  const int64_t steps = 128;
  const std::vector<double> before = device->stepSeconds();
  auto t0 = Clock::now();
  int32_t token = 1;
  for (int64_t i = 0; i < steps; ++i) {
    Batch b;
    b.tokens = {token};
    b.positions = {static_cast<int32_t>(16 + i)};
    b.slots = {0};
    b.logitRows = {0};
    device->forward(b, logits);
    token = static_cast<int32_t>(cpu::argmax(logits.data(), plan.vocabSize));
  }
  double s = seconds(t0, Clock::now());
  std::string decodeSplit = opSplit(plan, program, device->stepSeconds(), before, steps);
  fmt::print("decode  {:4} tokens: {:7.1f} tok/s ({:.1f} GB/s of active weights)\n", steps,
             steps / s, activeBytes(plan, program) * steps / s / 1e9);
  // Each kind's share of the time and the rate at which it read its weights.
  fmt::print("  decode time by op:{}\n", decodeSplit);
  fmt::print("peak RSS: {:.0f} MiB (weights {:.0f} MiB mapped, buffers + KV cache {:.0f} MiB)\n",
             peakRssMiB(), device->weightBytes() / 1048576.0,
             device->workspaceBytes() / 1048576.0);
  return 0;
}

// ---------------------------------------------------------------- routing

/// Router + dispatch at Mixtral-8x7B's sizes: logits from bf16 activations
/// and a bf16 gate, softmax, top-2, renormalise, per-expert positions by a
/// prefix sum, and the bf16 rows gathered into expert order, all in
/// cpu::routeAndDispatchBf16. Measured at 1024 tokens (input + output fit
/// in L3), 4096 and 16384 (they do not), or at --tokens T alone; best of
/// several runs after an untimed one (pages and caches warm).
int routing(int argc, char **argv) {
  const int64_t hidden = 4096, experts = 8, k = 2;
  std::vector<int64_t> counts = {1024, 4096, 16384};
  if (const char *t = option(argc, argv, "--tokens", nullptr))
    counts = {std::atoll(t)};
  int threads = std::atoi(option(argc, argv, "--threads", "2"));
  // The DRAM bound: per token, x read twice (routing, then the copies) and
  // k rows written (non-temporal) at the measured STREAM triad bandwidth.
  const double triad = measureMachine(threads).triad;
  const double bytesPerToken = static_cast<double>(hidden) * 2 * (2 + k);
  setNumThreads(threads);
  // 64-byte-aligned views into vectors (the copies then stream whole lines).
  auto aligned = [](std::vector<uint16_t> &v) {
    uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<uint16_t *>((p + 63) & ~uintptr_t(63));
  };
  std::vector<uint16_t> gate(experts * hidden);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto &v : gate) v = floatToBf16(u(rng) * 0.02f);
  for (int64_t tokens : counts) {
    std::vector<uint16_t> xStore(tokens * hidden + 32), outStore(tokens * k * hidden + 32);
    uint16_t *x = aligned(xStore), *dispatched = aligned(outStore);
    for (int64_t i = 0; i < tokens * hidden; ++i)
      x[i] = floatToBf16(u(rng));
    std::vector<float> weights(tokens * k);
    std::vector<int32_t> chosen(tokens * k), rows(tokens * k);
    std::vector<int64_t> offsets(experts + 1);
    auto once = [&] {
      cpu::routeAndDispatchBf16(x, tokens, hidden, gate.data(), experts, k, weights.data(),
                                chosen.data(), rows.data(), offsets.data(), dispatched);
    };
    once(); // touches every output page
    double best = 1e30;
    const int reps = tokens <= 4096 ? 20 : 8;
    for (int rep = 0; rep < reps; ++rep) {
      auto t0 = Clock::now();
      once();
      best = std::min(best, seconds(t0, Clock::now()));
    }
    const double rate = tokens / best;
    fmt::print("routing + dispatch (hidden {}, {} experts, top-{}, bf16, {} tokens, {} threads, "
               "{}): {:.2f} M tokens/s, {:.0f}% of the DRAM bound ({:.2f} M tokens/s: {:.0f} KiB "
               "per token at {:.1f} GB/s)\n",
               hidden, experts, k, tokens, threads, cpu::isaName(cpu::activeIsa()), rate / 1e6,
               100 * rate / (triad / bytesPerToken), triad / bytesPerToken / 1e6,
               bytesPerToken / 1024, triad / 1e9);
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    if (argc >= 4 && !std::strcmp(argv[1], "weights"))
      return makeWeights(argc, argv);
    if (argc >= 4 && !std::strcmp(argv[1], "run"))
      return runModel(argc, argv);
    if (argc >= 2 && !std::strcmp(argv[1], "machine"))
      return machine(argc, argv);
    if (argc >= 2 && !std::strcmp(argv[1], "routing"))
      return routing(argc, argv);
  } catch (const std::exception &e) {
    fmt::print(stderr, "moe-bench: error: {}\n", e.what());
    return 2;
  }
  fmt::print(stderr, "usage: moe-bench weights PLAN DIR [--dtype bf16|f32] | run PLAN DIR | "
                     "machine | routing  (see bench/README.md)\n");
  return 2;
}
