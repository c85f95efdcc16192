// Internal to the backward kernels (Gradients.cpp, AttentionGrad.cpp,
// ExpertBlockGrad.cpp):
// reusable buffers and the transposes that turn the gradient GEMMs into
// cpu::linear's y = x w^T (a weight's transpose is a view: Matrix::transpose).
#pragma once

#include "moert/cpu/Kernels.h"

#include <cstdint>
#include <vector>

namespace moert::cpu {
/// The forward kernels' g = act(g) * u over n values (Linear.cpp: the
/// vectorised activation of mlp and experts, whose bits a recomputation must
/// repeat).
void forwardGatedProduct(Activation act, float *g, const float *u, int64_t n);
} // namespace moert::cpu

namespace moert::cpu::grad {

/// The calling thread's reusable buffers, one per slot. A training step
/// repeats the same shapes, so after the first step the backward kernels
/// allocate (and page-fault) nothing. A slot's buffer is valid until the
/// next call with the same slot on this thread: each kernel names the
/// slots it holds at once.
enum Slot {
  kLeftT,        // matmulTN's transposed left operand
  kRightBf16,    // matmulTN's right operand rounded to bf16
  kMlpA,         // mlpBackward / expertsGrad: activations and their gradients
  kMlpU,
  kMlpH,
  kMlpDh,
  kMlpDaDu,
  kMlpPart,
  kExpertX,      // expertsGrad: one expert's rows
  kExpertY,
  kExpertDy,
  kExpertDx,
  kExpertRowsDx, // expertsGrad: every (token, slot)'s input gradient
  kAttnScores,   // attentionGrad: one head's [S, S] blocks
  kAttnDScores,
  kAttnPanels,   // attentionGrad: Q^T, dO^T, dK^T, dV^T of one head
  kAttnKeyGrads, // attentionGrad: per head dK and dV, summed per group after
  kAttnValueGrads,
  kLogSumExp,    // the cross-entropy's forward: one row's exponentials
  kSlotCount
};
float *workspace(Slot slot, size_t count);

/// out[i] = floatToBf16(in[i]) for n floats (vectorized where AVX-512 runs:
/// the same bits).
void roundRowToBf16(const float *in, int64_t n, uint16_t *out);

/// out [cols, rows] (row stride ldOut) = in [rows, cols] (row stride
/// ldIn)^T, on the calling thread, in cache-sized blocks.
void transposeSerial(const float *in, int64_t rows, int64_t cols, int64_t ldIn, float *out,
                     int64_t ldOut);
/// The same, split between the threads.
void transpose(const float *in, int64_t rows, int64_t cols, int64_t ldIn, float *out,
               int64_t ldOut);

/// A dense f32 [rows, cols] matrix (row stride ld, 0: cols) as a weight.
Matrix f32Matrix(const float *data, int64_t rows, int64_t cols, int64_t ld = 0);

/// c [m, n] (row stride ldc) = a^T b for a [t, m] (row stride lda) and
/// b [t, n] (row stride ldb): sums over the rows t. Uses the kLeftT slot.
/// With `bf16`, the products of bf16 values (a and b rounded to nearest
/// even, f32 sums: vdpbf16ps), as PyTorch's BF16 autograd computes a BF16
/// weight's gradient; b's rounding uses the kRightBf16 slot.
void matmulTN(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t t, int64_t m,
              int64_t n, float *c, int64_t ldc = 0, bool bf16 = false);

/// Whether the gradient products of weight `w` round to bf16 as its forward
/// products do (BF16 weights at the avx512bf16 level: gemm::roundsToBf16);
/// dx = dy w takes that path by itself (a transposed bf16 view).
bool bf16Products(const Matrix &w);

/// The gated MLP's gradients over T rows x [T, H] (its gate and up products
/// recomputed with the forward kernels' arithmetic): dx [T, H] and the
/// weight gradients (f32 [I, H], [I, H], [H, I]). Uses the kMlp* slots.
void mlpBackwardRecomputed(const float *dy, const float *x, int64_t T, const Matrix &gate,
                           const Matrix &up, const Matrix &down, Activation act, float *dx,
                           float *dgate, float *dup, float *ddown);

/// o[v] = e^(x[v] - peak) over n values (f32, the softmax's numerators, as
/// torch's f32 softmax: 16 or 8 lanes at the AVX-512 and AVX2 levels, f64 on
/// the portable one); returns their sum in f64 (Gradients.cpp; the
/// cross-entropy's gradient, and its forward's sums in Loss.cpp).
double expShifted(const float *x, int64_t n, float peak, float *o);

} // namespace moert::cpu::grad
