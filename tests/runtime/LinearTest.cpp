// The linear-algebra kernels (linear, embedding, add, sigmoidGate, mlp,
// experts, argmax) against naive double-precision references, for F32, BF16
// and F16 weights, odd sizes (tails of every tile and vector), strides, and
// on 1 and 2 threads; also the portable (non-AVX-512) path.
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

// Internal: lets a test switch the AVX-512 kernels off.
#include "../../runtime/src/cpu/Gemm.h"

#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <random>
#include <vector>

using namespace moert;
using namespace moert::cpu;

namespace {

/// A weight matrix stored in a dtype, with the exact values it holds (for
/// the references) and optional padding between rows.
struct TestMatrix {
  DType dtype;
  int64_t rows, cols, stride;
  std::vector<uint16_t> half;  // BF16 / F16 storage
  std::vector<float> single;   // F32 storage
  std::vector<double> values;  // [rows, cols], what the storage decodes to

  TestMatrix(DType dtype, int64_t rows, int64_t cols, std::mt19937 &rng, int64_t pad = 0,
             float scale = 1.0f)
      : dtype(dtype), rows(rows), cols(cols), stride(cols + pad) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    size_t storage = static_cast<size_t>(std::max<int64_t>(1, rows * stride));
    values.resize(static_cast<size_t>(rows * cols));
    if (dtype == DType::F32)
      single.assign(storage, 1e30f); // padding that must never be read
    else
      half.assign(storage, 0x7c00);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float v = dist(rng);
        size_t at = static_cast<size_t>(r * stride + c);
        double exact;
        if (dtype == DType::F32) {
          single[at] = v;
          exact = v;
        } else if (dtype == DType::BF16) {
          half[at] = floatToBf16(v);
          exact = bf16ToFloat(half[at]);
        } else {
          half[at] = floatToF16(v);
          exact = f16ToFloat(half[at]);
        }
        values[static_cast<size_t>(r * cols + c)] = exact;
      }
  }
  double at(int64_t r, int64_t c) const { return values[static_cast<size_t>(r * cols + c)]; }
  const void *data() const {
    return dtype == DType::F32 ? static_cast<const void *>(single.data()) : half.data();
  }
  Matrix matrix() const {
    Matrix m;
    m.dtype = dtype;
    m.data = data();
    m.rows = rows;
    m.cols = cols;
    m.rowStride = stride;
    return m;
  }
  TensorView view() const { return TensorView{dtype, {rows, cols}, data()}; }
};

std::vector<float> randomVector(int64_t n, std::mt19937 &rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v)
    x = dist(rng);
  return v;
}

/// Sets the pool's size for a test and restores one thread after it.
struct Threads {
  explicit Threads(int n) { setNumThreads(n); }
  ~Threads() { setNumThreads(1); }
};

/// Forces the portable kernels for a scope (every level the CPU has is
/// tested by running the whole suite under MOERT_ISA: tests/runtime/CMakeLists.txt).
struct NoAvx512 {
  NoAvx512() : saved(activeIsa()) { setIsa(Isa::Generic); }
  ~NoAvx512() { setIsa(saved); }
  Isa saved;
};

/// f32 sums of n products: within a small multiple of n * eps of the sum of
/// the products' magnitudes.
double tolerance(double absSum, int64_t n) {
  return 1e-6 * std::sqrt(static_cast<double>(n) + 1) * absSum + 1e-30;
}

const DType kWeightTypes[] = {DType::F32, DType::BF16, DType::F16};

