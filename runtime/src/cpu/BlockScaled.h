// Internal to the CPU kernels: walking the blocks of a block-scaled weight
// (FP8, GemmFp8.cpp; int8, GemmInt8.cpp) row by row.
#pragma once

#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <cstdint>

namespace moert::cpu::gemm {

/// The runs [c0, c1) of row r's columns that share a block, with its scale:
/// for (Blocks b(w, r); b.next();) ... (a plain loop: the kernels' bodies
/// must not sit in lambdas, which lose the functions' target attributes).
struct Blocks {
  Blocks(const Matrix &w, int64_t r)
      : cols(w.cols), blockCols(w.scales.blockCols),
        scales(w.scales.data + ((w.scales.rowOrigin + r) / w.scales.blockRows) * w.scales.stride +
               w.scales.colOrigin / w.scales.blockCols),
        c1(-(w.scales.colOrigin % w.scales.blockCols)) {}
  /// The next run: one division per row, none per block (a block's run of
  /// 128 bytes is short next to a division).
  bool next() {
    if (c1 >= cols)
      return false;
    c0 = std::max<int64_t>(c1, 0);
    c1 = std::min(cols, c1 + blockCols);
    scale = *scales++;
    return true;
  }

  const int64_t cols, blockCols;
  const float *scales;
  int64_t c1, c0 = 0; ///< the run (c1 starts at the first block's start)
  float scale = 0;
};

inline const uint8_t *rowBytes(const Matrix &w, int64_t r) {
  return static_cast<const uint8_t *>(w.data) + r * w.rowStride;
}

} // namespace moert::cpu::gemm
