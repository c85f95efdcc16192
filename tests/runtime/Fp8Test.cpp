// FP8 block-scaled weights (float8_e4m3fn + f32 scales per block) under the
// linear kernels: e4m3 decoding, and products with views whose first
// element sits anywhere in its block (a TP slice), on the GEMV (few tokens)
// and GEMM (many) paths, in f32 and in bf16 compute, against double
// references of the dequantised weight. Run at every ISA level the CPU has
// (tests/runtime/CMakeLists.txt).
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include "../../runtime/src/cpu/Gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

using namespace moert;
using namespace moert::cpu;

namespace {

TEST(Fp8Test, DecodesE4m3) {
  EXPECT_EQ(e4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(e4m3ToFloat(0x01), std::ldexp(1.0f, -9)); // smallest subnormal
  EXPECT_EQ(e4m3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3ToFloat(0x08), std::ldexp(1.0f, -6)); // smallest normal
  EXPECT_EQ(e4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(e4m3ToFloat(0x30), 0.5f);
  EXPECT_EQ(e4m3ToFloat(0x3c), 1.5f);
  EXPECT_EQ(e4m3ToFloat(0x7e), 448.0f); // largest finite
  EXPECT_EQ(e4m3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(e4m3ToFloat(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3ToFloat(0xff)));
  // Strictly increasing over the positive codes, negatives mirror them.
  for (int v = 1; v < 0x7f; ++v) {
    EXPECT_LT(e4m3ToFloat(uint8_t(v - 1)), e4m3ToFloat(uint8_t(v))) << v;
    EXPECT_EQ(e4m3ToFloat(uint8_t(v | 0x80)), -e4m3ToFloat(uint8_t(v))) << v;
  }
}

/// An FP8 weight [rows, cols] with scales per block, whose first element is
/// at (rowOrigin, colOrigin) of its first block; `values` is what each
/// element's products take in a model computing in `compute`.
struct Fp8Matrix {
  int64_t rows, cols;
  std::vector<uint8_t> q;
  std::vector<float> scales;
  BlockScales blocks;
  std::vector<double> values;

  Fp8Matrix(int64_t rows, int64_t cols, int64_t blockRows, int64_t blockCols, int64_t rowOrigin,
            int64_t colOrigin, DType compute, std::mt19937 &rng)
      : rows(rows), cols(cols) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(1e-3f, 3e-2f);
    q.resize(static_cast<size_t>(rows * cols));
    for (uint8_t &v : q) {
      v = static_cast<uint8_t>(byte(rng));
      if ((v & 0x7f) == 0x7f)
        v &= 0xfe; // no NaN codes
    }
    const int64_t gridRows = (rowOrigin + rows + blockRows - 1) / blockRows,
                  gridCols = (colOrigin + cols + blockCols - 1) / blockCols;
    scales.resize(static_cast<size_t>(gridRows * gridCols));
    for (float &s : scales)
      s = scale(rng);
    blocks = BlockScales{scales.data(), gridCols, blockRows, blockCols,
                         rowOrigin,     colOrigin, compute};
    values.resize(q.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float w = e4m3ToFloat(q[static_cast<size_t>(r * cols + c)]) * blocks.at(r, c);
        // The kernels' contract: bf16 products where BF16 weights take them.
        const bool bf16 = compute == DType::BF16 && gemm::roundsToBf16(DType::BF16);
        values[static_cast<size_t>(r * cols + c)] = bf16 ? roundBf16(w) : w;
      }
  }
  TensorView view() const { return TensorView{DType::F8E4M3, {rows, cols}, q.data(), &blocks}; }
  double at(int64_t r, int64_t c) const { return values[static_cast<size_t>(r * cols + c)]; }
};

struct Threads {
  explicit Threads(int n) { setNumThreads(n); }
  ~Threads() { setNumThreads(1); }
};

/// linear() with `w` (rows [first, first + count) of `m`) against the double
/// reference of the dequantised weight.
void checkFp8Linear(const Fp8Matrix &m, const Matrix &w, int64_t first, int64_t T,
                    std::mt19937 &rng) {
  SCOPED_TRACE(::testing::Message() << "T=" << T << " rows " << first << "+" << w.rows);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t K = w.cols, ldx = K + 3, ldy = w.rows + 2;
  std::vector<float> x(static_cast<size_t>(T * ldx)), bias(static_cast<size_t>(w.rows));
  for (float &v : x)
    v = dist(rng);
  for (float &v : bias)
    v = dist(rng);
  TensorView biasView{DType::F32, {w.rows}, bias.data()};
  std::vector<float> y(static_cast<size_t>(T * ldy), -7.0f);
  linear(x.data(), T, w, &biasView, y.data(), ldx, ldy);
  const bool roundX = m.blocks.computeDtype == DType::BF16 && gemm::roundsToBf16(DType::BF16);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double ref = bias[static_cast<size_t>(n)], absSum = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        float xk = x[static_cast<size_t>(t * ldx + k)];
        double p = static_cast<double>(roundX ? roundBf16(xk) : xk) * m.at(first + n, k);
        ref += p;
        absSum += std::fabs(p);
      }
      ASSERT_NEAR(y[static_cast<size_t>(t * ldy + n)], ref,
                  1e-6 * std::sqrt(double(K) + 1) * absSum + 1e-30)
          << "t=" << t << " n=" << n;
    }
    ASSERT_EQ(y[static_cast<size_t>(t * ldy + w.rows)], -7.0f) << "wrote past row " << t;
  }
}

