// The two ways Hugging Face checkpoints store routed experts, and the names
// that map one onto the other. Plans name per-expert tensors as transformers
// 4.x registers them (`model.layers.L.mlp.experts.E.gate_proj.weight`,
// Mixtral's `model.layers.L.block_sparse_moe.experts.E.w1.weight`);
// transformers 5.x with `save_pretrained(save_original_format=False)`
// writes every layer's experts as two fused tensors:
//
//   model.layers.L.mlp.experts.gate_up_proj  [E, 2 I, H]  (gate rows, then up)
//   model.layers.L.mlp.experts.down_proj     [E, H, I]
//
// and Mixtral's router as `model.layers.L.mlp.gate.weight` (every family's
// layout in docs/conformance.md). Expert e's gate, up and down are
// contiguous blocks of those tensors, so a per-expert tensor is a box of a
// fused one: read, viewed and exported without reshuffling.
#ifndef MOERT_SRC_CHECKPOINT_EXPERTLAYOUT_H
#define MOERT_SRC_CHECKPOINT_EXPERTLAYOUT_H

#include <cstdint>
#include <optional>
#include <string>

namespace moert {

/// Where a per-expert tensor lives in a fused checkpoint: `part` of `parts`
/// equal row blocks of expert `expert` of `fused` ([E, parts * R, C]).
struct FusedSlot {
  std::string fused;
  int64_t expert = 0;
  int64_t parts = 1, part = 0;
};

/// The fused slot of a per-expert tensor name, or nullopt for any other name.
std::optional<FusedSlot> fusedSlotOf(const std::string &perExpertName);

/// The name transformers 5.x gives a tensor it renames outside the experts
/// (Mixtral's `block_sparse_moe.gate.weight` -> `mlp.gate.weight`), or
/// nullopt.
std::optional<std::string> fusedLayoutRename(const std::string &name);

} // namespace moert

#endif // MOERT_SRC_CHECKPOINT_EXPERTLAYOUT_H
