// Linear maps and what is built on them: embedding lookup, elementwise adds
// and gates, the gated MLP, the routed experts, argmax. The matrix products
// themselves live in Gemm.cpp; this file splits them between threads and
// fuses the MLP's gate and up projections with its activation.
#include "Gemm.h"
#include "VectorMath.h"

#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#ifdef MOERT_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace moert::cpu {
namespace {

/// Below this many multiply-adds a thread's share of work is not worth a
/// hand-off to the pool.
constexpr int64_t kMinWorkPerThread = 1 << 17;

bool isFloat(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

/// Reusable per-thread scratch: experts' gathered rows and intermediates
/// (megabytes per call in prefill; fresh allocations would page-fault).
float *scratch(std::vector<float> &buffer, int64_t count) {
  if (buffer.size() < static_cast<size_t>(count))
    buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

/// Runs body(n0, n1) over the output columns [0, n) split between threads
/// on GEMM tile boundaries; `macsPerColumn` sizes the smallest share.
void forColumns(int64_t n, int64_t macsPerColumn,
                const std::function<void(int64_t, int64_t)> &body) {
  const int64_t block = gemm::kColumnBlock;
  int64_t blocks = (n + block - 1) / block;
  int64_t grain = std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, macsPerColumn * block));
  parallelFor(blocks, [&](int64_t b0, int64_t b1) { body(b0 * block, std::min(n, b1 * block)); },
              grain);
}

/// Runs columns(t0, t1, n0, n1) over the tokens x output columns of a
/// product with `tokens` rows and w's columns, split between threads: by
/// output columns, or by tokens when the matrix is too narrow to give every
/// thread a tile (a router), or for many more tokens than output columns (a
/// weight gradient's left operand: matmulTN's [I, T] of an expert, [vocab,
/// T] of the LM head), where each thread then packs only its rows of x, the
/// big operand (bench-moe's shapes, 2 threads, in one process: [2816 x 128]
/// x [128 x 1024] 371 -> 407 GFLOP/s, [32000 x 512] x [512 x 1024] 346 ->
/// 419). Chunks of more than the GEMV's tokens keep every chunk on the
/// packed GEMM, whose sums do not depend on the rows around them: the bits
/// of one thread. (Chunks of 16 let a router's 64-140 rows take the GEMV on
/// 2 threads and the GEMM on one.)
template <typename Columns>
void splitProduct(int64_t tokens, const Matrix &w, Columns &&columns) {
  if (tokens <= 0 || w.rows <= 0)
    return;
  int64_t threads = numThreads();
  constexpr int64_t kGemmGrain = gemm::kGemvMaxTokensAvx512 + 1;
  if ((w.rows < threads * gemm::kColumnBlock && tokens >= 32 * threads) ||
      (tokens > 2 * w.rows && tokens >= 2 * kGemmGrain * threads)) {
    parallelFor(tokens, [&](int64_t t0, int64_t t1) { columns(t0, t1, int64_t(0), w.rows); },
                kGemmGrain);
    return;
  }
  forColumns(w.rows, tokens * w.cols,
             [&](int64_t n0, int64_t n1) { columns(int64_t(0), tokens, n0, n1); });
}

/// y = x w^T + bias over threads (splitProduct).
void linearF32Bias(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
                   float *y, int64_t ldy) {
  splitProduct(tokens, w, [&](int64_t t0, int64_t t1, int64_t n0, int64_t n1) {
    gemm::columns(x + t0 * ldx, ldx, t1 - t0, w, bias, n0, n1, y + t0 * ldy, ldy);
  });
}

//===----------------------------------------------------------------------===//
// Activations
//===----------------------------------------------------------------------===//

float activate(Activation act, float g) {
  switch (act) {
  case Activation::Silu: return g / (1.0f + std::exp(-g));
  case Activation::Gelu: return 0.5f * g * (1.0f + std::erf(g * 0.70710678118654752f));
  case Activation::GeluTanh: {
    float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
    return 0.5f * g * (1.0f + std::tanh(inner));
  }
  case Activation::Relu: return g > 0.0f ? g : 0.0f;
  }
  return g;
}

void gatedProductScalar(Activation act, float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    g[i] = activate(act, g[i]) * u[i];
}

#ifdef MOERT_X86
/// g = act(g) * u over n values; exact gelu's erf stays scalar.
MOERT_AVX512 void gatedProductAvx512(Activation act, float *g, const float *u, int64_t n) {
  if (act == Activation::Gelu)
    return gatedProductScalar(act, g, u, n);
  const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, g + i), a;
    switch (act) {
    case Activation::Silu: // v / (1 + e^-v)
      a = _mm512_div_ps(v, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), v))));
      break;
    case Activation::GeluTanh: { // tanh(s) = 1 - 2 / (1 + e^2s), exact at both infinities
      __m512 v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
      __m512 s = _mm512_mul_ps(_mm512_set1_ps(2 * 0.79788456080286536f),
                               _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), v3, v));
      __m512 tanh = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, exp512(s))));
      a = _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, tanh));
      break;
    }
    default: a = _mm512_max_ps(v, _mm512_setzero_ps()); break;
    }
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

