// Builders of plan (format 2) JSON for the runtime's units: weights,
// buffers and steps as docs/plan-format.md spells them (all F32 weights).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace moert::test {

using nlohmann::json;

/// A weights entry; `experts` > 0 makes it a stack (shape[0] == experts).
inline json weight(const std::string &name, std::vector<int64_t> shape, int64_t experts = 0) {
  int64_t n = 4;
  for (int64_t d : shape)
    n *= d;
  json w = {{"name", name}, {"shape", shape}, {"dtype", "F32"}, {"bytes", n}};
  if (experts)
    w["experts"] = experts;
  return w;
}

inline json buffer(int64_t rows, int64_t width, const char *dtype = "F32") {
  return {{"rows", rows}, {"width", width}, {"dtype", dtype}, {"bytes", rows * width * 4}};
}

inline json step(const char *op, std::vector<int64_t> in, std::vector<int64_t> weights,
                 std::vector<int64_t> out, json attrs = json::object()) {
  return {{"op", op}, {"in", in}, {"weights", weights}, {"out", out}, {"attrs", attrs}};
}

/// A box of a checkpoint tensor in ranks[].weights.
inline json slice(const std::string &name, std::vector<int64_t> globalShape,
                  std::vector<int64_t> offset, std::vector<int64_t> shape) {
  int64_t n = 4;
  for (int64_t d : shape)
    n *= d;
  return {{"name", name}, {"global_shape", globalShape}, {"offset", offset},
          {"shape", shape}, {"dtype", "F32"}, {"bytes", n}};
}

} // namespace moert::test
