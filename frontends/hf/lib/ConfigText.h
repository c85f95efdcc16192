//===- ConfigText.h - shared by the config.json readers ---------*- C++ -*-===//
//
// Internal to frontends/hf/lib: how config values appear in messages, and
// the RoPE block reader (RopeScaling.cpp) that ModelConfig.cpp calls.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_FRONTENDS_HF_LIB_CONFIGTEXT_H
#define MOE_FRONTENDS_HF_LIB_CONFIGTEXT_H

#include "moe/Frontend/HF/ModelConfig.h"
#include "moe/Support/JsonFields.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstdio>
#include <string>

namespace moe::hf::detail {

/// A string value for a message: at most 64 characters of it (a config may
/// hold megabytes in one field).
inline std::string clip(llvm::StringRef value) {
  if (value.size() <= 64)
    return value.str();
  return (value.take_front(64) + llvm::formatv("... ({0} bytes)", value.size())).str();
}

/// A double as a config file would spell it (0.5, 1e-06).
inline std::string spell(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", v);
  return text;
}

/// Reads `rope_scaling` / `rope_parameters` and `partial_rotary_factor`
/// into `c` (RopeScaling.cpp).
llvm::Error parseRopeScaling(const moe::json_fields::Fields &f, ModelConfig &c);

} // namespace moe::hf::detail

#endif // MOE_FRONTENDS_HF_LIB_CONFIGTEXT_H