/// gatedProductAvx512 for AVX2: g = act(g) * u over n values.
MOERT_AVX2 void gatedProductAvx2(Activation act, float *g, const float *u, int64_t n) {
  if (act == Activation::Gelu)
    return gatedProductScalar(act, g, u, n);
  const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(g + i);
    __m256 a;
    switch (act) {
    case Activation::Silu:
      a = _mm256_div_ps(v, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), v))));
      break;
    case Activation::GeluTanh: {
      const __m256 v3 = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
      const __m256 s = _mm256_mul_ps(_mm256_set1_ps(2 * 0.79788456080286536f),
                                     _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), v3, v));
      const __m256 tanh =
          _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, exp256(s))));
      a = _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, tanh));
      break;
    }
    default: a = _mm256_max_ps(v, _mm256_setzero_ps()); break;
    }
    _mm256_storeu_ps(g + i, _mm256_mul_ps(a, _mm256_loadu_ps(u + i)));
  }
  gatedProductScalar(act, g + i, u + i, n - i);
}

#endif // MOERT_X86

void gatedProduct(Activation act, float *g, const float *u, int64_t n) {
#ifdef MOERT_X86
  if (gemm::haveAvx512())
    return gatedProductAvx512(act, g, u, n);
  if (gemm::haveAvx2())
    return gatedProductAvx2(act, g, u, n);
#endif
  gatedProductScalar(act, g, u, n);
}

/// g[T, I] = act(x gate^T) * (x up^T) in one pass over threads: each takes
/// a range of the I columns, computes gate and up for it, and applies the
/// activation while those columns are still in cache. u is scratch [T, I].
void gatedUp(const float *x, int64_t tokens, const Matrix &gate, const Matrix &up,
             Activation act, float *g, float *u) {
  const int64_t I = gate.rows, H = gate.cols;
  if (up.rows != I || up.cols != H)
    runtimeError("mlp: gate [{}, {}] and up [{}, {}] differ", I, H, up.rows, up.cols);
  forColumns(I, 2 * tokens * H, [&](int64_t n0, int64_t n1) {
    gemm::columns(x, H, tokens, gate, nullptr, n0, n1, g, I);
    gemm::columns(x, H, tokens, up, nullptr, n0, n1, u, I);
    for (int64_t t = 0; t < tokens; ++t)
      gatedProduct(act, g + t * I + n0, u + t * I + n0, n1 - n0);
  });
}

/// The down projection of an MLP: [T, I] -> [T, down.rows].
void downProjection(const float *h, int64_t tokens, int64_t I, const Matrix &down, float *out) {
  if (down.cols != I)
    runtimeError("mlp: down [{}, {}] does not take {} features", down.rows, down.cols, I);
  linearF32Bias(h, I, tokens, down, nullptr, out, down.rows);
}

} // namespace

Matrix Matrix::of(const TensorView &view) {
  if (view.shape.size() != 2)
    runtimeError("a weight matrix must be 2-D, got {}", shapeString(view.shape));
  if (!isFloat(view.dtype) &&
      !((view.dtype == DType::F8E4M3 || view.dtype == DType::I8) && view.blocks))
    runtimeError("a weight matrix must be F32, BF16, F16 or block-scaled F8_E4M3 or I8, got {}",
                 dtypeName(view.dtype));
  Matrix m;
  if (view.blocks)
    m.scales = *view.blocks;
  m.dtype = view.dtype;
  m.data = view.data;
  m.rows = view.shape[0];
  m.cols = view.shape[1];
  m.rowStride = view.shape[1];
  return m;
}

Matrix Matrix::transpose() const {
  if (transposed)
    runtimeError("the transpose of a transposed view");
  if (dtype == DType::F8E4M3 || dtype == DType::I8)
    runtimeError("not supported yet: products with the transpose of an {} weight (training)",
                 dtype == DType::I8 ? "int8" : "FP8");
  Matrix m = *this;
  m.rows = cols;
  m.cols = rows;
  m.transposed = true;
  return m;
}