void checkLinear(DType dtype, int64_t T, int64_t N, int64_t K, bool withBias, bool strided,
                 std::mt19937 &rng, int64_t rowPad = 0) {
  SCOPED_TRACE(::testing::Message() << dtypeName(dtype) << " T=" << T << " N=" << N << " K=" << K
                                    << " bias=" << withBias << " strided=" << strided
                                    << " rowPad=" << rowPad);
  TestMatrix w(dtype, N, K, rng, rowPad);
  TestMatrix b(dtype, 1, N, rng);
  TensorView bias{dtype, {N}, b.data()};
  int64_t ldx = strided ? K + 5 : K, ldy = strided ? N + 3 : N;
  std::vector<float> x = randomVector(std::max<int64_t>(1, T * ldx), rng);
  const float sentinel = -12345.0f;
  std::vector<float> y(static_cast<size_t>(std::max<int64_t>(1, T * ldy)), sentinel);
  linear(x.data(), T, w.matrix(), withBias ? &bias : nullptr, y.data(), strided ? ldx : 0,
         strided ? ldy : 0);
  const bool roundX = gemm::roundsToBf16(dtype); // the kernels' contract
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = withBias ? b.at(0, n) : 0.0, absSum = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        float xk = x[t * ldx + k];
        double p = static_cast<double>(roundX ? roundBf16(xk) : xk) * w.at(n, k);
        ref += p;
        absSum += std::fabs(p);
      }
      ASSERT_NEAR(y[t * ldy + n], ref, tolerance(absSum, K)) << "t=" << t << " n=" << n;
    }
    for (int64_t n = N; n < ldy; ++n)
      ASSERT_EQ(y[t * ldy + n], sentinel) << "wrote past row " << t;
  }
}

TEST(LinearTest, OddSizesAllDtypes) {
  std::mt19937 rng(1);
  const int64_t shapes[][2] = {{1, 1}, {3, 67}, {67, 3}, {251, 251}, {67, 251}, {251, 67}, {33, 16}};
  for (int threads : {1, 2}) {
    Threads pool(threads);
    for (DType dtype : kWeightTypes)
      for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16, 17, 29, 67})
        for (auto &shape : shapes)
          for (bool bias : {false, true})
            checkLinear(dtype, T, shape[0], shape[1], bias, /*strided=*/T % 2 == 1, rng);
  }
}

TEST(LinearTest, CrossesCacheBlocks) {
  // K past the K slice, columns past a thread's column chunk, many token
  // blocks, weight rows with padding between them.
  std::mt19937 rng(2);
  Threads pool(2);
  for (DType dtype : {DType::BF16, DType::F32})
    for (int64_t T : {3, 37, 200})
      checkLinear(dtype, T, 1100, 600, /*withBias=*/true, /*strided=*/true, rng, /*rowPad=*/7);
  checkLinear(DType::F16, 130, 1030, 1037, true, false, rng, 1);
}

TEST(LinearTest, NarrowMatrixManyTokens) {
  // A router-like [8, H] matrix: split between threads by tokens.
  std::mt19937 rng(3);
  Threads pool(2);
  for (int64_t T : {64, 100, 513})
    checkLinear(DType::BF16, T, 8, 96, true, true, rng);
}

// Many more tokens than output columns (a weight gradient's left operand)
// are split between threads by tokens, in chunks above the GEMV's tokens:
// the same bits as one thread, whatever the dtype and the view, and right.
TEST(LinearTest, ManyTokensOverFewColumnsSplitByTokens) {
  std::mt19937 rng(13);
  for (DType dtype : {DType::BF16, DType::F32})
    for (bool transposed : {false, true})
      for (int64_t T : {140, 301}) {
        SCOPED_TRACE(::testing::Message() << dtypeName(dtype) << (transposed ? " transposed" : "")
                                          << " T=" << T);
        TestMatrix w(dtype, transposed ? 96 : 40, transposed ? 40 : 96, rng);
        const Matrix m = transposed ? w.matrix().transpose() : w.matrix();
        std::vector<float> x = randomVector(T * 96, rng), one(T * 40), two(T * 40);
        {
          Threads pool(1);
          linear(x.data(), T, m, nullptr, one.data());
        }
        {
          Threads pool(2);
          linear(x.data(), T, m, nullptr, two.data());
        }
        ASSERT_EQ(one, two);
        Threads pool(2);
        if (!transposed)
          checkLinear(dtype, T, 40, 96, false, false, rng);
      }
}

