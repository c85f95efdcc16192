// int8 weights (moec compile --weight-format int8: symmetric int8, one f32
// scale per row and block of columns) under the linear kernels, on the
// GEMV (few tokens: x quantised to int16 per block, integer dot products)
// and GEMM (many: dequantised rows) paths, with views whose first column
// sits inside a block (a TP slice), against double references. Run at every
// ISA level the CPU has (tests/runtime/CMakeLists.txt).
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include "../../runtime/src/cpu/Gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace moert;
using namespace moert::cpu;

namespace {

/// An int8 weight [rows, cols], blocks of 1 x `block` columns starting
/// `colOrigin` columns before the view's first one.
struct Int8Matrix {
  int64_t rows, cols, block, colOrigin;
  std::vector<int8_t> q;
  std::vector<float> scales;
  BlockScales blocks;

  Int8Matrix(int64_t rows, int64_t cols, int64_t block, int64_t colOrigin, DType compute,
             std::mt19937 &rng)
      : rows(rows), cols(cols), block(block), colOrigin(colOrigin) {
    std::uniform_int_distribution<int> value(-127, 127);
    std::uniform_real_distribution<float> scale(1e-3f, 3e-2f);
    q.resize(static_cast<size_t>(rows * cols));
    for (int8_t &v : q)
      v = static_cast<int8_t>(value(rng));
    const int64_t grid = (colOrigin + cols + block - 1) / block;
    scales.resize(static_cast<size_t>(rows * grid));
    for (float &s : scales)
      s = scale(rng);
    blocks = BlockScales{scales.data(), grid, 1, block, 0, colOrigin, compute};
  }
  TensorView view() const { return TensorView{DType::I8, {rows, cols}, q.data(), &blocks}; }
  double at(int64_t r, int64_t c) const {
    return static_cast<double>(q[static_cast<size_t>(r * cols + c)]) * blocks.at(r, c);
  }
};

struct Threads {
  explicit Threads(int n) { setNumThreads(n); }
  ~Threads() { setNumThreads(1); }
};

/// linear() against the double reference of the dequantised weight. The
/// GEMV's error bound adds its int16 rounding of x: half a step, max |x|
/// of the block / 32767 / 2, per product.
void checkInt8Linear(const Int8Matrix &m, int64_t T, std::mt19937 &rng) {
  SCOPED_TRACE(::testing::Message() << "T=" << T);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t K = m.cols, N = m.rows, ldx = K + 3, ldy = N + 2;
  std::vector<float> x(static_cast<size_t>(T * ldx)), bias(static_cast<size_t>(N));
  for (float &v : x)
    v = dist(rng);
  // Blocks of very different magnitudes: x's int16 steps are per block.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k)
      x[static_cast<size_t>(t * ldx + k)] *= ((m.colOrigin + k) / m.block) % 2 ? 1e-3f : 1.0f;
  for (float &v : bias)
    v = dist(rng);
  TensorView biasView{DType::F32, {N}, bias.data()};
  std::vector<float> y(static_cast<size_t>(T * ldy), -7.0f);
  linear(x.data(), T, Matrix::of(m.view()), &biasView, y.data(), ldx, ldy);
  const bool gemv = T <= 4 && gemm::haveAvx2();
  const bool bf16 = !gemv && m.blocks.computeDtype == DType::BF16 &&
                    gemm::roundsToBf16(DType::BF16);
  for (int64_t t = 0; t < T; ++t) {
    const float *xt = x.data() + t * ldx;
    for (int64_t n = 0; n < N; ++n) {
      double ref = bias[static_cast<size_t>(n)], absSum = std::fabs(ref), step = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = bf16 ? roundBf16(static_cast<float>(m.at(n, k))) : m.at(n, k);
        const double p = (bf16 ? roundBf16(xt[k]) : xt[k]) * w;
        ref += p;
        absSum += std::fabs(p);
        if (gemv) { // the block's largest |x|
          const int64_t g = (m.colOrigin + k) / m.block * m.block - m.colOrigin,
                        b0 = std::max<int64_t>(0, g), b1 = std::min(K, g + m.block);
          float most = 0;
          for (int64_t j = b0; j < b1; ++j)
            most = std::max(most, std::fabs(xt[j]));
          step += std::fabs(w) * most / 32767.0 / 2;
        }
      }
      ASSERT_NEAR(y[static_cast<size_t>(t * ldy + n)], ref,
                  1e-6 * std::sqrt(double(K) + 1) * absSum + 1.01 * step + 1e-30)
          << "t=" << t << " n=" << n;
    }
    ASSERT_EQ(y[static_cast<size_t>(t * ldy + N)], -7.0f) << "wrote past row " << t;
  }
}

