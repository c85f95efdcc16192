// cuda-host-check PLAN KERNELS.so WEIGHTS [--program N] [--tol X] [--prefill A,B]
//
// Runs a plan program step by step on the CPU backend's kernels (each op's
// OpDef::cpu, runtime/src/ops, as the CPU device runs them, as rank 0) and, for
// every step, the step's entry of the plan's CUDA kernel table on the CPU
// execution layer (cuda_host.h: the emitted kernels compiled by g++ into
// KERNELS.so; GEMM entries on the CPU GEMM, cpu::linear), starting from the
// buffers and KV caches the CPU backend had before the step. Compares every
// output (f32: max abs diff <= --tol, default 1e-5; i32: exact; the KV
// caches) and prints one line per step. Two forward passes: a prefill of two
// sequences (--prefill A,B tokens, default 7,5), then a mixed decode/prefill
// step (1 + 3 tokens) against the cache; a training plan (moec --train): one
// step of whole sequences with labels, forward, loss and backward, every
// output within --tol of its largest magnitude (gradients are small; one
// the CPU computes as exactly 0 must be 0). Exit 0 when every step matched.
#include "moert/Checkpoint.h"
#include "moert/Plan.h"
#include "moert/cpu/Isa.h"
#include "moert/cpu/Kernels.h"
#include "moert/cpu/StepContext.h"

#include <nlohmann/json.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace moert;
using json = nlohmann::json;