// A transposed view (Matrix::transpose: the backward's products with a
// weight's transpose) packed straight from the [K, N] storage, padding
// between its rows: every dtype, few tokens (no GEMV: the GEMM takes them)
// and many, K and N across the cache blocks.
TEST(LinearTest, TransposedViews) {
  std::mt19937 rng(6);
  for (int threads : {1, 2}) {
    Threads pool(threads);
    for (DType dtype : kWeightTypes)
      for (auto [T, N, K] : {std::array<int64_t, 3>{1, 7, 5}, {3, 67, 33}, {17, 33, 67},
                             {40, 1100, 600}, {130, 70, 530}})
        for (bool strided : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtypeName(dtype) << " T=" << T << " N=" << N
                                            << " K=" << K << " strided=" << strided);
          TestMatrix stored(dtype, K, N, rng, /*pad=*/3); // w^T [K, N]
          const Matrix w = stored.matrix().transpose();  // w [N, K]
          ASSERT_TRUE(w.transposed);
          ASSERT_EQ(w.rows, N);
          ASSERT_EQ(w.cols, K);
          const int64_t ldx = strided ? K + 2 : K, ldy = strided ? N + 1 : N;
          std::vector<float> x = randomVector(T * ldx, rng), y(static_cast<size_t>(T * ldy));
          linear(x.data(), T, w, nullptr, y.data(), ldx, ldy);
          // (A transposed bf16 view takes the bf16 products too: the
          // backward's dx = dy w with a BF16 weight.)
          const bool roundX = gemm::roundsToBf16(dtype);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) {
              double ref = 0, absSum = 0;
              for (int64_t k = 0; k < K; ++k) {
                const float xk = x[t * ldx + k];
                const double p = static_cast<double>(roundX ? roundBf16(xk) : xk) * stored.at(k, n);
                ref += p;
                absSum += std::fabs(p);
              }
              ASSERT_NEAR(y[t * ldy + n], ref, tolerance(absSum, K)) << "t=" << t << " n=" << n;
            }
        }
  }
  EXPECT_THROW(Matrix().transpose().transpose(), RuntimeError);
}

TEST(LinearTest, EmptyReduction) {
  std::mt19937 rng(4);
  for (bool bias : {false, true})
    checkLinear(DType::F32, 5, 7, 0, bias, false, rng);
}

TEST(LinearTest, PortableFallback) {
  std::mt19937 rng(5);
  NoAvx512 portable;
  Threads pool(2);
  for (DType dtype : kWeightTypes)
    for (int64_t T : {1, 5, 29})
      checkLinear(dtype, T, 67, 251, true, true, rng, 3);
}

/// Sets the matmul precision for a scope.
struct Precision {
  explicit Precision(MatmulPrecision p) : saved(requestedMatmulPrecision()) { setMatmulPrecision(p); }
  ~Precision() { setMatmulPrecision(saved); }
  MatmulPrecision saved;
};

TEST(LinearTest, MatmulPrecisionOfBf16Weights) {
  std::mt19937 rng(12);
  Threads pool(2);
  {
    // f32 products on every level: the references keep x exact.
    Precision f32(MatmulPrecision::F32);
    EXPECT_FALSE(gemm::roundsToBf16(DType::BF16));
    for (int64_t T : {3, 40})
      checkLinear(DType::BF16, T, 67, 251, true, true, rng);
  }
  Precision bf16(MatmulPrecision::Bf16);
  EXPECT_FALSE(gemm::roundsToBf16(DType::F32));
  EXPECT_FALSE(gemm::roundsToBf16(DType::F16));
  EXPECT_EQ(gemm::roundsToBf16(DType::BF16), activeIsa() >= Isa::Avx512Bf16);
  if (activeIsa() < Isa::Avx512Bf16)
    GTEST_SKIP() << "bf16 products need avx512bf16; this level is " << isaName(activeIsa());
  // Where they are used, they differ from the f32 products (the references
  // above and in the other tests are not the same computation twice).
  TestMatrix w(DType::BF16, 64, 256, rng);
  for (int64_t T : {2, 40}) { // GEMV and GEMM
    std::vector<float> x = randomVector(T * 256, rng), yBf16(T * 64), yF32(T * 64);
    linear(x.data(), T, w.matrix(), nullptr, yBf16.data());
    {
      Precision f32(MatmulPrecision::F32);
      linear(x.data(), T, w.matrix(), nullptr, yF32.data());
    }
    EXPECT_NE(yBf16, yF32) << "T=" << T;
    checkLinear(DType::BF16, T, 64, 256, false, false, rng);
  }
}

