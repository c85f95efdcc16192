// FP8 block-scaled weights under `linear` (float8_e4m3fn with one f32 scale
// per block, as DeepSeek-V3 and the FP8 Qwen3 releases publish them): the
// rows a thread computes are dequantised, a chunk at a time, into scratch
// of the weight's compute dtype (f32; or bf16, rounded as DeepSeek's
// reference weight_dequant writes them), which the GEMM or GEMV of that dtype
// multiplies. The products are exactly those of the dequantised weight; the
// weight stays one byte per element in memory.
#include "Gemm.h"

#include "moert/Error.h"

#include <algorithm>

namespace moert::cpu::gemm {
namespace {

thread_local Scratch dequantised;

/// e4m3 -> float for every byte (exact).
struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i)
      value[i] = e4m3ToFloat(static_cast<uint8_t>(i));
  }
};

/// Row r of w, dequantised: out[c] = e4m3(w[r, c]) * scale of its block.
void dequantiseRow(const Matrix &w, int64_t r, float *out) {
  static const E4m3Table table;
  const auto *q = static_cast<const uint8_t *>(w.data) + r * w.rowStride;
  const BlockScales &b = w.fp8;
  const float *scales = b.data + ((b.rowOrigin + r) / b.blockRows) * b.stride;
  for (int64_t c = 0; c < w.cols;) {
    const int64_t block = (b.colOrigin + c) / b.blockCols;
    const int64_t end = std::min(w.cols, (block + 1) * b.blockCols - b.colOrigin);
    const float s = scales[block];
    for (; c < end; ++c)
      out[c] = table.value[q[c]] * s;
  }
}

} // namespace

void columnsFp8(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
                int64_t n0, int64_t n1, float *y, int64_t ldy) {
  if (w.transposed)
    runtimeError("not supported yet: products with the transpose of an FP8 weight");
  const int64_t K = w.cols;
  const bool bf16 = w.fp8.computeDtype == DType::BF16;
  // Rows per chunk: few tokens (the GEMV) keep the chunk in L2 next to the
  // stream; the packed GEMM gets whole column blocks.
  const int64_t bytesPerRow = K * static_cast<int64_t>(sizeof(float));
  int64_t chunk = std::max<int64_t>(1, (int64_t(64) << 10) / bytesPerRow);
  if (tokens > 32)
    chunk = std::max<int64_t>(kColumnBlock, std::min<int64_t>(512, (int64_t(2) << 20) / bytesPerRow) /
                                                kColumnBlock * kColumnBlock);
  chunk = std::min(chunk, n1 - n0);
  float *rows = dequantised.get(static_cast<size_t>(chunk * K));
  for (int64_t n = n0; n < n1; n += chunk) {
    const int64_t m = std::min(chunk, n1 - n);
    for (int64_t r = 0; r < m; ++r)
      dequantiseRow(w, n + r, rows + r * K);
    Matrix d;
    d.dtype = DType::F32;
    d.data = rows;
    d.rows = m;
    d.cols = d.rowStride = K;
    if (bf16) { // rounded in place: the bf16 rows fill the buffer's front half
      auto *h = reinterpret_cast<uint16_t *>(rows);
      for (int64_t i = 0; i < m * K; ++i)
        h[i] = floatToBf16(rows[i]);
      d.dtype = DType::BF16;
    }
    columns(x, ldx, tokens, d, bias ? bias + n : nullptr, 0, m, y + n, ldy);
  }
}

} // namespace moert::cpu::gemm
