// The backward pass's CPU kernels: the vector-Jacobian products of the
// forward kernels (Kernels.h), one per op of MoEGradientOps.td, whose
// descriptions give the exact math. f32 throughout; weight gradients are
// f32 [out, in] whatever the weight's dtype; the GEMMs go through
// cpu::linear, so they take the fast paths of every ISA level.
#pragma once

#include "moert/cpu/Kernels.h"

namespace moert::cpu {

/// (softmax(logits[t, :vocab]) - onehot(labels[t])) / ce[1] for the rows
/// with a label (not -100), 0 elsewhere (and in columns from vocab on).
void crossEntropyGrad(const float *logits, int64_t tokens, int64_t width, int64_t vocab,
                      const int32_t *labels, const float ce[2], float *out);

/// The same for a part of the logits (vocabStats' columns: [first, first +
/// width), the first `real` below vocab), the softmax's shift and
/// normaliser from the parts' statistics [T, 4 parts].
void crossEntropyGradPart(const float *logits, int64_t tokens, int64_t width, int64_t real,
                          int64_t first, int64_t vocab, const int32_t *labels, const float ce[2],
                          const float *stats, int64_t parts, float *out);

/// y = x W^T: dx [T, in] = dy W, dw [out, in] = dy^T x.
void linearGrad(const float *dy, const float *x, int64_t tokens, const Matrix &w, float *dx,
                float *dw);

/// moe.rms_norm in groups of weight.numel(): dx and dw (summed over rows
/// and groups).
void rmsNormGrad(const float *dy, const float *x, int64_t tokens, int64_t width,
                 const TensorView &weight, double eps, float *dx, float *dw);
/// Each row's [sum of x^2, sum of dy w x] (in double, out in f32): a part's
/// of rows that tensor parallelism splits (rmsNormGradOfStats adds them).
void rmsNormGradStats(const float *dy, const float *x, int64_t tokens, int64_t width,
                      const TensorView &weight, float *out);
/// rmsNormGrad of parts of rows of `rowWidth` (weight: the part's): stats
/// [T, 2] are the whole rows' rmsNormGradStats; dw the part's.
void rmsNormGradOfStats(const float *dy, const float *x, int64_t tokens, int64_t width,
                        const TensorView &weight, const float *stats, int64_t rowWidth,
                        double eps, float *dx, float *dw);

/// moe.attention over the batch's sequences (each whole: positions from 0,
/// InputError otherwise): dq, dk, dv from dO and the recomputed softmax.
void attentionGrad(const float *dout, const float *q, const float *k, const float *v,
                   const TokenLayout &layout, int64_t heads, int64_t kvHeads, int64_t qkDim,
                   int64_t vDim, double scale, int64_t slidingWindow, float *dq, float *dk,
                   float *dv);

/// moe.mlp: dx [T, H] and the three weight gradients.
void mlpGrad(const float *dy, const float *x, int64_t tokens, const Matrix &gate,
             const Matrix &up, const Matrix &down, Activation act, float *dx, float *dgate,
             float *dup, float *ddown);

/// out [rows, width] = 0, then out[ids[t]] += dy[t] in order; InputError for
/// an id outside [0, rows).
void embeddingGrad(const float *dy, const int32_t *ids, int64_t tokens, int64_t width,
                   int64_t rows, float *out);

/// moe.route_grad: dlogits [T, E] from dw [T, k] at the selected experts
/// [T, k] (the selection held fixed).
void routeGrad(const float *dw, const float *logits, const int32_t *experts, int64_t tokens,
               int64_t numExperts, const RoutingParams &params, float *dlogits);

/// moe.experts_grad: dx [T, H], dweights [T, k] and one gradient matrix
/// per expert of each stack (dgate/dup/ddown: E consecutive [I, H] / [H, I]
/// blocks), zero for an expert no token reached. The experts' gate and up
/// products and outputs come from moe.experts_saved (ExpertsSaved's
/// layout) when given, else are recomputed. capacityFactor > 0: the
/// assignments cpu::experts drops take no part (their dweights are 0).
void expertsGrad(const float *dy, const float *x, int64_t tokens, int64_t hidden,
                 const float *weights, const int32_t *experts, int64_t k,
                 const std::vector<Matrix> &gate, const std::vector<Matrix> &up,
                 const std::vector<Matrix> &down, Activation act, float *dx, float *dweights,
                 float *dgate, float *dup, float *ddown, const float *savedGate = nullptr,
                 const float *savedUp = nullptr, const float *savedOutput = nullptr,
                 double capacityFactor = 0);

/// moe.combine_grad: at each kept slot (slots[t, j] >= 0, a row of the
/// [E * C, H] blocks) doutputs[slot] = weights[t, j] dy[t] and dweights[t, j]
/// = dy[t] . outputs[slot] (f64 sum); a dropped slot's dweights is 0, rows no
/// slot names are not written. The caller checks the slots.
void combineGrad(const float *dy, int64_t H, const float *outputs, const int32_t *slots,
                 const float *weights, int64_t T, int64_t k, float *doutputs, float *dweights);

/// moe.expert_ffn_grad: the blocks buf and dout read as [sources, El, C, H];
/// per local expert l its counted rows of every source (in source order)
/// through moe.mlp_grad (gate and up products recomputed): their input
/// gradients into the same rows of dbuf, the expert's weight gradients
/// (El consecutive [I, H] / [H, I] blocks, 0 for an expert no row reached).
/// With errors (egate, eup, edown: the shapes of dgate, dup, ddown), the
/// weight gradients are compensated sums that each source's are added into
/// (accumulate, moert/cpu/Optimizer.h), their errors kept for the
/// optimizer: a train program's gradient sums (`addIntoSums`), or sums
/// from zero (a micro-batch's gradient and its error). RuntimeError for a
/// count outside [0, C].
void expertFfnGrad(const float *dout, const float *buf, const int32_t *counts, int64_t sources,
                   int64_t El, int64_t C, int64_t H, const std::vector<Matrix> &gate,
                   const std::vector<Matrix> &up, const std::vector<Matrix> &down,
                   Activation act, float *dbuf, float *dgate, float *dup, float *ddown,
                   float *egate = nullptr, float *eup = nullptr, float *edown = nullptr,
                   bool addIntoSums = true);

/// moe.dispatch_grad: dx[t] = sum over j (in order) with slots[t, j] >= 0 of
/// dbuf[slots[t, j]] (rows of [E * C, H]); 0 for a token with none.
void dispatchGrad(const float *dbuf, int64_t H, const int32_t *slots, int64_t T, int64_t k,
                  float *dx);

/// moe.router_stats_grad: one layer's dlogits [T, E] of aux_coef * aux +
/// z_coef * z, given every layer's statistics [3, E].
/// With sequences > 0 (statistics [3 + 2B, E]) the aux term is DeepSeek-V3's
/// sequence-wise loss: its gradient through s / sum(s) of this layer's
/// logits (the top-k counts recomputed from them, constant).
void routerStatsGrad(const float *logits, int64_t tokens, int64_t experts,
                     const float *const *stats, int64_t layers, double auxCoef, double zCoef,
                     float *dlogits, int64_t sequences = 0);

/// moe.bias_grad: out[o] = sum over the rows of dy[t, o], in row order.
void biasGrad(const float *dy, int64_t tokens, int64_t width, float *out);

/// moe.sigmoid_gate: dx [T, W] and dgate [T, 1].
void sigmoidGateGrad(const float *dy, const float *x, const float *gate, int64_t tokens,
                     int64_t width, float *dx, float *dgate);

/// moe.mla_attention: dq [T, H*(n+r)], dkv [T, H*(n+v)], dkeyRope [T, r]
/// (whole sequences, as attentionGrad).
void mlaAttentionGrad(const float *dout, const float *q, const float *kv, const float *keyRope,
                      const TokenLayout &layout, int64_t heads, int64_t nope, int64_t rope,
                      int64_t vdim, double scale, const RopeTable &table, float *dq, float *dkv,
                      float *dkeyRope);

} // namespace moert::cpu
