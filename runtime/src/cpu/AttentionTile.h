// Internal to the CPU attention (Attention.cpp): the tile kernels of the
// vector paths, one per instruction-set level.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moert::cpu {

/// Per-thread scratch of a tile kernel.
struct TileScratch {
  std::vector<float> qt, s;
  std::vector<int32_t> first, last;

  /// The tile's queries transposed to qt [dq][ld] (lane r: query row r,
  /// zero past `rows`), each row's key range relative to j0 (empty past
  /// `rows`), and room for the scores s [nk][ld].
  void prepare(const float *const *qrow, const int32_t *firstRow, const int32_t *lastRow,
               int64_t rows, int64_t ld, int64_t j0, int64_t nk, int64_t dq) {
    qt.assign(static_cast<size_t>(dq * ld), 0.0f);
    s.resize(static_cast<size_t>(nk * ld));
    first.assign(static_cast<size_t>(ld), 1);
    last.assign(static_cast<size_t>(ld), 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < dq; ++d)
        qt[d * ld + r] = qrow[r][d];
      first[r] = static_cast<int32_t>(firstRow[r] - j0);
      last[r] = static_cast<int32_t>(lastRow[r] - j0);
    }
  }
};

/// One tile: `rows` query rows (tokens of one slot x the query heads of kv
/// head g) against keys [j0, j0 + nk) of that slot; query row r sees keys
/// [firstRow[r], lastRow[r]]. out_r = softmax(q_r . K^T * scale) V. Each
/// row's arithmetic (an FMA chain over the head dim, the scale, a masked
/// max, e^(s - max), a running sum over keys in order, a value sum over keys
/// in order, one division) never depends on the other rows, so a token gets
/// the same bits in any tile.
using AttendTile = void (*)(const float *const *qrow, float *const *orow, const int32_t *firstRow,
                            const int32_t *lastRow, int64_t rows, const float *keys, int64_t kw,
                            const float *values, int64_t vw, int64_t j0, int64_t nk, int64_t dq,
                            int64_t dv, float scale, TileScratch &ts);

/// The AVX2 + FMA tile (AttentionAvx2.cpp).
void attendTileAvx2(const float *const *qrow, float *const *orow, const int32_t *firstRow,
                    const int32_t *lastRow, int64_t rows, const float *keys, int64_t kw,
                    const float *values, int64_t vw, int64_t j0, int64_t nk, int64_t dq,
                    int64_t dv, float scale, TileScratch &ts);

} // namespace moert::cpu
