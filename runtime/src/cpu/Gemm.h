// Internal to the CPU kernels: the single-threaded matrix products that
// `linear`, `mlp` and `experts` split between threads (src/cpu/Linear.cpp).
#pragma once

#include "IsaTarget.h"
#include "moert/cpu/Kernels.h"

#ifdef MOERT_X86
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>

namespace moert::cpu::gemm {

/// Work is split between threads in blocks of this many output columns (the
/// width of the GEMM micro-kernel's tile), so no two threads share a tile.
constexpr int64_t kColumnBlock = 32;

/// Whether the AVX-512 kernels run (moert/cpu/Isa.h: the CPU has them and
/// no lower level is forced).
inline bool haveAvx512() { return activeIsa() >= Isa::Avx512; }
/// Whether products with weights of `dtype` round x to bf16 first (to
/// nearest even; f32 accumulation): BF16 weights under bf16Products()
/// (moert/cpu/Isa.h), whose kernels use vdpbf16ps. Otherwise x stays f32 and
/// the weights are widened.
inline bool roundsToBf16(DType dtype) { return dtype == DType::BF16 && bf16Products(); }
/// Whether the AVX2 + FMA kernels run (or better ones).
inline bool haveAvx2() { return activeIsa() >= Isa::Avx2; }

//===----------------------------------------------------------------------===//
// Shared by the kernels of every level
//===----------------------------------------------------------------------===//

/// A reusable 64-byte aligned scratch buffer, one per thread (pool threads
/// live as long as the process, so it is allocated once).
class Scratch {
public:
  ~Scratch() { std::free(ptr); }
  float *get(size_t count) {
    if (count > size) {
      std::free(ptr);
      size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
      ptr = static_cast<float *>(std::aligned_alloc(64, bytes));
      if (!ptr)
        throw std::bad_alloc();
      size = count;
    }
    return ptr;
  }

private:
  float *ptr = nullptr;
  size_t size = 0;
};

inline const char *rowAddress(const Matrix &w, int64_t row, int64_t col) {
  return static_cast<const char *>(w.data) +
         (row * w.rowStride + col) * static_cast<int64_t>(dtypeSize(w.dtype));
}

template <DType D>
constexpr int64_t kElementSize = D == DType::F32                        ? 4
                                 : D == DType::F8E4M3 || D == DType::I8 ? 1
                                                                        : 2;

/// Up to how many tokens columns() takes the GEMV, which streams the weight
/// rows once, rather than the GEMM that packs them (AVX-512 and AVX2
/// levels). BF16 weights with bf16 products (the avx512bf16 level) switch
/// earlier: from 17 tokens on the packed vdpbf16ps GEMM beats the GEMV
/// (moe-gemm-bench on an AMD EPYC Zen 4, 2 threads, Mixtral-layout MLP
/// weights: 24 tokens 210-240 against 182-195 GFLOP/s, 32 tokens 238-277
/// against 185-196; at 16 tokens they are even).
constexpr int64_t kGemvMaxTokensAvx512 = 32, kGemvMaxTokensAvx2 = 16, kGemvMaxTokensBf16 = 16;
/// int8 weights: up to here the int8 GEMV (gemvInt8), above it the packed
/// GEMM (gemmScaledBf16 with bf16 products; at the lower levels dequantised
/// chunks, columnsScaled).
constexpr int64_t kInt8GemvMaxTokens = 4;
/// Block-scaled weights dequantised in chunks at the avx2 level: above this
/// many tokens the chunks take the packed GEMM rather than the GEMV
/// (moe-gemm-bench, int8 and FP8 under MOERT_ISA=avx2 on an AMD EPYC Zen 4:
/// 8 tokens 84-94 against 71-81 GFLOP/s, 16 tokens 123-133 against 90-101).
constexpr int64_t kScaledGemvMaxTokensAvx2 = 4;

/// How far ahead of its loads the one-token GEMV (gemvRow, every level)
/// prefetches its stream into L2.
constexpr int64_t kRowPrefetchBytes = 2048;

/// The GEMVs' token groups (GemvAvx512.cpp, GemmFp8.cpp): `tokens` split
/// into near-equal groups of at most 4, the first `tokens % groups` one
/// token longer; f(first token, count) for each in order. Each tile of
/// weight rows serves every group while it is in L1.
struct TokenGroups {
  explicit TokenGroups(int64_t tokens)
      : tokens(tokens), groups((tokens + 3) / 4), shortest(tokens / groups),
        longer(tokens % groups) {}
  /// The longest group's count.
  int64_t largest() const { return shortest + (longer > 0); }
  template <typename F>
  void forEach(F &&f) const {
    for (int64_t t = 0, i = 0; t < tokens; t += shortest + (i < longer), ++i)
      f(t, shortest + (i < longer));
  }
  int64_t tokens, groups, shortest, longer;
};

/// f(std::integral_constant<DType, D>()) for the float dtype D that
/// `dtype` is (F32, BF16, F16): the kernels' one dispatch from a run-time
/// dtype to their template instances; nothing for another dtype.
template <typename F>
inline void forFloatDtype(DType dtype, F &&f) {
  switch (dtype) {
  case DType::F32: return f(std::integral_constant<DType, DType::F32>());
  case DType::BF16: return f(std::integral_constant<DType, DType::BF16>());
  case DType::F16: return f(std::integral_constant<DType, DType::F16>());
  default: break;
  }
}

/// Splits `total` into `parts` near-equal pieces, each a multiple of `unit`
/// (but the last): the size of all pieces but the last.
inline int64_t balancedStep(int64_t total, int64_t maxStep, int64_t unit) {
  int64_t parts = (total + maxStep - 1) / maxStep;
  int64_t step = (total + parts - 1) / parts;
  return (step + unit - 1) / unit * unit;
}

#ifdef MOERT_X86
/// The sum of v's 8 lanes (AVX2 kernels).
MOERT_AVX2 inline float horizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

/// The AVX2 + FMA (+ F16C) kernels (GemmAvx2.cpp), with the contracts of
/// columns() and widen() below; called only when haveAvx2().
void columnsAvx2(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
                 int64_t n0, int64_t n1, float *y, int64_t ldy);
/// columnsAvx2 through its packed GEMM whatever the tokens.
void gemmAvx2(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
              int64_t n0, int64_t n1, float *y, int64_t ldy);
void widenAvx2(DType dtype, const void *src, int64_t n, float *out);

/// The AVX-512 GEMV (GemvAvx512.cpp) for few tokens, with the contract of
/// columns(); called only when haveAvx512(), for F32, BF16 and F16 weights.
void gemvAvx512(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
                int64_t n0, int64_t n1, float *y, int64_t ldy);

// The GEMVs in two halves, so that one packing of x serves several weights
// of the same dtype and K (columnsScaled's chunks of dequantised rows:
// packing 32 tokens per chunk of 16 rows cost more than the chunk's
// weights): x [tokens, K] packed into `out` (gemvTokensSize floats, 64-byte
// aligned), then products with it.
inline int64_t gemvTokensSizeAvx2(int64_t tokens, int64_t K) { return (K + 7) / 8 * tokens * 8; }
int64_t gemvTokensSizeAvx512(int64_t tokens, int64_t K);
/// x as gemvAvx512 packs it for weights of `dtype` (rounded to bf16 where
/// roundsToBf16(dtype)).
void packGemvTokensAvx512(const float *x, int64_t ldx, int64_t tokens, int64_t K, DType dtype,
                          float *out);
void gemvPackedAvx512(const float *packed, int64_t tokens, const Matrix &w, const float *bias,
                      int64_t n0, int64_t n1, float *y, int64_t ldy);
/// x as the AVX2 GEMV packs it (for every dtype).
void packGemvTokensAvx2(const float *x, int64_t ldx, int64_t tokens, int64_t K, float *out);
void gemvPackedAvx2(const float *packed, int64_t tokens, const Matrix &w, const float *bias,
                    int64_t n0, int64_t n1, float *y, int64_t ldy);

/// columns() for block-scaled weights, FP8 and int8 (GemmFp8.cpp): a fused
/// GEMV for few tokens, else rows dequantised chunk by chunk into the
/// weight's compute dtype, then multiplied by the kernels of that dtype.
void columnsScaled(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                   const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy);
/// The packed GEMM of columns() with bf16 products (the avx512bf16 level)
/// for a block-scaled weight (FP8 or int8) of a BF16 model: its values
/// dequantised and rounded to bf16 as they are packed, the numbers of the
/// dequantised BF16 rows (columnsScaled's chunks) without writing them.
/// False where it does not apply (tokens <= the GEMV's: kInt8GemvMaxTokens
/// for int8, kGemvMaxTokensAvx512 for FP8, whose table GEMV is faster up to
/// there; blocks that do not hold whole 32-column runs, a lower level).
bool gemmScaledBf16(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                    const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy);
/// columns() for the x stored transposed (element (t, k) at xT[k * ldx + t]:
/// the left operand a^T of a weight gradient a^T b) and no bias, packed
/// from xT's rows as it stands: the bits of columns() on the transposed copy.
/// Only where leftTransposedApplies() (BF16 weights under bf16 products, more
/// tokens than the GEMV's, a nonempty sum).
bool leftTransposedApplies(const Matrix &w, int64_t tokens);
void columnsLeftTransposed(const float *xT, int64_t ldx, int64_t tokens, const Matrix &w,
                           int64_t n0, int64_t n1, float *y, int64_t ldy);
/// The int8 GEMV (GemmInt8.cpp) with the contract of columns(), where it
/// applies (few tokens, AVX2 or better, x finite): false otherwise.
bool gemvInt8(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
              int64_t n0, int64_t n1, float *y, int64_t ldy);
/// Row r of an int8 weight as f32 values (q x scale).
void dequantiseRowInt8(const Matrix &w, int64_t r, float *out);

/// y[t, n] = x[t, :] . w[n, :] (+ bias[n]) for every token t and the output
/// columns n in [n0, n1), on the calling thread only. x has row stride ldx,
/// y row stride ldy; bias (f32, indexed by n) may be null. Few tokens take a
/// GEMV that streams the weight rows once; more take the packed GEMM.
void columns(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
             int64_t n0, int64_t n1, float *y, int64_t ldy);

/// out[i] = float(src[i]) for n elements of a float dtype.
void widen(DType dtype, const void *src, int64_t n, float *out);

} // namespace moert::cpu::gemm