TEST(LinearTest, MatrixOfAndSliceRows) {
  std::mt19937 rng(6);
  TestMatrix w(DType::BF16, 10, 7, rng);
  Matrix m = Matrix::of(w.view());
  EXPECT_EQ(m.rows, 10);
  EXPECT_EQ(m.cols, 7);
  EXPECT_EQ(m.rowStride, 7);
  Matrix s = m.sliceRows(3, 4);
  EXPECT_EQ(s.rows, 4);
  EXPECT_EQ(s.cols, 7);
  std::vector<float> x = randomVector(2 * 7, rng), y(2 * 4);
  linear(x.data(), 2, s, nullptr, y.data());
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t n = 0; n < 4; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < 7; ++k)
        ref += (gemm::roundsToBf16(DType::BF16) ? roundBf16(x[t * 7 + k]) : x[t * 7 + k]) *
               w.at(3 + n, k);
      EXPECT_NEAR(y[t * 4 + n], ref, 1e-5);
    }
  EXPECT_THROW(m.sliceRows(8, 3), RuntimeError);
  EXPECT_THROW(Matrix::of(TensorView{DType::BF16, {70}, w.data()}), RuntimeError);
  EXPECT_THROW(Matrix::of(TensorView{DType::I32, {10, 7}, w.data()}), RuntimeError);
}

TEST(LinearTest, AddAndSigmoidGate) {
  std::mt19937 rng(7);
  Threads pool(2);
  for (int64_t n : {1, 17, 300000}) {
    std::vector<float> a = randomVector(n, rng), b = randomVector(n, rng), out(n);
    add(a.data(), b.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out[i], a[i] + b[i]);
    add(a.data(), b.data(), n, a.data()); // in place
    EXPECT_EQ(a, out);
  }
  for (int64_t width : {1, 67, 4096}) {
    int64_t T = 37;
    std::vector<float> x = randomVector(T * width, rng), gate = randomVector(T, rng, 8.0f),
                       out(T * width);
    sigmoidGate(x.data(), gate.data(), T, width, out.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < width; ++i) {
        double ref = x[t * width + i] / (1.0 + std::exp(-static_cast<double>(gate[t])));
        ASSERT_NEAR(out[t * width + i], ref, 1e-6 * std::fabs(ref) + 1e-7);
      }
  }
}

TEST(LinearTest, Argmax) {
  std::vector<float> v = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  EXPECT_EQ(argmax(v.data(), 5), 1); // ties: the lowest index
  EXPECT_EQ(argmax(v.data(), 1), 0);
  std::vector<float> big(32000, -1.0f);
  big[31999] = 2.0f;
  big[20000] = 2.0f;
  EXPECT_EQ(argmax(big.data(), 32000), 20000);
  EXPECT_THROW(argmax(v.data(), 0), RuntimeError);
}

TEST(EmbeddingTest, AllDtypes) {
  std::mt19937 rng(8);
  Threads pool(2);
  for (DType dtype : kWeightTypes)
    for (int64_t width : {1, 3, 67, 1024}) {
      TestMatrix table(dtype, 50, width, rng);
      std::vector<int32_t> ids = {0, 49, 7, 7, 23};
      std::vector<float> out(ids.size() * width);
      embedding(Matrix::of(table.view()), ids.data(), static_cast<int64_t>(ids.size()),
                out.data());
      for (size_t t = 0; t < ids.size(); ++t)
        for (int64_t i = 0; i < width; ++i)
          ASSERT_EQ(out[t * width + i], table.at(ids[t], i)) << dtypeName(dtype);
    }
}

//===----------------------------------------------------------------------===//
// MLP and experts
//===----------------------------------------------------------------------===//

double activationRef(Activation act, double g) {
  switch (act) {
  case Activation::Silu: return g / (1.0 + std::exp(-g));
  case Activation::Gelu: return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
  case Activation::GeluTanh:
    return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
  case Activation::Relu: return g > 0 ? g : 0;
  }
  return g;
}

const Activation kActivations[] = {Activation::Silu, Activation::Gelu, Activation::GeluTanh,
                                   Activation::Relu};

struct TestMlp {
  TestMatrix gate, up, down;
  TestMlp(DType dtype, int64_t H, int64_t I, std::mt19937 &rng)
      : gate(dtype, I, H, rng, 0, 3.0f / std::sqrt(H)), up(dtype, I, H, rng, 0, 3.0f / std::sqrt(H)),
        down(dtype, H, I, rng, 0, 1.0f / std::sqrt(I)) {}