namespace {

using Trampoline = void (*)(const unsigned long long *);
using LaunchFn = void (*)(Trampoline, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          const unsigned long long *);

std::string fmtG(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

[[noreturn]] void die(const std::string &message) {
  std::fprintf(stderr, "cuda-host-check: %s\n", message.c_str());
  std::exit(1);
}

struct Weight {
  TensorView view;
  std::vector<cpu::Matrix> experts;
};

/// Activation state: plan buffers and KV caches.
struct State {
  std::vector<std::vector<float>> buffers;
  std::vector<cpu::KVCache> caches;
};

struct BatchInput {
  std::vector<int32_t> tokens, positions, slots, logitRows, labels;
};

class Checker : private cpu::StepContext {
public:
  Checker(const Plan &plan, int64_t programIndex, const json &table, void *lib,
          const Checkpoint &ckpt, double tol)
      : plan(plan), program(plan.programs.at(programIndex)), table(table), lib(lib), tol(tol) {
    StepContext::plan = &plan;
    StepContext::program = &program;
    launchFn = reinterpret_cast<LaunchFn>(dlsym(lib, "moe_host_launch"));
    if (!launchFn)
      die("kernels library has no moe_host_launch (built without cuda_host.h?)");
    for (const PlanWeight &w : program.weights) {
      Weight bound;
      if (w.experts > 0) {
        for (int64_t e = 0; e < w.experts; ++e)
          bound.experts.push_back(cpu::Matrix::of(ckpt.tensor(w.expertName(e), w.tensorShape())));
      } else {
        bound.view = ckpt.tensor(w.name, w.shape);
      }
      weights.push_back(std::move(bound));
    }
    // Stacks as one contiguous tensor too (what a device holds).
    for (size_t i = 0; i < program.buffers.size(); ++i)
      cpu.buffers.emplace_back(program.buffers[i].rows * program.buffers[i].width, 0.0f);
    for (const PlanCache &c : program.caches) {
      cpu.caches.emplace_back();
      cpu.caches.back().allocate(plan.maxSequences, plan.maxSeqLen, c.keyWidth, c.valueWidth);
    }
    for (const json &s : table.at("scratch"))
      scratchBytes.push_back(s.at("bytes").get<int64_t>());
    // Rope tables of the kernel table: the parameters of the steps that use
    // them; cos/sin read back from cpu::RopeTable (unit vectors rotated).
    const json &steps = table.at("steps");
    std::map<int64_t, cpu::RopeParams> ropeOf;
    for (size_t i = 0; i < steps.size(); ++i)
      for (const json &l : steps[i].at("launches"))
        if (l.contains("params"))
          for (const json &p : l.at("params")) {
            std::string ref = p.get<std::string>();
            if (ref.rfind("rope_cos:", 0) == 0)
              ropeOf[std::stoll(ref.substr(9))] = program.steps[i].rope;
          }
    ropeCos.resize(table.at("rope_tables").size());
    ropeSin.resize(ropeCos.size());
    for (auto &[id, params] : ropeOf) {
      cpu::RopeTable rt(params, plan.maxSeqLen);
      const int64_t R = params.rotaryDim, half = R / 2, P = plan.maxSeqLen;
      std::vector<float> x(P * R, 0.0f);
      std::vector<int32_t> pos(P);
      for (int64_t p = 0; p < P; ++p) {
        pos[p] = static_cast<int32_t>(p);
        for (int64_t i = 0; i < half; ++i)
          x[p * R + (params.interleaved ? 2 * i : i)] = 1.0f;
      }
      rt.apply(x.data(), P, R, R, pos.data());
      ropeCos[id].resize(P * half);
      ropeSin[id].resize(P * half);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t i = 0; i < half; ++i) {
          ropeCos[id][p * half + i] = x[p * R + (params.interleaved ? 2 * i : i)];
          ropeSin[id][p * half + i] = x[p * R + (params.interleaved ? 2 * i + 1 : i + half)];
        }
    }
  }

  /// One forward pass; returns the number of mismatching steps.
  int forward(const BatchInput &batch, const std::string &label) {
    const int64_t T = static_cast<int64_t>(batch.tokens.size());
    std::copy(batch.tokens.begin(), batch.tokens.end(), ints(cpu, program.tokensBuffer));
    std::copy(batch.positions.begin(), batch.positions.end(), ints(cpu, program.positionsBuffer));
    if (program.labelsBuffer >= 0)
      std::copy(batch.labels.begin(), batch.labels.end(), ints(cpu, program.labelsBuffer));
    cpu::TokenLayout layout{batch.slots.data(), batch.positions.data(), T};
    int64_t rows = T;
    int failures = 0;
    const json &steps = table.at("steps");
    for (size_t i = 0; i < program.steps.size(); ++i) {
      const PlanStep &s = program.steps[i];
      const json &entry = steps.at(i);
      double diff = 0;
      std::string what;
      State gpu = cpu; // the state before the step
      const int64_t after = runCpu(s, rows, layout, batch);
      runKernels(entry, gpu, rows, batch);
      worstRelative = 0;
      const bool ok = compare(s, gpu, rows, after, diff, what);
      if (program.labelsBuffer >= 0)
        what += " relative " + fmtG(worstRelative);
      std::printf("%s step %zu %-14s %-5s max_abs_diff %.3g%s\n", label.c_str(), i,
                  std::string(s.op->name).c_str(), ok ? "ok" : "FAIL", diff, what.c_str());
      failures += ok ? 0 : 1;
      rows = after;
    }
    // Greedy sampling kernel: argmax of the logit rows.
    if (table.contains("sampling") && table.at("sampling").contains("argmax") &&
        program.logitsBuffer >= 0) {
      const int64_t R = rows, V = program.buffers[program.logitsBuffer].width;
      std::vector<int32_t> got(R, -1);
      State gpu = cpu;
      argmaxOut = got.data();
      launch(table.at("sampling").at("argmax"), gpu, R, R, batch);
      bool ok = true;
      for (int64_t r = 0; r < R; ++r)
        ok = ok && got[r] == cpu::argmax(cpu.buffers[program.logitsBuffer].data() + r * V, V);
      std::printf("%s argmax (%lld rows) %s\n", label.c_str(), static_cast<long long>(R),
                  ok ? "ok" : "FAIL");
      failures += ok ? 0 : 1;
    }
    return failures;
  }

private:
  const Plan &plan;
  const PlanProgram &program;
  const json &table;
  void *lib;
  double tol;
  LaunchFn launchFn = nullptr;
  std::vector<Weight> weights;
  State cpu;
  std::vector<int64_t> scratchBytes;
  std::vector<std::vector<float>> ropeCos, ropeSin;
  std::vector<float> scratchCpu;
  int32_t *argmaxOut = nullptr;

  int64_t width(int64_t b) const { return program.buffers[b].width; }
  int64_t bufRows(int64_t b) const { return program.buffers[b].rows; }
  static float *f(State &st, int64_t b) { return st.buffers[b].data(); }
  static int32_t *ints(State &st, int64_t b) {
    return reinterpret_cast<int32_t *>(st.buffers[b].data());
  }
  std::map<std::string, std::unique_ptr<cpu::RopeTable>> ropeTables;
  const cpu::RopeTable &ropeTable(const cpu::RopeParams &p) {
    char key[512];
    std::snprintf(key, sizeof key, "%d %.17g %lld %d %.17g %lld %.17g %.17g %.17g %.17g %d %.17g",
                  static_cast<int>(p.kind), p.theta, static_cast<long long>(p.rotaryDim),
                  p.interleaved, p.factor, static_cast<long long>(p.originalMaxPosition),
                  p.lowFreqFactor, p.highFreqFactor, p.betaFast, p.betaSlow, p.truncate,
                  p.attentionFactor);
    auto &slot = ropeTables[key];
    if (!slot)
      slot = std::make_unique<cpu::RopeTable>(p, plan.maxSeqLen);
    return *slot;
  }

  /// The CPU backend's step: the op's CPU kernel, as the CPU device runs
  /// it (rank 0: coordinates 0).
  int64_t runCpu(const PlanStep &s, int64_t T, const cpu::TokenLayout &tokens,
                 const BatchInput &input) {
    if (!s.op->cpu)
      die("step kind not run by the check: " + std::string(s.op->name));
    Batch b;
    b.tokens = input.tokens;
    b.positions = input.positions;
    b.slots = input.slots;
    b.logitRows.assign(input.logitRows.begin(), input.logitRows.end());
    step = &s;
    rows = T;
    layout = &tokens;
    batch = &b;
    if (T == 0 && !s.op->has(OpDef::RunsEmpty))
      return T;
    return s.op->cpu(*this);
  }

  // cpu::StepContext over the CPU state.
  float *f(int64_t id) override { return cpu.buffers[id].data(); }
  const TensorView &weight(size_t i) override { return weights[step->weights[i]].view; }
  const std::vector<cpu::Matrix> &experts(size_t i) override {
    return weights[step->weights[i]].experts;
  }
  const cpu::RopeTable &rope(const cpu::RopeParams &p) override { return ropeTable(p); }
  cpu::KVCache &cache(int64_t id) override { return cpu.caches[id]; }
  float *scratch(Scratch which, int64_t n) override {
    std::vector<float> &v = which == Scratch::Work ? scratchCpu : rowsCpu;
    if (v.size() < static_cast<size_t>(n))
      v.resize(static_cast<size_t>(n));
    return v.data();
  }
  int32_t *intScratch(int64_t n) override {
    if (idsCpu.size() < static_cast<size_t>(n))
      idsCpu.resize(static_cast<size_t>(n));
    return idsCpu.data();
  }
  std::vector<float> rowsCpu;
  std::vector<int32_t> idsCpu;

  // Kernel-table execution on the CPU layer.
  std::vector<std::vector<float>> kernelScratch;
  const BatchInput *currentBatch = nullptr;

  void *resolve(const std::string &ref, State &st, int64_t rows, const BatchInput &batch,
                bool &isScalar, long long &scalar) {
    isScalar = false;
    auto num = [&](size_t at) { return std::stoll(ref.substr(at)); };
    if (ref == "null")
      return nullptr;
    if (ref == "T" || ref == "R") {
      isScalar = true;
      scalar = rows;
      return nullptr;
    }
    if (ref.rfind("const:", 0) == 0) {
      isScalar = true;
      scalar = num(6);
      return nullptr;
    }
    if (ref == "coord:tp") {
      isScalar = true;
      scalar = 0;
      return nullptr;
    }
    if (ref.rfind("buf:", 0) == 0)
      return st.buffers.at(num(4)).data();
    if (ref.rfind("weight:", 0) == 0) {
      const Weight &wt = weights.at(num(7));
      if (!wt.experts.empty())
        die("a kernel parameter names an expert stack: " + ref);
      return const_cast<void *>(wt.view.data);
    }
    if (ref.rfind("scratch:", 0) == 0)
      return kernelScratch.at(num(8)).data();
    if (ref.rfind("cache_keys:", 0) == 0)
      return st.caches.at(num(11)).keys.data();
    if (ref.rfind("cache_values:", 0) == 0)
      return st.caches.at(num(13)).values.data();
    if (ref.rfind("rope_cos:", 0) == 0)
      return ropeCos.at(num(9)).data();
    if (ref.rfind("rope_sin:", 0) == 0)
      return ropeSin.at(num(9)).data();
    if (ref == "batch:sequence")
      return const_cast<int32_t *>(batch.slots.data());
    if (ref == "batch:position")
      return const_cast<int32_t *>(batch.positions.data());
    if (ref == "batch:logit_rows")
      return const_cast<int32_t *>(batch.logitRows.data());
    if (ref == "batch:argmax")
      return argmaxOut;
    die("unknown parameter reference '" + ref + "'");
  }

  long long count(const json &v, int64_t rows) {
    if (v.is_number_integer())
      return v.get<long long>();
    std::string s = v.get<std::string>();
    if (s == "T" || s == "R")
      return rows;
    return std::stoll(s);
  }

  /// A weight's elements as f32 (B operands of the general GEMM form).
  std::map<int64_t, std::vector<float>> widened;
  const float *weightF32(int64_t id) {
    auto &v = widened[id];
    if (v.empty()) {
      const TensorView &t = weights.at(id).view;
      v.resize(static_cast<size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i)
        v[i] = t.at(i);
    }
    return v.data();
  }

  /// Expert e of a weight stack as f32.
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> widenedExperts;
  const float *expertF32(int64_t id, int64_t e) {
    auto &v = widenedExperts[{id, e}];
    if (v.empty()) {
      const cpu::Matrix &m = weights.at(id).experts.at(e);
      v.resize(static_cast<size_t>(m.rows * m.cols));
      for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) {
          const int64_t at = r * m.rowStride + c;
          v[r * m.cols + c] =
              m.dtype == DType::F32 ? static_cast<const float *>(m.data)[at]
              : m.dtype == DType::BF16
                  ? bf16ToFloat(static_cast<const uint16_t *>(m.data)[at])
                  : f16ToFloat(static_cast<const uint16_t *>(m.data)[at]);
        }
    }
    return v.data();
  }

