// Fused MoE routing + dispatch on bf16 activations: router logits, softmax,
// top-k, renormalise, per-expert positions and the gather of every routed
// (token, slot) row into expert order, in two passes over the tokens.
//
// The math is that of cpu::linear + cpu::route (Kernels.h) for
// RoutingParams{softmax scoring, topK = k, normalize = true, scaling 1,
// one group, no bias, f32 compute}:
//   logits[t, e] = sum_i x[t, i] * gate[e, i]   (bf16 products are exact in
//                  f32; accumulated in f32, so within f32 rounding of the
//                  widened f32 linear, in another summation order)
//   top-k of softmax(logits[t]) = top-k of logits[t] (softmax is monotonic;
//                  ties: lower expert index first; NaN ranks last)
//   weights[t, j] = p_j / (sum_{chosen} p + 1e-20), computed as
//                  exp(l_j - l_0) / sum_chosen exp(l_i - l_0) (the softmax
//                  denominator cancels; the +1e-20 is a no-op in f32 here)
// so weights match cpu::route on the same logits to a few f32 ulps, and the
// chosen experts are identical except where two softmax scores round to the
// same f32 value (cpu::route then picks the lower index, this kernel the
// larger logit).
#pragma once

#include <cstdint>

namespace moert::cpu {

/// Which implementation routeAndDispatchBf16 uses.
enum class DispatchKernel {
  Auto,   ///< AVX-512 BF16 (vdpbf16ps) where the CPU has it, else portable
  Scalar, ///< the portable path (for tests on any machine)
};

/// x: [T, H] bf16 activations; gate: [E, H] bf16 router weight (the
/// checkpoint's [out, in]). Outputs (all caller-allocated):
///   weights      [T, k] f32, descending (the renormalised top-k scores)
///   expertIds    [T, k] i32, the chosen experts in that order
///   rows         [T, k] i32, the row of (t, j) in `dispatched`
///   expertOffsets [E + 1]  expert e owns rows [off[e], off[e+1]); off[E] = T*k
///   dispatched   [T*k, H] bf16, x[t] copied to row rows[t, j] for every
///                (t, j); within an expert, rows are in token order
///   logits       [T, E] f32, optional (null: not written)
/// 1 <= k <= E. Multi-threaded through moert::parallelFor: pass 1 computes
/// the routing of each thread's token chunk and per-expert counts, a prefix
/// sum (expert-major, chunk-minor) gives each chunk's first row per expert,
/// pass 2 copies each chunk's rows (backwards, so the rows pass 1 read last
/// are still cached), with non-temporal stores when input + output exceed
/// half the last-level cache. The copy is exact at any alignment; a
/// 64-byte-aligned `dispatched` with H a multiple of 32 streams whole lines.
/// x and dispatched must not overlap.
void routeAndDispatchBf16(const uint16_t *x, int64_t tokens, int64_t hidden,
                          const uint16_t *gate, int64_t experts, int64_t k, float *weights,
                          int32_t *expertIds, int32_t *rows, int64_t *expertOffsets,
                          uint16_t *dispatched, float *logits = nullptr,
                          DispatchKernel kernel = DispatchKernel::Auto);

} // namespace moert::cpu