  /// out[H] = down(act(gate x) * up x) in double, and the tolerance of each
  /// output. Where the kernels round the inputs of products with these
  /// weights to bf16 (gemm::roundsToBf16), so does the reference, x and the
  /// hidden activations alike.
  void reference(const float *x, Activation act, std::vector<double> &out,
                 std::vector<double> &tol) const {
    int64_t H = gate.cols, I = gate.rows;
    const bool roundX = gemm::roundsToBf16(gate.dtype);
    auto input = [&](double v) { return roundX ? static_cast<double>(roundBf16(static_cast<float>(v))) : v; };
    std::vector<double> h(I);
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0;
      for (int64_t k = 0; k < H; ++k) {
        g += input(x[k]) * gate.at(i, k);
        u += input(x[k]) * up.at(i, k);
      }
      h[i] = input(activationRef(act, g) * u);
    }
    out.assign(H, 0.0);
    tol.assign(H, 1e-6);
    for (int64_t n = 0; n < H; ++n) {
      double maxTerm = 0;
      for (int64_t i = 0; i < I; ++i) {
        out[n] += h[i] * down.at(n, i);
        // The hidden products pick up f32 rounding before the activation; a
        // looser bound than a single dot product's.
        tol[n] += 2e-5 * std::fabs(h[i] * down.at(n, i));
        maxTerm = std::max(maxTerm, std::fabs(h[i] * down.at(n, i)));
      }
      // The kernel's f32 hidden value and the reference's may round to
      // neighbouring bf16 values: one bf16 step of one term.
      if (roundX)
        tol[n] += maxTerm / 128;
    }
  }
};

TEST(MlpTest, MatchesReference) {
  std::mt19937 rng(9);
  const int64_t H = 67, I = 251;
  for (int threads : {1, 2}) {
    Threads pool(threads);
    for (DType dtype : kWeightTypes) {
      TestMlp m(dtype, H, I, rng);
      for (Activation act : kActivations)
        for (int64_t T : {1, 3, 8, 20}) {
          SCOPED_TRACE(::testing::Message() << dtypeName(dtype) << " act=" << int(act) << " T=" << T
                                            << " threads=" << threads);
          std::vector<float> x = randomVector(T * H, rng, 2.0f), out(T * H);
          std::vector<float> scratch(2 * T * I);
          mlp(x.data(), T, m.gate.matrix(), m.up.matrix(), m.down.matrix(), act, scratch.data(),
              out.data());
          std::vector<double> ref, tol;
          for (int64_t t = 0; t < T; ++t) {
            m.reference(x.data() + t * H, act, ref, tol);
            for (int64_t n = 0; n < H; ++n)
              ASSERT_NEAR(out[t * H + n], ref[n], tol[n]) << "t=" << t << " n=" << n;
          }
        }
    }
  }
}

TEST(MlpTest, PortableFallback) {
  std::mt19937 rng(10);
  NoAvx512 portable;
  const int64_t H = 40, I = 67, T = 11;
  TestMlp m(DType::BF16, H, I, rng);
  for (Activation act : kActivations) {
    std::vector<float> x = randomVector(T * H, rng, 2.0f), out(T * H), scratch(2 * T * I);
    mlp(x.data(), T, m.gate.matrix(), m.up.matrix(), m.down.matrix(), act, scratch.data(),
        out.data());
    std::vector<double> ref, tol;
    for (int64_t t = 0; t < T; ++t) {
      m.reference(x.data() + t * H, act, ref, tol);
      for (int64_t n = 0; n < H; ++n)
        ASSERT_NEAR(out[t * H + n], ref[n], tol[n]);
    }
  }
}

