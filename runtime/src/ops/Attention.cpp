// rope, attention (with its KV cache) and mla_attention (DeepSeek's
// multi-head latent attention).
#include "Ops.h"

#include <algorithm>

namespace moert::ops {
namespace {

void checkRope(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  int64_t w = c.tokens(step.in[0]);
  c.tokens(step.in[1], DType::I32);
  c.expect(step.headDim > 0 && w % step.headDim == 0, "head_dim does not divide the width");
  c.expect(step.rope.rotaryDim <= step.headDim, "rotary_dim exceeds head_dim");
  c.expect(c.tokens(step.out[0]) == w, "output width differs from the input's");
}

int64_t runRope(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t T = c.rows, wd = c.inWidth(0);
  if (s.out[0] != s.in[0])
    std::copy_n(c.in(0), T * wd, c.out(0));
  c.rope(s.rope).apply(c.out(0), T, wd, s.headDim, c.inInts(1));
  return T;
}

void checkAttention(const StepChecker &c, const PlanStep &step) {
  c.arity(3, 0, 0, 1);
  int64_t q = c.tokens(step.in[0]), k = c.tokens(step.in[1]), v = c.tokens(step.in[2]);
  c.expect(step.heads > 0 && step.kvHeads > 0 && step.heads % step.kvHeads == 0,
           "kv_heads must divide heads");
  c.expect(q % step.heads == 0 && k % step.kvHeads == 0 && v % step.kvHeads == 0,
           "widths are not whole heads");
  c.expect(q / step.heads == k / step.kvHeads, "query and key head dims differ");
  c.expect(c.tokens(step.out[0]) == step.heads * (v / step.kvHeads),
           "output width is not heads x value dim");
  const PlanCache &cache = c.cache();
  c.expect(cache.keyWidth == k && cache.valueWidth == v,
           "kv cache widths differ from key/value widths");
}

int64_t runAttention(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t q = c.inWidth(0), v = c.inWidth(2);
  cpu::attention(c.in(0), c.in(1), c.in(2), *c.layout, s.heads, s.kvHeads, q / s.heads,
                 v / s.kvHeads, s.scale, s.slidingWindow, c.cache(s.kvCache), c.out(0));
  return c.rows;
}

void checkMlaAttention(const StepChecker &c, const PlanStep &step) {
  c.arity(4, 0, 0, 1);
  int64_t q = c.tokens(step.in[0]), kv = c.tokens(step.in[1]), r = c.tokens(step.in[2]);
  c.tokens(step.in[3], DType::I32);
  c.expect(step.heads > 0 && q % step.heads == 0 && kv % step.heads == 0,
           "widths are not whole heads");
  int64_t nope = q / step.heads - r, vdim = kv / step.heads - nope;
  c.expect(r == step.rope.rotaryDim && nope > 0 && vdim > 0, "inconsistent MLA head dims");
  c.expect(c.tokens(step.out[0]) == step.heads * vdim, "output width is not heads x value dim");
  const PlanCache &cache = c.cache();
  c.expect(cache.keyWidth == step.heads * (nope + r) && cache.valueWidth == step.heads * vdim,
           "kv cache widths differ from the MLA head dims");
}

int64_t runMlaAttention(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t r = c.inWidth(2);
  const int64_t nope = c.inWidth(0) / s.heads - r;
  const int64_t vdim = c.inWidth(1) / s.heads - nope;
  cpu::mlaAttention(c.in(0), c.in(1), c.in(2), *c.layout, s.heads, nope, r, vdim, s.scale,
                    c.rope(s.rope), c.cache(s.kvCache), c.out(0));
  return c.rows;
}

} // namespace

const OpDef kRope = {"rope", Collective::None, 0, nullptr, checkRope, runRope};
const OpDef kAttention = {"attention", Collective::None, 0, nullptr, checkAttention,
                          runAttention};
const OpDef kMlaAttention = {"mla_attention", Collective::None, 0, nullptr, checkMlaAttention,
                             runMlaAttention};

} // namespace moert::ops