Matrix Matrix::sliceRows(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > rows)
    runtimeError("rows [{}, {}) of a {}-row matrix", begin, begin + count, rows);
  if (transposed)
    runtimeError("rows of a transposed view");
  Matrix m = *this;
  m.data = static_cast<const char *>(data) +
           begin * rowStride * static_cast<int64_t>(dtypeSize(dtype));
  m.rows = count;
  m.scales.rowOrigin += begin;
  return m;
}

void linear(const float *x, int64_t tokens, const Matrix &w, const TensorView *bias, float *y,
            int64_t ldx, int64_t ldy) {
  ldx = ldx ? ldx : w.cols;
  ldy = ldy ? ldy : w.rows;
  const float *biasF32 = nullptr;
  std::vector<float> widened;
  if (bias) {
    if (bias->numel() != w.rows)
      runtimeError("linear: bias of {} values for {} outputs", bias->numel(), w.rows);
    if (bias->dtype == DType::F32) {
      biasF32 = static_cast<const float *>(bias->data);
    } else {
      widened.resize(static_cast<size_t>(w.rows));
      gemm::widen(bias->dtype, bias->data, w.rows, widened.data());
      biasF32 = widened.data();
    }
  }
  linearF32Bias(x, ldx, tokens, w, biasF32, y, ldy);
}

bool linearLeftTransposed(const float *xT, int64_t ldx, int64_t tokens, const Matrix &w, float *y,
                          int64_t ldy) {
  if (!gemm::leftTransposedApplies(w, tokens))
    return false;
  splitProduct(tokens, w, [&](int64_t t0, int64_t t1, int64_t n0, int64_t n1) {
    gemm::columnsLeftTransposed(xT + t0, ldx, t1 - t0, w, n0, n1, y + t0 * ldy, ldy);
  });
  return true;
}

void embedding(const Matrix &table, const int32_t *tokens, int64_t count, float *out) {
  const int64_t width = table.cols, size = static_cast<int64_t>(dtypeSize(table.dtype));
  parallelFor(count, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      gemm::widen(table.dtype,
                  static_cast<const char *>(table.data) + tokens[t] * table.rowStride * size,
                  width, out + t * width);
  }, std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, width)));
}

void add(const float *a, const float *b, int64_t n, float *out) {
  parallelFor(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      out[i] = a[i] + b[i];
  }, kMinWorkPerThread);
}

void sigmoidGate(const float *x, const float *gate, int64_t tokens, int64_t width, float *out) {
  parallelFor(tokens, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float s = 1.0f / (1.0f + std::exp(-gate[t]));
      for (int64_t i = 0; i < width; ++i)
        out[t * width + i] = x[t * width + i] * s;
    }
  }, std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, width)));
}

void mlp(const float *x, int64_t tokens, const Matrix &gate, const Matrix &up, const Matrix &down,
         Activation act, float *scratch, float *out) {
  if (tokens <= 0)
    return;
  const int64_t I = gate.rows;
  float *g = scratch, *u = scratch + tokens * I;
  gatedUp(x, tokens, gate, up, act, g, u);
  downProjection(g, tokens, I, down, out);
}

ExpertAssignments assignmentsByExpert(const int32_t *experts, int64_t tokens, int64_t k,
                                      int64_t numExperts, double capacityFactor,
                                      const char *what) {
  // Counting sort of the pairs by expert (stable: p order within one),
  // then each expert's first `capacity` kept.
  const int64_t E = numExperts, pairs = tokens * k;
  const int64_t capacity =
      capacityFactor > 0 ? stepCapacity(capacityFactor, tokens, k, E, tokens) : pairs;
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int64_t p = 0; p < pairs; ++p) {
    if (experts[p] < 0 || experts[p] >= E)
      runtimeError("{}: token {} routed to expert {} of {}", what, p / k, experts[p], E);
    ++count[experts[p]];
  }
  ExpertAssignments a;
  a.start.assign(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e)
    a.start[e + 1] = a.start[e] + std::min(count[e], capacity);
  a.order.resize(static_cast<size_t>(a.start[E]));
  std::vector<int64_t> next(a.start.begin(), a.start.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t e = experts[p];
    if (next[e] < a.start[e + 1])
      a.order[next[e]++] = p;
  }
  return a;
}