  /// C (+)= op(A) op(B) of the table's general form (transpose_a, B stored
  /// [k, n], accumulate, k_rows; batched over blocks whose counts bound m,
  /// or k with transpose_a): a plain loop in f64 (the backward pass's GEMMs;
  /// docs/cuda.md).
  void generalGemm(const json &g, State &st, int64_t rows, const BatchInput &batch) {
    bool sc;
    long long dummy;
    const float *A = static_cast<const float *>(resolve(g.at("a"), st, rows, batch, sc, dummy));
    float *C = static_cast<float *>(resolve(g.at("c"), st, rows, batch, sc, dummy));
    const std::string b = g.at("b");
    const bool isWeight = b.rfind("weight:", 0) == 0;
    const int64_t wid = isWeight ? std::stoll(b.substr(7)) : -1;
    const float *Bbuf =
        isWeight ? nullptr : static_cast<const float *>(resolve(b, st, rows, batch, sc, dummy));
    const long long mAll = count(g.at("m"), rows), n = g.at("n"),
                    kAll = g.contains("k_rows") ? rows : g.at("k").get<long long>();
    const long long lda = g.at("lda"), ldb = g.at("ldb"), ldc = g.at("ldc");
    const bool ta = g.value("transpose_a", false), tb = g.value("transpose_b", true),
               acc = g.value("accumulate", false);
    const long long blocks = g.value("batch", 1LL), modulo = g.value("b_batch_modulo", blocks);
    const int32_t *counts = nullptr;
    if (g.contains("rows_from_counts"))
      counts = static_cast<const int32_t *>(
          resolve(g.at("rows_from_counts"), st, rows, batch, sc, dummy));
    for (long long blk = 0; blk < blocks; ++blk) {
      const float *a = A + blk * g.value("stride_a", 0LL);
      float *c = C + blk * g.value("stride_c", 0LL);
      const float *B = !isWeight ? Bbuf + blk * g.value("stride_b", 0LL)
                       : weights.at(wid).experts.empty() ? weightF32(wid)
                                                          : expertF32(wid, blk % modulo);
      const long long m = counts && !ta ? std::min<long long>(mAll, counts[blk]) : mAll;
      const long long k = counts && ta ? std::min<long long>(kAll, counts[blk]) : kAll;
      for (long long i = 0; i < m; ++i)
        for (long long j = 0; j < n; ++j) {
          double sum = 0;
          for (long long l = 0; l < k; ++l)
            sum += static_cast<double>(ta ? a[l * lda + i] : a[i * lda + l]) *
                   static_cast<double>(tb ? B[j * ldb + l] : B[l * ldb + j]);
          c[i * ldc + j] = static_cast<float>(acc ? c[i * ldc + j] + sum : sum);
        }
    }
  }

