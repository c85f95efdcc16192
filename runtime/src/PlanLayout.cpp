// Reading the rank slice lists of a plan (docs/plan-format.md), validated in
// full: a box outside its tensor would be an out-of-bounds copy in convert.
#include "InputFile.h"
#include "moert/PlanLayout.h"
#include "moert/PlanSeal.h"
#include "moert/Error.h"
#include "moert/Plan.h"

#include "JsonFields.h"
#include "PlanReaders.h"
#include "moe/PlanSchema.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace moert {
namespace {

using nlohmann::json;

int64_t elements(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      return -1;
  return n;
}

PlanSlice readSlice(const JsonFields &w) {
  w.onlyMembers(moe::plan::members::kSlice);
  PlanSlice s;
  s.name = w.string("name");
  if (s.name.empty() || s.name.find("{e}") != std::string::npos)
    w.fail("name", fmt::format("expected a checkpoint tensor name but got '{}'", s.name));
  s.globalShape = w.integers("global_shape", 0);
  s.offset = w.integers("offset", 0);
  s.shape = w.integers("shape", 0);
  s.dtype = w.dtype("dtype", /*fp8=*/true);
  if (s.offset.size() != s.globalShape.size() || s.shape.size() != s.globalShape.size())
    w.fail("shape", fmt::format("offset {} and shape {} must have the rank of global_shape {}",
                                shapeString(s.offset), shapeString(s.shape),
                                shapeString(s.globalShape)));
  for (size_t d = 0; d < s.shape.size(); ++d)
    if (s.offset[d] + s.shape[d] > s.globalShape[d])
      w.fail("shape", fmt::format("box at offset {} of shape {} runs past global_shape {}",
                                  shapeString(s.offset), shapeString(s.shape),
                                  shapeString(s.globalShape)));
  int64_t n = elements(s.shape);
  if (n < 0 || elements(s.globalShape) < 0)
    w.fail("global_shape", "too many elements");
  int64_t bytes = w.integer("bytes", 0);
  if (bytes != n * static_cast<int64_t>(dtypeSize(s.dtype)))
    w.fail("bytes", fmt::format("expected {} (shape x dtype size) but got {}",
                                n * static_cast<int64_t>(dtypeSize(s.dtype)), bytes));
  // An FP8 weight names the block of its `<name>_scale_inv` (2-D only).
  if (s.dtype == DType::F8E4M3 || w.has("block")) {
    s.block = w.integers("block", 0);
    if (s.dtype != DType::F8E4M3 || s.globalShape.size() != 2 || s.block.size() != 2 ||
        s.block[0] <= 0 || s.block[1] <= 0)
      w.fail("block", "expected [rows, cols] > 0 for a 2-D F8_E4M3 weight, and only there");
  }
  if (w.has("primary")) {
    if (!w.get("primary").is_boolean())
      w.fail("primary", "expected true or false");
    s.primary = w.get("primary").get<bool>();
  }
  return s;
}

} // namespace

PlanDocument readPlanDocument(const std::string &path) {
  PlanDocument doc;
  doc.text = readInputFile(path, moe::plan::kMaxPlanBytes, "a plan");
  checkJsonDepth(doc.text, path);
  try {
    doc.root = json::parse(doc.text);
  } catch (const json::exception &e) { // parse_error, and out_of_range for a number like 1e512
    inputError("{}: malformed JSON: {}", path, jsonMessage(e));
  }
  if (!doc.root.is_object())
    inputError("{}: not a plan (expected a JSON object written by moec compile)", path);
  JsonFields top(doc.root, path, "");
  if (top.string("format") != moe::plan::kFormat)
    top.fail("format", fmt::format("expected \"{}\" but got \"{}\"", moe::plan::kFormat,
                                   top.string("format")));
  int64_t version = top.integer("version", 0);
  if (version != kPlanFormatVersion)
    top.fail("version", fmt::format("this moert reads plan format {} but the plan is format {}",
                                    kPlanFormatVersion, version));
  checkPlanSeal(doc.text, path); // after the version: another format may seal otherwise
  return doc;
}

