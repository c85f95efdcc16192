//===- RopeScaling.cpp - the RoPE fields of config.json ----------*- C++ -*-===//
#include "ConfigText.h"

#include "llvm/ADT/StringSwitch.h"

#include <cmath>

using namespace llvm;
using namespace moe::hf;
using namespace moe::hf::detail;
using moe::json_fields::Fields;

namespace {

/// An optional number where transformers treats 0 and null as absent
/// (`mscale`, `mscale_all_dim`, `attention_factor`: `if mscale and ...`).
Error optionalNumber(const Fields &f, StringRef field,
                     std::optional<double> &out) {
  if (!f.has(field))
    return Error::success();
  double v;
  MOE_ASSIGN(v, f.number(field, 0.0));
  if (!std::isfinite(v))
    return f.fail(field, formatv("expected a finite number but got {0}", v));
  if (v != 0.0)
    out = v;
  return Error::success();
}

Error checkPartialRotary(const Fields &f, ModelConfig &c) {
  if (!f.has("partial_rotary_factor"))
    return Error::success();
  double prf;
  MOE_ASSIGN(prf, f.number("partial_rotary_factor", 1.0));
  if (prf != 1.0)
    c.unsupportedFeature = formatv("partial_rotary_factor = {0} (rotary "
                                   "embedding on part of each head)", spell(prf)).str();
  return Error::success();
}

} // namespace

/// RoPE: transformers 4.x writes a top-level `rope_theta` and an optional
/// `rope_scaling` block; 5.x writes one `rope_parameters` block holding
/// `rope_type`, `rope_theta` and the scaling fields. 5.x reads
/// `rope_scaling` first when a file has both, and takes `rope_theta` from the
/// block before the top level; both dialects read the same here.
Error moe::hf::detail::parseRopeScaling(const Fields &f, ModelConfig &c) {
  if (Error e = checkPartialRotary(f, c))
    return e;
  std::optional<Fields> rs;
  MOE_ASSIGN(rs, f.nested("rope_scaling"));
  if (!rs)
    MOE_ASSIGN(rs, f.nested("rope_parameters"));
  if (!rs)
    return Error::success();
  MOE_ASSIGN(c.ropeTheta, rs->positiveNumber("rope_theta", c.ropeTheta));
  if (Error e = checkPartialRotary(*rs, c))
    return e;
  std::string type;
  // Transformers accepts both spellings; `rope_type` wins when both are set.
  MOE_ASSIGN(type, rs->string("type", "default"));
  MOE_ASSIGN(type, rs->string("rope_type", type));
  RopeScaling &s = c.ropeScaling;
  std::optional<RopeScalingKind> kind =
      StringSwitch<std::optional<RopeScalingKind>>(type)
          .Case("default", RopeScalingKind::None)
          .Case("linear", RopeScalingKind::Linear)
          .Case("dynamic", RopeScalingKind::Dynamic)
          .Case("llama3", RopeScalingKind::Llama3)
          .Case("yarn", RopeScalingKind::Yarn)
          .Cases("longrope", "su", RopeScalingKind::LongRope)
          .Default(std::nullopt);
  if (!kind)
    return rs->fail("rope_type", "unknown rope scaling type '" + clip(type) +
                                     "' (expected default, linear, dynamic, "
                                     "llama3, yarn or longrope)");
  s.kind = *kind;
  s.present = s.kind != RopeScalingKind::None;
  if (s.kind == RopeScalingKind::None)
    return Error::success();
  if (s.kind == RopeScalingKind::LongRope) {
    c.unsupportedFeature = "longrope rotary scaling";
    return Error::success();
  }
  MOE_ASSIGN(s.originalMaxPosition,
             rs->positiveOr("original_max_position_embeddings",
                            c.maxPositionEmbeddings));
  // YaRN without `factor`: transformers 5.x derives it from the two lengths.
  double defaultFactor = 1.0;
  if (s.kind == RopeScalingKind::Yarn && !rs->has("factor"))
    defaultFactor = static_cast<double>(c.maxPositionEmbeddings) /
                    static_cast<double>(s.originalMaxPosition);
  else if (!rs->has("factor"))
    return rs->fail("factor", "missing (required for " + clip(type) + " scaling)");
  MOE_ASSIGN(s.factor, rs->positiveNumber("factor", defaultFactor));
  if (!std::isfinite(s.factor))
    return rs->fail("factor", "expected a finite number");
  if ((s.kind == RopeScalingKind::Yarn || s.kind == RopeScalingKind::Llama3) &&
      f.has("original_max_position_embeddings")) {
    // transformers 5.x takes a top-level original_max_position_embeddings
    // over the block's; 4.57 reads only the block.
    int64_t top;
    MOE_ASSIGN(top, f.positive("original_max_position_embeddings"));
    if (top != s.originalMaxPosition)
      c.unsupportedFeature =
          formatv("original_max_position_embeddings = {0} at the top level "
                  "and {1} for the rotary scaling (transformers 4.x and 5.x "
                  "read different ones)", top, s.originalMaxPosition).str();
  }
  if (s.kind == RopeScalingKind::Dynamic) {
    // transformers' dynamic NTK grows the base past max_position_embeddings
    // (its rotary module's original_max_seq_len), whatever the block says.
    s.originalMaxPosition = c.maxPositionEmbeddings;
  }
  MOE_ASSIGN(s.lowFreqFactor, rs->positiveNumber("low_freq_factor", 1.0));
  MOE_ASSIGN(s.highFreqFactor, rs->positiveNumber("high_freq_factor", 4.0));
  // `beta_fast or 32`: transformers treats 0 as absent.
  MOE_ASSIGN(s.betaFast, rs->number("beta_fast", 32.0));
  MOE_ASSIGN(s.betaSlow, rs->number("beta_slow", 1.0));
  if (s.betaFast == 0.0)
    s.betaFast = 32.0;
  if (s.betaSlow == 0.0)
    s.betaSlow = 1.0;
  MOE_ASSIGN(s.truncate, rs->boolean("truncate", true));
  if (Error e = optionalNumber(*rs, "mscale", s.mscale))
    return e;
  if (Error e = optionalNumber(*rs, "mscale_all_dim", s.mscaleAllDim))
    return e;
  if (Error e = optionalNumber(*rs, "attention_factor", s.attentionFactor))
    return e;
  if (s.attentionFactor && !(*s.attentionFactor > 0))
    return rs->fail("attention_factor",
                    formatv("expected a value > 0 but got {0}", *s.attentionFactor));
  if (s.kind == RopeScalingKind::Llama3 && !(s.highFreqFactor > s.lowFreqFactor))
    return rs->fail("high_freq_factor",
                    formatv("expected > low_freq_factor ({0}) but got {1}",
                            s.lowFreqFactor, s.highFreqFactor));
  if (s.kind == RopeScalingKind::Yarn && !(s.betaFast > s.betaSlow))
    return rs->fail("beta_fast", formatv("expected > beta_slow ({0}) but got {1}",
                                         s.betaSlow, s.betaFast));
  return Error::success();
}

double moe::hf::yarnMscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

double moe::hf::ropeAttentionFactor(const RopeScaling &s) {
  if (s.kind != RopeScalingKind::Yarn)
    return 1.0;
  if (s.attentionFactor)
    return *s.attentionFactor;
  if (s.mscale && s.mscaleAllDim)
    return yarnMscale(s.factor, *s.mscale) / yarnMscale(s.factor, *s.mscaleAllDim);
  return yarnMscale(s.factor, 1.0);
}