  void gemm(const json &g, State &st, int64_t rows, const BatchInput &batch) {
    if (g.value("transpose_a", false) || !g.value("transpose_b", true) ||
        g.value("accumulate", false) || g.contains("k_rows") ||
        g.at("b").get<std::string>().rfind("weight:", 0) != 0)
      return generalGemm(g, st, rows, batch);
    bool sc;
    long long dummy;
    const float *A = static_cast<const float *>(resolve(g.at("a"), st, rows, batch, sc, dummy));
    float *C = static_cast<float *>(resolve(g.at("c"), st, rows, batch, sc, dummy));
    const std::string b = g.at("b");
    const Weight &wt = weights.at(std::stoll(b.substr(7)));
    const long long m = count(g.at("m"), rows), lda = g.at("lda"), ldc = g.at("ldc");
    const long long batchCount = g.at("batch");
    if (batchCount == 1) {
      cpu::linear(A, m, cpu::Matrix::of(wt.view), nullptr, C, lda, ldc);
      return;
    }
    const int32_t *counts = nullptr;
    if (g.contains("rows_from_counts"))
      counts = static_cast<const int32_t *>(
          resolve(g.at("rows_from_counts"), st, rows, batch, sc, dummy));
    const long long modulo = g.value("b_batch_modulo", batchCount);
    const long long sa = g.at("stride_a"), scs = g.at("stride_c");
    for (long long i = 0; i < batchCount; ++i) {
      const long long r = counts ? counts[i] : m;
      if (r > 0)
        cpu::linear(A + i * sa, r, wt.experts.at(i % modulo), nullptr, C + i * scs, lda, ldc);
    }
  }