/// Runs `experts` on routing (ids, weights) and checks every token against
/// sum_j w[t,j] * mlp_{ids[t,j]}(x[t]) in double.
void checkExperts(const std::vector<TestMlp> &mlps, int64_t T, int64_t k,
                  const std::vector<int32_t> &ids, const std::vector<float> &weights,
                  Activation act, std::mt19937 &rng) {
  int64_t H = mlps[0].gate.cols;
  std::vector<Matrix> gate, up, down;
  for (const TestMlp &m : mlps) {
    gate.push_back(m.gate.matrix());
    up.push_back(m.up.matrix());
    down.push_back(m.down.matrix());
  }
  std::vector<float> x = randomVector(T * H, rng, 2.0f), out(T * H, 777.0f);
  experts(x.data(), T, H, weights.data(), ids.data(), k, gate, up, down, act, out.data());
  std::vector<double> ref, refTol;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> sum(H, 0.0), tol(H, 1e-6);
    for (int64_t j = 0; j < k; ++j) {
      mlps[ids[t * k + j]].reference(x.data() + t * H, act, ref, refTol);
      for (int64_t n = 0; n < H; ++n) {
        sum[n] += weights[t * k + j] * ref[n];
        tol[n] += refTol[n] * std::fabs(weights[t * k + j]);
      }
    }
    for (int64_t n = 0; n < H; ++n)
      ASSERT_NEAR(out[t * H + n], sum[n], tol[n]) << "t=" << t << " n=" << n;
  }
  // In place (out aliasing x) gives the same result.
  std::vector<float> inPlace = x;
  experts(inPlace.data(), T, H, weights.data(), ids.data(), k, gate, up, down, act,
          inPlace.data());
  EXPECT_EQ(inPlace, out);
}

TEST(ExpertsTest, MatchesReference) {
  std::mt19937 rng(11);
  const int64_t E = 5, H = 67, I = 100;
  Threads pool(2);
  for (DType dtype : kWeightTypes) {
    std::vector<TestMlp> mlps;
    for (int64_t e = 0; e < E; ++e)
      mlps.emplace_back(dtype, H, I, rng);
    for (int64_t k = 1; k <= 4; ++k)
      for (int64_t T : {1, 2, 7, 40}) {
        for (Activation act : kActivations) {
          SCOPED_TRACE(::testing::Message() << dtypeName(dtype) << " k=" << k << " T=" << T
                                            << " act=" << int(act));
          // Distinct experts per token, never expert 2 (it gets no tokens).
          std::vector<int32_t> ids(T * k);
          std::vector<float> weights = randomVector(T * k, rng);
          for (int64_t t = 0; t < T; ++t) {
            std::vector<int32_t> choices = {0, 1, 3, 4};
            std::shuffle(choices.begin(), choices.end(), rng);
            for (int64_t j = 0; j < k; ++j)
              ids[t * k + j] = choices[j];
          }
          checkExperts(mlps, T, k, ids, weights, act, rng);
        }
      }
  }
}

TEST(ExpertsTest, AllTokensToOneExpert) {
  std::mt19937 rng(12);
  Threads pool(2);
  std::vector<TestMlp> mlps;
  for (int e = 0; e < 3; ++e)
    mlps.emplace_back(DType::BF16, 48, 80, rng);
  const int64_t T = 45;
  std::vector<int32_t> ids(T, 1);
  std::vector<float> weights = randomVector(T, rng);
  checkExperts(mlps, T, 1, ids, weights, Activation::Silu, rng);
}

TEST(ExpertsTest, PortableFallback) {
  std::mt19937 rng(13);
  NoAvx512 portable;
  std::vector<TestMlp> mlps;
  for (int e = 0; e < 4; ++e)
    mlps.emplace_back(DType::F16, 33, 50, rng);
  const int64_t T = 9, k = 2;
  std::vector<int32_t> ids(T * k);
  for (int64_t t = 0; t < T; ++t) {
    ids[t * k] = static_cast<int32_t>(t % 3);
    ids[t * k + 1] = 3;
  }
  checkExperts(mlps, T, k, ids, randomVector(T * k, rng), Activation::GeluTanh, rng);
}

TEST(ExpertsTest, RejectsBadExpertIds) {
  std::mt19937 rng(14);
  TestMlp m(DType::F32, 8, 8, rng);
  std::vector<Matrix> gate = {m.gate.matrix()}, up = {m.up.matrix()}, down = {m.down.matrix()};
  std::vector<float> x(8), out(8), weights = {1.0f};
  std::vector<int32_t> ids = {1};
  EXPECT_THROW(experts(x.data(), 1, 8, weights.data(), ids.data(), 1, gate, up, down,
                       Activation::Silu, out.data()),
               RuntimeError);
}

} // namespace
