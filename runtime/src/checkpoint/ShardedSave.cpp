// `moert train --save`: a training checkpoint of one process, in the sharded
// format (docs/checkpoint-format.md, "Training checkpoints"): one rank file
// with the model's tensors and the optimizer's state tensors, and the
// manifest, written last, that also records the training progress.
#include "moert/SafetensorsWriter.h"
#include "moert/ShardedCheckpoint.h"

#include "ShardedFiles.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <random>

namespace moert {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;
using namespace sharded;

void writeTrainingCheckpoint(const std::string &outDir, const CheckpointModel &model,
                             const std::string &planPath,
                             const std::vector<TensorToWrite> &tensors,
                             const std::vector<TensorToWrite> &state,
                             const TrainingProgress &progress) {
  makeDirectory(outDir);
  collectBeforeSave(outDir);
  std::random_device entropy;
  const uint32_t tag = entropy() ^ static_cast<uint32_t>(::getpid());
  const std::string name = fmt::format("rank-00000-{:08x}.safetensors", tag);
  const std::string file = (fs::path(outDir) / name).string();
  std::vector<TensorToWrite> all(tensors);
  all.insert(all.end(), state.begin(), state.end());
  writeSafetensors(file, all);
  uint64_t bytes = 0, crc = 0;
  try {
    bytes = fs::file_size(file);
    crc = crc32cOfFile(file);
  } catch (...) {
    std::error_code ec;
    fs::remove(file, ec);
    throw;
  }
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = safetensorsDataOffsets(all);
  auto entries = [&](size_t begin, size_t end) {
    ordered_json list = ordered_json::array();
    for (size_t i = begin; i < end; ++i) {
      const std::vector<int64_t> origin(all[i].shape.size(), 0);
      list.push_back({{"name", all[i].name},
                      {"dtype", dtypeName(all[i].dtype)},
                      {"shape", all[i].shape},
                      {"boxes", ordered_json::array({{{"file", name},
                                                      {"offset", origin},
                                                      {"shape", all[i].shape},
                                                      {"data_offsets",
                                                       {ranges[i].first, ranges[i].second}}}})}});
    }
    return list;
  };
  ordered_json degrees = {{"dp", 1}, {"edp", 1}, {"ep", 1}, {"etp", 1}, {"pp", 1}, {"tp", 1}};
  ordered_json manifest = {
      {"format", "moe-sharded-checkpoint"},
      {"version", kShardedCheckpointVersion},
      {"producer", "moert train"},
      {"model", {{"model_type", model.modelType}, {"source", model.source},
                 {"config_json", model.configJson}, {"expert_layout", model.expertLayout}}},
      {"plan", {{"path", planPath}, {"world_size", 1}, {"degrees", degrees}}},
      {"checksum", "crc32c"},
      {"files", ordered_json::array({{{"name", name},
                                      {"rank", 0},
                                      {"bytes", bytes},
                                      {"crc32c", hex32(static_cast<uint32_t>(crc))}}})},
      {"tensors", entries(0, tensors.size())},
      {"training", {{"step", progress.step},
                    {"micro_batches_done", progress.microBatchesDone},
                    {"micro_batches", progress.microBatches},
                    {"seq_len", progress.seqLen},
                    {"micro_batch_size", progress.microBatchSize},
                    {"shuffle_seed", progress.shuffleSeed},
                    {"state", entries(tensors.size(), all.size())}}}};
  writeTextAtomically((fs::path(outDir) / "manifest.json").string(), manifest.dump(1) + "\n");
  fsyncPath(outDir, true);
  collectStaleFiles(outDir, {name});
}

} // namespace moert