  void launch(const json &l, State &st, int64_t rows, int64_t /*R*/, const BatchInput &batch) {
    std::string name = l.at("kernel");
    auto fn = reinterpret_cast<Trampoline>(dlsym(lib, (name + "__host").c_str()));
    if (!fn)
      die("kernels library has no " + name + "__host");
    std::vector<unsigned long long> args;
    for (const json &p : l.at("params")) {
      bool isScalar;
      long long scalar = 0;
      void *ptr = resolve(p.get<std::string>(), st, rows, batch, isScalar, scalar);
      args.push_back(isScalar ? static_cast<unsigned long long>(scalar)
                              : reinterpret_cast<unsigned long long>(ptr));
    }
    unsigned grid[3];
    for (int d = 0; d < 3; ++d) {
      const json &g = l.at("grid")[d];
      const long long a = g[0], div = g[1], c = g[2];
      grid[d] = static_cast<unsigned>((a * rows + div - 1) / div + c);
    }
    if (grid[0] * grid[1] * grid[2] == 0)
      return; // nothing to run (T = 0)
    launchFn(fn, grid[0], grid[1], grid[2], l.at("block").get<unsigned>(), 1, 1, args.data());
  }

  void runKernels(const json &entry, State &st, int64_t rows, const BatchInput &batch) {
    kernelScratch.assign(scratchBytes.size(), {});
    for (size_t i = 0; i < scratchBytes.size(); ++i)
      kernelScratch[i].assign(scratchBytes[i] / 4, std::nanf(""));
    for (const json &l : entry.at("launches")) {
      if (l.contains("collective"))
        die("collective steps are not run by the check");
      int64_t r = rows;
      if (l.contains("rows") && l.at("rows") == "R")
        r = static_cast<int64_t>(batch.logitRows.size());
      if (l.contains("gemm"))
        gemm(l.at("gemm"), st, r, batch);
      else
        launch(l, st, r, r, batch);
    }
  }

