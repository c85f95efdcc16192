// Builders of plan (format 2) JSON for the runtime's units: weights,
// buffers and steps as docs/plan-format.md spells them (all F32 weights).
#pragma once

#include "moert/PlanSeal.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
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

/// Fills each step's "in_from" as moec writes it: per input, the step that
/// last wrote that buffer (-1: the program's inputs, or never written).
inline void linkSteps(json &program) {
  std::map<int64_t, int64_t> lastWriter;
  json &steps = program["steps"];
  for (size_t i = 0; i < steps.size(); ++i) {
    json from = json::array();
    for (const json &id : steps[i]["in"]) {
      auto it = id.is_number_integer() ? lastWriter.find(id.get<int64_t>()) : lastWriter.end();
      from.push_back(it == lastWriter.end() ? -1 : it->second);
    }
    steps[i]["in_from"] = from;
    for (const json &id : steps[i]["out"])
      if (id.is_number_integer())
        lastWriter[id.get<int64_t>()] = static_cast<int64_t>(i);
  }
}

/// linkSteps for every program of a plan.
inline void linkPlan(json &plan) {
  if (plan.contains("programs") && plan["programs"].is_array())
    for (json &program : plan["programs"])
      if (program.is_object() && program.contains("steps") && program["steps"].is_array())
        linkSteps(program);
}

/// A plan's file text: its steps linked (linkPlan) and the text sealed.
inline std::string planText(json plan) {
  linkPlan(plan);
  return sealPlanText(plan.dump());
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