TEST(Fp8Test, LinearWithBlockScales) {
  std::mt19937 rng(20);
  Threads pool(2);
  for (DType compute : {DType::F32, DType::BF16})
    for (auto [origin, colOrigin] : {std::pair{0, 2}, {5, 7}, {5, 32}}) {
      SCOPED_TRACE(::testing::Message() << "compute " << dtypeName(compute) << " origin " << origin
                                        << ", " << colOrigin);
      // Blocks of 16 x 32 (the fixtures use DeepSeek's 128 x 128): odd
      // sizes leave ragged last blocks; a non-zero origin is a TP slice.
      // Whole 32-column runs (colOrigin 32) are packed for the GEMM straight
      // from the bytes (its 16-row panels span two block rows here), the
      // others dequantised a chunk of rows at a time.
      Fp8Matrix m(67, 251, 16, 32, origin, colOrigin, compute, rng);
      const Matrix w = Matrix::of(m.view());
      for (int64_t T : {1, 5, 40, 70}) // the GEMV and the GEMM paths
        checkFp8Linear(m, w, 0, T, rng);
      // Rows of the view start elsewhere in their block.
      checkFp8Linear(m, w.sliceRows(19, 30), 19, 3, rng);
      checkFp8Linear(m, w.sliceRows(19, 30), 19, 45, rng);
    }
}

// DeepSeek's 128 x 128 blocks, views starting at a block edge or 64 columns
// into one (the table GEMV's cases where the CPU has AVX512_VBMI) and at 32
// (the shift GEMV's), rows inside a block, a ragged last block.
TEST(Fp8Test, LinearWithPublishedBlocks) {
  std::mt19937 rng(22);
  Threads pool(2);
  for (DType compute : {DType::BF16, DType::F32})
    for (int64_t colOrigin : {0, 64, 32}) {
      SCOPED_TRACE(::testing::Message() << "compute " << dtypeName(compute) << " colOrigin "
                                        << colOrigin);
      Fp8Matrix m(150, 300, 128, 128, 100, colOrigin, compute, rng);
      const Matrix w = Matrix::of(m.view());
      // The table GEMV up to 32 tokens (groups of 1-4 tokens over 4 rows
      // or 1), the packed GEMM above.
      for (int64_t T : {1, 2, 3, 4, 5, 9, 32, 40})
        checkFp8Linear(m, w, 0, T, rng);
    }
}

TEST(Fp8Test, ViewsAndRefusals) {
  std::mt19937 rng(21);
  Fp8Matrix m(9, 40, 4, 16, 1, 3, DType::F32, rng);
  TensorView v = m.view();
  for (int64_t i : {0, 7, 100, 359})
    EXPECT_EQ(v.at(i), static_cast<float>(m.at(i / 40, i % 40))) << i;
  Matrix w = Matrix::of(v);
  EXPECT_EQ(w.scales.rowOrigin, 1);
  EXPECT_EQ(w.sliceRows(2, 3).scales.rowOrigin, 3);
  // An FP8 tensor without its scales is no weight; its transpose (training)
  // is not supported.
  EXPECT_THROW(Matrix::of(TensorView{DType::F8E4M3, {9, 40}, m.q.data()}), RuntimeError);
  EXPECT_THROW(w.transpose(), RuntimeError);
}

} // namespace
