// `moert export`: a sharded checkpoint back to Hugging Face layout (one
// safetensors file per tensor group, fused expert tensors as transformers
// 5.x names them). Format: docs/checkpoint-format.md.
#include "../InputFile.h"
#include "moert/ShardedCheckpoint.h"
#include "ExpertLayout.h"

#include "moert/Comm.h"
#include "moert/Error.h"
#include "moert/PlanLayout.h"
#include "moert/SafetensorsWriter.h"

#include "../JsonFields.h"
#include "Progress.h"
#include "ShardedFiles.h"

#include <fmt/ranges.h>

#include <cctype>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <system_error>


namespace moert {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using namespace sharded;

namespace {

/// One tensor `moert export` writes: a tensor of the checkpoint, or a fused
/// expert tensor made of several (their blocks in order).
struct ExportTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<const ShardedCheckpoint::Tensor *> blocks;
  uint64_t bytes() const { return TensorView{dtype, shape, nullptr}.bytes(); }
};

/// The checkpoint's tensors as transformers 5.x's fused layout names them:
/// each layer's per-expert gate/up (w1/w3) as one gate_up_proj [E, 2I, H],
/// down (w2) as down_proj [E, H, I], renamed routers; every other tensor as
/// it is, in manifest order (a fused tensor where its first block was).
std::vector<ExportTensor> fusedExport(const ShardedCheckpoint &source) {
  std::vector<ExportTensor> out;
  std::map<std::string, size_t> fusedIndex;
  struct Pending {
    int64_t parts = 1;
    std::map<std::pair<int64_t, int64_t>, const ShardedCheckpoint::Tensor *> blocks;
  };
  std::map<std::string, Pending> pending;
  for (const ShardedCheckpoint::Tensor &t : source.tensors()) {
    std::optional<FusedSlot> slot = fusedSlotOf(t.name);
    if (!slot) {
      std::optional<std::string> renamed = fusedLayoutRename(t.name);
      out.push_back({renamed ? *renamed : t.name, t.dtype, t.shape, {&t}});
      continue;
    }
    if (t.shape.size() != 2)
      inputError("{}: tensor '{}': an expert weight of shape {} (expected rank 2)",
                 source.manifestPath(), t.name, shapeString(t.shape));
    auto found = fusedIndex.find(slot->fused);
    if (found == fusedIndex.end()) {
      found = fusedIndex.emplace(slot->fused, out.size()).first;
      out.push_back({slot->fused, t.dtype, {0, slot->parts * t.shape[0], t.shape[1]}, {}});
      pending[slot->fused].parts = slot->parts;
    }
    ExportTensor &f = out[found->second];
    if (t.dtype != f.dtype || slot->parts * t.shape[0] != f.shape[1] || t.shape[1] != f.shape[2])
      inputError("{}: tensor '{}' ({} {}) does not stack with the other experts of '{}'",
                 source.manifestPath(), t.name, dtypeName(t.dtype), shapeString(t.shape),
                 slot->fused);
    if (!pending[slot->fused].blocks.emplace(std::make_pair(slot->expert, slot->part), &t).second)
      inputError("{}: two tensors for expert {} of '{}'", source.manifestPath(), slot->expert,
                 slot->fused);
  }
  for (auto &[name, p] : pending) {
    ExportTensor &f = out[fusedIndex.at(name)];
    const int64_t experts = static_cast<int64_t>(p.blocks.size()) / p.parts;
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t part = 0; part < p.parts; ++part) {
        auto it = p.blocks.find({e, part});
        if (it == p.blocks.end())
          inputError("{}: '{}' misses part {} of expert {} (the experts must be 0..{})",
                     source.manifestPath(), name, part, e, experts - 1);
        f.blocks.push_back(it->second);
      }
    f.shape[0] = experts;
  }
  return out;
}

} // namespace

void exportCheckpoint(const std::string &ckptDir, const std::string &outDir,
                      uint64_t maxShardBytes, const std::string &expertLayout) {
  if (!ShardedCheckpoint::isSharded(ckptDir))
    inputError("{}: not a sharded checkpoint (no manifest.json)", ckptDir);
  std::unique_ptr<ShardedCheckpoint> ckpt = ShardedCheckpoint::open(ckptDir);
  const ShardedCheckpoint &source = *ckpt;
  const std::string layoutOut = expertLayout.empty() ? source.expertLayout() : expertLayout;
  if (layoutOut != "per-expert" && layoutOut != "fused")
    inputError("--expert-layout: expected per-expert or fused but got '{}'", layoutOut);
  std::vector<ExportTensor> exported;
  if (layoutOut == "fused") {
    exported = fusedExport(source);
  } else {
    for (const ShardedCheckpoint::Tensor &t : source.tensors())
      exported.push_back({t.name, t.dtype, t.shape, {&t}});
  }
  // Tensors in order, cut into shards of at most maxShardBytes (a larger
  // tensor gets a shard of its own).
  std::vector<std::vector<const ExportTensor *>> shards(1);
  uint64_t inShard = 0;
  for (const ExportTensor &t : exported) {
    if (!shards.back().empty() && inShard + t.bytes() > maxShardBytes) {
      shards.emplace_back();
      inShard = 0;
    }
    shards.back().push_back(&t);
    inShard += t.bytes();
  }
  makeDirectory(outDir);
  ordered_json weightMap = ordered_json::object();
  uint64_t total = 0;
  for (const ExportTensor &t : exported)
    total += t.bytes();
  Progress progress("export", total);
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name =
        shards.size() == 1
            ? std::string("model.safetensors")
            : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    std::vector<TensorToWrite> writes;
    for (const ExportTensor *t : shards[i]) {
      writes.push_back({t->name, t->dtype, t->shape, [&source, t](char *dst) {
                          for (const ShardedCheckpoint::Tensor *block : t->blocks) {
                            source.assemble(*block, dst);
                            dst += block->bytes();
                          }
                        }});
      weightMap[t->name] = name;
    }
    writeSafetensors((fs::path(outDir) / name).string(), writes,
                     [&](uint64_t n) { progress.add(n); });
  }
  progress.finish();
  std::error_code ec;
  if (shards.size() == 1) // an index left from an earlier export would shadow the file
    fs::remove(fs::path(outDir) / "model.safetensors.index.json", ec);
  if (shards.size() > 1) {
    ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weightMap}};
    writeTextAtomically((fs::path(outDir) / "model.safetensors.index.json").string(),
                        index.dump(2) + "\n");
  }
  writeTextAtomically((fs::path(outDir) / "config.json").string(), source.configJson());
  fsyncPath(outDir, true);
}


} // namespace moert