namespace {

/// The experts' MLPs of moe.experts_saved: expert by expert, the gate and
/// up products copied to the saved rows of their (token, slot) pairs
/// (order[i]: the pair of gathered row i) before the activation, and the
/// outputs d (gathered order) after.
void savingExpertMlps(const std::vector<ExpertRows> &groups, Activation act,
                      const int64_t *order, const ExpertsSaved &saved, const float *d) {
  thread_local std::vector<float> gateBuf, upBuf;
  int64_t row = 0; // the group's first gathered row
  for (const ExpertRows &g : groups) {
    const int64_t I = g.gate->rows, n = g.count;
    float *a = scratch(gateBuf, n * I), *u = scratch(upBuf, n * I);
    linear(g.x, n, *g.gate, nullptr, a);
    linear(g.x, n, *g.up, nullptr, u);
    parallelFor(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        if (saved.gate) {
          std::copy_n(a + r * I, I, saved.gate + order[row + r] * I);
          std::copy_n(u + r * I, I, saved.up + order[row + r] * I);
        }
        gatedProduct(act, a + r * I, u + r * I, I);
      }
    }, 4);
    linear(a, n, *g.down, nullptr, g.y);
    row += n;
  }
  if (!saved.output)
    return; // (the saving path's arithmetic, nothing kept: --recompute experts)
  const int64_t H = groups.empty() ? 0 : groups[0].down->rows;
  parallelFor(row, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::copy_n(d + i * H, H, saved.output + order[i] * H);
  }, 16);
}

} // namespace

void expertMlpsAsTraining(const std::vector<ExpertRows> &groups, Activation act) {
  static const ExpertsSaved kNothingKept;
  savingExpertMlps(groups, act, nullptr, kNothingKept, nullptr);
}

void experts(const float *x, int64_t tokens, int64_t hidden, const float *weights,
             const int32_t *experts, int64_t k, const std::vector<Matrix> &gate,
             const std::vector<Matrix> &up, const std::vector<Matrix> &down, Activation act,
             float *out, const ExpertsSaved *saved, double capacityFactor) {
  if (tokens <= 0)
    return;
  const int64_t E = static_cast<int64_t>(gate.size());
  if (up.size() != gate.size() || down.size() != gate.size())
    runtimeError("experts: {} gate, {} up and {} down matrices", gate.size(), up.size(),
                 down.size());
  for (int64_t e = 0; e < E; ++e)
    if (gate[e].cols != hidden || down[e].rows != hidden)
      runtimeError("experts: expert {} does not map {} features to {}", e, hidden, hidden);

  const int64_t pairs = tokens * k;
  const auto [start, order] =
      assignmentsByExpert(experts, tokens, k, E, capacityFactor, "experts");
  const int64_t kept = start[E];
  if (saved && saved->output && kept < pairs) {
    std::fill_n(saved->gate, pairs * gate[0].rows, 0.0f);
    std::fill_n(saved->up, pairs * gate[0].rows, 0.0f);
    std::fill_n(saved->output, pairs * hidden, 0.0f);
  }

  // Gather every pair's input row in expert order (before `out` is written:
  // it may alias x), so each expert's tokens are one dense matrix.
  thread_local std::vector<float> gatheredBuf, scratchBuf, downBuf;
  float *gathered = scratch(gatheredBuf, pairs * hidden);
  parallelFor(kept, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::copy_n(x + order[i] / k * hidden, hidden, gathered + i * hidden);
  }, std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, hidden)));
  std::fill_n(out, tokens * hidden, 0.0f);

  // Every expert's MLP over its rows into d (pair order), then the weighted
  // scatter-add, split by columns: a token may (in theory) appear twice in
  // one expert's rows, so rows cannot be split between threads. Per output
  // row the experts add in expert order.
  float *d = scratch(downBuf, pairs * hidden);
  std::vector<ExpertRows> groups;
  for (int64_t e = 0; e < E; ++e)
    if (start[e + 1] > start[e])
      groups.push_back({&gate[e], &up[e], &down[e], gathered + start[e] * hidden,
                        d + start[e] * hidden, start[e + 1] - start[e]});
  if (saved)
    savingExpertMlps(groups, act, order.data(), *saved, d);
  else
    expertMlps(groups, act, scratch(scratchBuf, expertMlpsScratch(groups)));
  parallelFor(hidden, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < kept; ++i) {
      const int64_t p = order[i];
      const float w = weights[p];
      float *dst = out + p / k * hidden;
      const float *src = d + i * hidden;
      for (int64_t c = c0; c < c1; ++c)
        dst[c] += w * src[c];
    }
  }, std::max<int64_t>(64, kMinWorkPerThread / std::max<int64_t>(1, kept)));
}