  /// Every |a - b| <= tol, or, with `relative` (a training step's
  /// outputs, whose gradients may be small), <= tol x max |b| (so a
  /// gradient the CPU computes as exactly 0 must be 0).
  bool compareF32(const float *a, const float *b, int64_t n, double &diff, bool relative = false) {
    bool ok = true;
    double bound = tol;
    if (relative) {
      double peak = 0;
      for (int64_t i = 0; i < n; ++i)
        peak = std::max(peak, std::fabs(static_cast<double>(b[i])));
      bound = tol * peak;
      worstRelative = std::max(worstRelative, peak > 0 ? maxDiff(a, b, n) / peak : maxDiff(a, b, n));
    }
    for (int64_t i = 0; i < n; ++i) {
      double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
      if (std::isnan(a[i]) != std::isnan(b[i]) || !(d <= bound))
        ok = false;
      if (d > diff || std::isnan(d))
        diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    }
    return ok;
  }

  double worstRelative = 0; ///< of the step's outputs (training)
  static double maxDiff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; ++i)
      d = std::max(d, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    return d;
  }

  bool compare(const PlanStep &s, State &gpu, int64_t rowsBefore, int64_t rowsAfter,
               double &diff, std::string &what) {
    bool ok = true;
    auto intsEqual = [&](int64_t b, int64_t n) {
      if (std::memcmp(ints(gpu, b), ints(cpu, b), n * 4) != 0) {
        what += " (i32 buffer " + std::to_string(b) + " differs)";
        return false;
      }
      return true;
    };
    if (s.op->name == "dispatch") { // blocks: the counted rows of each expert
      const int64_t E = s.dispatch.numExperts, C = s.dispatch.capacity, H = width(s.out[0]);
      ok = intsEqual(s.out[1], E) && intsEqual(s.out[2], rowsBefore * width(s.out[2]));
      for (int64_t e = 0; ok && e < E; ++e)
        ok = compareF32(f(gpu, s.out[0]) + e * C * H, f(cpu, s.out[0]) + e * C * H,
                        ints(cpu, s.out[1])[e] * H, diff);
      return ok;
    }
    if (s.op->name == "expert_ffn") {
      const int64_t E = width(s.in[1]), C = bufRows(s.in[0]) / E, H = width(s.out[0]);
      for (int64_t e = 0; e < E; ++e)
        ok = compareF32(f(gpu, s.out[0]) + e * C * H, f(cpu, s.out[0]) + e * C * H,
                        ints(cpu, s.in[1])[e] * H, diff) && ok;
      return ok;
    }
    for (int64_t b : s.out) {
      // Per-token buffers up to the step's rows, static ones (a weight's
      // gradient, the loss) whole.
      const int64_t n =
          (bufRows(b) == plan.maxBatchTokens ? rowsAfter : bufRows(b)) * width(b);
      if (program.buffers[b].dtype == DType::I32)
        ok = intsEqual(b, n) && ok;
      else
        ok = compareF32(f(gpu, b), f(cpu, b), n, diff, program.labelsBuffer >= 0) && ok;
    }
    if (s.kvCache >= 0) {
      const cpu::KVCache &a = gpu.caches[s.kvCache], &b = cpu.caches[s.kvCache];
      ok = compareF32(a.keys.data(), b.keys.data(), static_cast<int64_t>(a.keys.size()), diff) &&
           ok;
      ok = compareF32(a.values.data(), b.values.data(), static_cast<int64_t>(a.values.size()),
                      diff) &&
           ok;
    }
    return ok;
  }
};

} // namespace