TEST(Int8Test, LinearWithRowBlocks) {
  std::mt19937 rng(80);
  Threads pool(2);
  for (DType compute : {DType::F32, DType::BF16})
    for (int64_t colOrigin : {0, 37, 96}) {
      SCOPED_TRACE(::testing::Message() << "compute " << dtypeName(compute) << " colOrigin "
                                        << colOrigin);
      // 13 rows: the GEMV's groups of 4 and 2 rows and a remainder; 300
      // columns: a ragged last block; 128 as moec writes, 32 to see many.
      // Tokens: the int8 GEMV (1-4), then the packed GEMM (avx512bf16) or
      // dequantised chunks (the GEMV's up to 32 at avx512, the GEMM's
      // above 4 at avx2).
      for (int64_t block : {128, 32}) {
        Int8Matrix m(13, 300, block, colOrigin % block, compute, rng);
        for (int64_t T : {1, 2, 3, 4, 5, 9, 32, 40})
          checkInt8Linear(m, T, rng);
      }
    }
}

// A token whose x is not finite (an infinity, a NaN, in either block)
// takes the exact path: what it computes is the IEEE result of its products
// (inf or NaN), never a number made of an overflowed int16 scale; other
// tokens in the same call are unaffected.
TEST(Int8Test, NonFiniteTokens) {
  std::mt19937 rng(81);
  Int8Matrix m(6, 200, 128, 0, DType::F32, rng);
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")})
    for (int at : {7, 150}) {
      SCOPED_TRACE(::testing::Message() << bad << " at " << at);
      std::vector<float> x(2 * 200, 0.5f);
      x[static_cast<size_t>(at)] = bad;
      std::vector<float> y(2 * 6, 0);
      linear(x.data(), 2, Matrix::of(m.view()), nullptr, y.data(), 200, 6);
      for (int n = 0; n < 6; ++n) {
        EXPECT_FALSE(std::isfinite(y[static_cast<size_t>(n)])) << n;
        double ref = 0;
        for (int k = 0; k < 200; ++k)
          ref += 0.5 * m.at(n, k);
        EXPECT_NEAR(y[static_cast<size_t>(6 + n)], ref, 1e-4) << n;
      }
    }
}

TEST(Int8Test, ViewsAndRefusals) {
  std::mt19937 rng(82);
  Int8Matrix m(5, 40, 16, 3, DType::F32, rng);
  TensorView v = m.view();
  for (int64_t i : {0, 7, 100, 199})
    EXPECT_EQ(v.at(i), static_cast<float>(m.at(i / 40, i % 40))) << i;
  EXPECT_EQ(std::string(dtypeName(DType::I8)), "I8");
  EXPECT_EQ(dtypeSize(DType::I8), 1u);
  // int8 values without their scales are no weight; the transpose
  // (training) is not supported.
  EXPECT_THROW(Matrix::of(TensorView{DType::I8, {5, 40}, m.q.data()}), RuntimeError);
  EXPECT_THROW(Matrix::of(v).transpose(), RuntimeError);
}

} // namespace
