// Internal to the CPU kernels: the single-threaded matrix products that
// `linear`, `mlp` and `experts` split between threads (src/cpu/Linear.cpp).
#pragma once

#include "moert/cpu/Kernels.h"

#include <cstdint>

namespace moert::cpu::gemm {

/// Work is split between threads in blocks of this many output columns (the
/// width of the GEMM micro-kernel's tile), so no two threads share a tile.
constexpr int64_t kColumnBlock = 32;

/// Whether the AVX-512 kernels run: the CPU has them (checked once) and
/// they are not switched off.
bool haveAvx512();
/// Switches the AVX-512 kernels off (false) or back on where the CPU has
/// them, so tests can check the portable path on any machine.
void setAvx512Enabled(bool enabled);

/// y[t, n] = x[t, :] . w[n, :] (+ bias[n]) for every token t and the output
/// columns n in [n0, n1), on the calling thread only. x has row stride ldx,
/// y row stride ldy; bias (f32, indexed by n) may be null. Few tokens take a
/// GEMV that streams the weight rows once; more take the packed GEMM.
void columns(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
             int64_t n0, int64_t n1, float *y, int64_t ldy);

/// out[i] = float(src[i]) for n elements of a float dtype.
void widen(DType dtype, const void *src, int64_t n, float *out);

} // namespace moert::cpu::gemm