int main(int argc, char **argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: cuda-host-check PLAN KERNELS.so WEIGHTS [--program N] [--tol X] [--prefill A,B]\n");
    return 2;
  }
  int64_t programIndex = 0;
  double tol = 1e-5;
  int first = 7, second = 5;
  for (int i = 4; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--program")
      programIndex = std::stoll(argv[i + 1]);
    else if (std::string(argv[i]) == "--tol")
      tol = std::stod(argv[i + 1]);
    else if (std::string(argv[i]) == "--prefill" &&
             std::sscanf(argv[i + 1], "%d,%d", &first, &second) == 2 && first > 0 && second > 0)
      continue;
    else
      die(std::string("unknown option ") + argv[i]);
  }
  try {
    Plan plan = Plan::load(argv[1]);
    std::ifstream in(argv[1]);
    json root = json::parse(in);
    const json &table = root.at("programs").at(programIndex).at("cuda");
    void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      die(std::string("dlopen: ") + dlerror());
    auto ckpt = Checkpoint::open(argv[3]);
    Checker checker(plan, programIndex, table, lib, *ckpt, tol);
    const int64_t V = plan.vocabSize;
    uint32_t seed = 12345;
    auto token = [&] {
      seed = seed * 1664525u + 1013904223u;
      return static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(V));
    };
    if (plan.programs.at(programIndex).labelsBuffer >= 0) {
      // A training plan: one step of max_sequences whole sequences of
      // max_seq_len tokens (positions from 0), every row a logit row, the
      // labels random ids with one -100 (ignored) per sequence.
      // The products with BF16 weights in f32 on both sides: the CPU
      // backend's backward pass rounds its gradient products to bf16 at the
      // avx512bf16 level (as PyTorch's BF16 autograd), the emitted backward
      // GEMMs (the general form above) do not; the kernels' logic is what
      // is compared here (the bf16 forward products: host-mixtral-bf16).
      cpu::setMatmulPrecision(cpu::MatmulPrecision::F32);
      BatchInput step;
      for (int64_t b = 0; b < plan.maxSequences; ++b)
        for (int64_t p = 0; p < plan.maxSeqLen; ++p) {
          step.logitRows.push_back(static_cast<int32_t>(step.tokens.size()));
          step.tokens.push_back(token());
          step.positions.push_back(static_cast<int32_t>(p));
          step.slots.push_back(static_cast<int32_t>(b));
          step.labels.push_back(p == plan.maxSeqLen / 2 ? -100 : token());
        }
      const int failures = checker.forward(step, "train");
      std::printf("%s: %d step(s) differ\n", failures ? "FAIL" : "PASS", failures);
      return failures ? 1 : 0;
    }
    // Prefill: sequence 0 (slot 0) 7 tokens, sequence 1 (slot 1) 5 tokens.
    BatchInput prefill;
    for (int p = 0; p < first; ++p) {
      prefill.tokens.push_back(token());
      prefill.positions.push_back(p);
      prefill.slots.push_back(0);
    }
    for (int p = 0; p < second; ++p) {
      prefill.tokens.push_back(token());
      prefill.positions.push_back(p);
      prefill.slots.push_back(1);
    }
    prefill.logitRows = {first - 1, first + second - 1};
    // Decode of sequence 0 and three more prompt tokens of sequence 1.
    BatchInput decode;
    decode.tokens = {token(), token(), token(), token()};
    decode.positions = {first, second, second + 1, second + 2};
    decode.slots = {0, 1, 1, 1};
    decode.logitRows = {0, 3};
    int failures = checker.forward(prefill, "prefill");
    failures += checker.forward(decode, "decode");
    std::printf("%s: %d step(s) differ\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
  } catch (const std::exception &e) {
    die(e.what());
  }
}