const PlanSlice *PlanLayout::slice(int64_t rank, const std::string &name) const {
  for (const PlanSlice &s : ranks.at(static_cast<size_t>(rank)))
    if (s.name == name)
      return &s;
  return nullptr;
}

PlanLayout PlanLayout::load(const std::string &path) {
  PlanDocument doc = readPlanDocument(path);
  return readPlanLayout(JsonFields(doc.root, path, ""), path);
}

PlanLayout readPlanLayout(const JsonFields &top, const std::string &path) {
  PlanLayout layout;
  layout.path = path;
  namespace members = moe::plan::members;
  top.onlyMembers(members::kRoot);
  JsonFields model = top.child(top.get("model"), "model");
  model.onlyMembers(members::kModel);
  layout.modelType = model.string("model_type");
  layout.source = model.string("source");
  layout.worldSize = top.integer("world_size", 1);
  JsonFields degrees = top.child(top.get("degrees"), "degrees");
  degrees.onlyMembers(members::kDegrees);
  for (auto it = top.get("degrees").begin(); it != top.get("degrees").end(); ++it)
    layout.degrees[it.key()] = degrees.integer(it.key(), 1);

  const json &ranks = top.array("ranks");
  if (static_cast<int64_t>(ranks.size()) != layout.worldSize)
    top.fail("ranks", fmt::format("expected world_size {} entries but got {}", layout.worldSize,
                                  ranks.size()));
  layout.ranks.resize(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string field = fmt::format("ranks[{}]", r);
    JsonFields rank = top.child(ranks[r], field);
    rank.onlyMembers(members::kRank);
    if (rank.integer("rank", 0) != static_cast<int64_t>(r))
      rank.fail("rank", fmt::format("expected {}", r));
    if (rank.has("weights_of_rank")) {
      int64_t other = rank.integer("weights_of_rank", 0);
      if (other >= static_cast<int64_t>(r) || !ranks[other].contains("weights"))
        rank.fail("weights_of_rank",
                  fmt::format("expected an earlier rank with a weights list but got {}", other));
      layout.ranks[r] = layout.ranks[other];
      for (PlanSlice &s : layout.ranks[r])
        s.primary = false;
    } else if (rank.has("weights")) {
      const json &weights = rank.array("weights");
      for (size_t i = 0; i < weights.size(); ++i)
        layout.ranks[r].push_back(readSlice(rank.child(weights[i], fmt::format("weights[{}]", i))));
    } else if (layout.worldSize == 1) {
      // A single-rank plan: the top-level weights, whole, expert stacks expanded.
      const json &weights = top.array("weights");
      for (size_t i = 0; i < weights.size(); ++i) {
        JsonFields w = top.child(weights[i], fmt::format("weights[{}]", i));
        w.onlyMembers(members::kWeight);
        std::string name = w.string("name");
        std::vector<int64_t> shape = w.integers("shape", 0);
        DType dtype = w.dtype("dtype");
        int64_t experts = w.has("experts") ? w.integer("experts", 1) : 0;
        if (experts > 0) {
          size_t at = name.find("{e}");
          if (at == std::string::npos || shape.empty() || shape[0] != experts)
            w.fail("experts", "expected a name with {e} and shape[0] == experts");
          shape.erase(shape.begin());
        }
        for (int64_t e = 0; e < std::max<int64_t>(experts, 1); ++e) {
          PlanSlice s;
          s.name = name;
          if (experts > 0)
            s.name.replace(name.find("{e}"), 3, std::to_string(e));
          s.globalShape = s.shape = shape;
          s.offset.assign(shape.size(), 0);
          s.dtype = dtype;
          layout.ranks[r].push_back(std::move(s));
        }
      }
    } else {
      rank.fail("weights", "missing (expected a weights list or weights_of_rank)");
    }
  }
  return layout;
}

} // namespace moert