namespace {

/// Runs body(group, n0, n1) over the output columns [0, width(group)) of
/// every group with rows, as one parallel loop over all groups' column
/// blocks, so that threads split the work of all groups at once.
void forGroupColumns(const std::vector<ExpertRows> &groups,
                     const std::function<int64_t(const ExpertRows &)> &width,
                     int64_t macsPerBlock,
                     const std::function<void(size_t, int64_t, int64_t)> &body) {
  const int64_t block = gemm::kColumnBlock;
  std::vector<int64_t> first(groups.size() + 1, 0); // each group's first block
  for (size_t i = 0; i < groups.size(); ++i)
    first[i + 1] = first[i] + (groups[i].count > 0 ? (width(groups[i]) + block - 1) / block : 0);
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, macsPerBlock));
  parallelFor(first.back(), [&](int64_t b0, int64_t b1) {
    size_t i = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b0) -
                                   first.begin()) - 1;
    for (; i < groups.size() && first[i] < b1; ++i) {
      const int64_t from = std::max(b0, first[i]) - first[i], to = std::min(b1, first[i + 1]) - first[i];
      if (from < to)
        body(i, from * block, std::min(width(groups[i]), to * block));
    }
  }, grain);
}

int64_t mostRows(const std::vector<ExpertRows> &groups) {
  int64_t most = 0;
  for (const ExpertRows &g : groups)
    most = std::max(most, g.count);
  return most;
}

} // namespace

int64_t expertMlpsScratch(const std::vector<ExpertRows> &groups) {
  const bool few = mostRows(groups) <= kFewExpertRows;
  int64_t floats = 0;
  for (const ExpertRows &g : groups)
    floats = few ? floats + 2 * g.count * g.gate->rows
                 : std::max(floats, 2 * g.count * g.gate->rows);
  return floats;
}

void expertMlps(const std::vector<ExpertRows> &groups, Activation act, float *scratch) {
  const int64_t most = mostRows(groups);
  if (most > kFewExpertRows) {
    for (const ExpertRows &g : groups)
      if (g.count > 0)
        mlp(g.x, g.count, *g.gate, *g.up, *g.down, act, scratch, g.y);
    return;
  }
  // Group i's gate rows at offset[i] of scratch, its up rows `intermediate`
  // floats further.
  std::vector<int64_t> offset(groups.size());
  int64_t intermediate = 0, H = 0, I = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const ExpertRows &g = groups[i];
    const int64_t rows = g.gate->rows;
    if (g.up->rows != rows || g.up->cols != g.gate->cols || g.down->cols != rows)
      runtimeError("mlp: gate [{}, {}], up [{}, {}] and down [{}, {}] do not form an MLP", rows,
                   g.gate->cols, g.up->rows, g.up->cols, g.down->rows, g.down->cols);
    offset[i] = intermediate;
    intermediate += g.count * rows;
    H = std::max(H, g.gate->cols);
    I = std::max(I, rows);
  }
  float *gated = scratch, *up = scratch + intermediate;
  const int64_t block = gemm::kColumnBlock;
  auto gateRows = [](const ExpertRows &g) { return g.gate->rows; };
  auto downRows = [](const ExpertRows &g) { return g.down->rows; };
  forGroupColumns(groups, gateRows, 2 * most * H * block, [&](size_t i, int64_t n0, int64_t n1) {
    const ExpertRows &g = groups[i];
    const int64_t width = g.gate->rows, K = g.gate->cols;
    float *gi = gated + offset[i], *ui = up + offset[i];
    gemm::columns(g.x, K, g.count, *g.gate, nullptr, n0, n1, gi, width);
    gemm::columns(g.x, K, g.count, *g.up, nullptr, n0, n1, ui, width);
    for (int64_t t = 0; t < g.count; ++t)
      gatedProduct(act, gi + t * width + n0, ui + t * width + n0, n1 - n0);
  });
  forGroupColumns(groups, downRows, most * I * block, [&](size_t i, int64_t n0, int64_t n1) {
    const ExpertRows &g = groups[i];
    gemm::columns(gated + offset[i], g.gate->rows, g.count, *g.down, nullptr, n0, n1, g.y,
                  g.down->rows);
  });
}

int64_t argmax(const float *x, int64_t n) {
  if (n <= 0)
    runtimeError("argmax of an empty vector");
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best])
      best = i;
  return best;
}

void forwardGatedProduct(Activation act, float *g, const float *u, int64_t n) {
  gatedProduct(act, g, u, n);
}

} // namespace moert::cpu
