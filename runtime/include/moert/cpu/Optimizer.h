// The optimizer's CPU kernels (moe-append-optimizer's lr_schedule,
// grad_norm, adamw and the train program's accumulate; docs/training.md,
// "The optimizer"). Every sum is taken in blocks in a fixed order, so a
// run gives the same bits whatever the thread count.
#pragma once

#include <cstdint>

namespace moert::cpu {

/// sum[i] + err[i] += g[i], i < n: the micro-batches' gradients summed with
/// compensation (Knuth's TwoSum: sum takes the f32 sum, err adds up what
/// each addition rounded away), so that sum + err, rounded once
/// (addCompensation), is the correctly rounded sum of the gradients in all
/// but pathological cases, whatever order they were added in: the update
/// of data-parallel replicas equals one rank's (docs/training.md). Without
/// err (null): sum[i] += g[i] (the one gradient of an update).
void accumulate(const float *g, float *sum, float *err, int64_t n);
/// sum[i] = sum[i] + err[i] (rounded to f32), err[i] = 0, i < n.
void addCompensation(float *sum, float *err, int64_t n);
/// Member sums (sum, err) of `members` ranks, each 2 x n floats (n sums, then
/// n errors) at all + q 2n, added in member order into `sum` and `err`:
/// the all_reduce of compensated sums.
void combineCompensated(const float *all, int64_t members, int64_t n, float *sum, float *err);
/// The first and the last pipeline stage's sums of a tied table's gradient
/// (sum, err; without err: nullptr), added as combineCompensated adds two
/// members, first then last, into `sum` and `err` (which may be either's):
/// both stages get the same bits.
void combineStages(const float *firstSum, const float *firstErr, const float *lastSum,
                   const float *lastErr, float *sum, float *err, int64_t n);

/// The sum of x[i]^2 over i < n in double: per block of 64 Ki elements in
/// eight running sums (element i into sum i mod 8), the blocks added in
/// order.
double sumOfSquares(const float *x, int64_t n);

/// The learning-rate schedule (transformers' get_constant_schedule_with_warmup
/// and get_cosine_with_min_lr_schedule_with_warmup, torch's LambdaLR):
/// update `step` (from 1) runs at lr x f(i), i = step - 1: i / warmup during
/// the warmup, then 1 (constant) or minLr/lr + (1 - minLr/lr) x (1 +
/// cos(pi x p)) / 2 with p = (i - warmup) / (decay - warmup), held at minLr
/// after `decay` steps (transformers' cosine would rise again).
struct LrSchedule {
  bool cosine = false;
  double lr = 0, minLr = 0;
  int64_t warmupSteps = 0, decaySteps = 0;
};
double scheduledLr(const LrSchedule &schedule, int64_t step);

/// clip_grad_norm_'s coefficient: min(1, maxNorm / (norm + 1e-6)); 1 when
/// maxNorm is 0 (no clipping).
double clipCoefficient(double norm, double maxNorm);

/// One AdamW update of n parameters (torch.optim.AdamW, its single-tensor
/// formula in float32 with the step's scalars in double): g = gradSum x
/// gradScale (the mean over the micro-batches times the clipping
/// coefficient); p *= 1 - lr wd; m = lerp(m, g, 1 - beta1); v = beta2 v +
/// (1 - beta2) g^2; p -= lr / (1 - beta1^t) x m / (sqrt(v) / sqrt(1 -
/// beta2^t) + eps). gradSum is reset to zero, unless `keepSum` (the
/// backward pass overwrites it before it is read again: one micro-batch a
/// replica per update, moe-append-optimizer's direct sums).
struct AdamWStep {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0, gradScale = 1;
  int64_t step = 1; ///< t, from 1
  bool keepSum = false;
};
void adamw(float *param, float *m, float *v, float *gradSum, int64_t n, const AdamWStep &s);
/// The same on the f32 master weights of a bf16 weight: `master` (which
/// starts as the checkpoint's values: RankExecutor::prepare) is updated and
/// `weight` becomes its rounding to bf16 (nearest even).
void adamwBf16(uint16_t *weight, float *master, float *m, float *v, float *gradSum, int64_t n,
               const AdamWStep &s);

/// load[e] += the number of selections of expert e among ids[0, n) (the
/// routing's [T, k] expert ids; exact in f32 below 2^24 selections).
/// Returns false when an id is outside [0, experts).
bool countExperts(const int32_t *ids, int64_t n, float *load, int64_t experts);

/// DeepSeek-V3's auxiliary-loss-free balancing (Megatron-Core's
/// get_updated_expert_bias): bias[e] += sign(mean(load) - load[e]) x rate,
/// the sign taken exactly from the integer counts and the sum rounded in
/// f32 as torch's `bias + sign(offset) * rate`; load is reset to zero.
void expertBiasUpdate(float *bias, float *load, int64_t experts, double rate);

} // namespace moert::cpu
