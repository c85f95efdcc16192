// Per-expert <-> fused expert tensor names (ExpertLayout.h).
#include "ExpertLayout.h"

#include <cstdlib>

namespace moert {
namespace {

bool consume(const std::string &text, size_t &at, const char *literal) {
  const std::string l(literal);
  if (text.compare(at, l.size(), l) != 0)
    return false;
  at += l.size();
  return true;
}

/// Digits at `at` (no sign, no leading zero unless "0"), advancing past them.
bool consumeIndex(const std::string &text, size_t &at, int64_t &value) {
  size_t end = at;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9')
    ++end;
  if (end == at || end - at > 9 || (text[at] == '0' && end - at > 1))
    return false;
  value = std::strtoll(text.c_str() + at, nullptr, 10);
  at = end;
  return true;
}

/// "model.layers.L." and the layer's end position, or false.
bool layerPrefix(const std::string &name, size_t &at) {
  int64_t layer;
  at = 0;
  return consume(name, at, "model.layers.") && consumeIndex(name, at, layer) &&
         consume(name, at, ".");
}

} // namespace

std::optional<FusedSlot> fusedSlotOf(const std::string &name) {
  size_t at;
  if (!layerPrefix(name, at))
    return std::nullopt;
  const std::string layer = name.substr(0, at); // "model.layers.L."
  bool mixtral;
  if (consume(name, at, "mlp.experts."))
    mixtral = false;
  else if (consume(name, at, "block_sparse_moe.experts."))
    mixtral = true;
  else
    return std::nullopt;
  int64_t expert;
  if (!consumeIndex(name, at, expert) || !consume(name, at, "."))
    return std::nullopt;
  const std::string rest = name.substr(at);
  FusedSlot slot;
  slot.expert = expert;
  const std::string gateUp = layer + "mlp.experts.gate_up_proj";
  const std::string down = layer + "mlp.experts.down_proj";
  if (rest == (mixtral ? "w1.weight" : "gate_proj.weight"))
    slot = {gateUp, expert, 2, 0};
  else if (rest == (mixtral ? "w3.weight" : "up_proj.weight"))
    slot = {gateUp, expert, 2, 1};
  else if (rest == (mixtral ? "w2.weight" : "down_proj.weight"))
    slot = {down, expert, 1, 0};
  else
    return std::nullopt;
  return slot;
}

std::optional<std::string> fusedLayoutRename(const std::string &name) {
  size_t at;
  if (!layerPrefix(name, at))
    return std::nullopt;
  const std::string layer = name.substr(0, at);
  if (name.compare(at, std::string::npos, "block_sparse_moe.gate.weight") == 0)
    return layer + "mlp.gate.weight";
  return std::nullopt;
}

} // namespace moert
