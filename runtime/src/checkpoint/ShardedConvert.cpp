// `moert convert`: a Hugging Face checkpoint to a sharded one, by one
// process or rank by rank, each writing the boxes the plan gives it; stale
// files of killed saves collected first. Format: docs/checkpoint-format.md.
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

void sharded::collectStaleFiles(const std::string &dir, const std::set<std::string> &keep) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    bool rankFileName = name.rfind("rank-", 0) == 0 &&
                        (name.find(".safetensors.tmp-") != std::string::npos ||
                         (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0));
    bool manifestTemp = name.rfind("manifest.json.tmp-", 0) == 0;
    if ((rankFileName || manifestTemp) && !keep.count(name)) {
      std::error_code removeError;
      fs::remove(it->path(), removeError);
    }
  }
}

void sharded::collectBeforeSave(const std::string &dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return;
  std::set<std::string> keep;
  const fs::path manifest = fs::path(dir) / "manifest.json";
  if (fs::exists(manifest, ec)) {
    try {
      json root = json::parse(readText(manifest.string()));
      for (const json &f : root.at("files"))
        keep.insert(f.at("name").get<std::string>());
    } catch (const std::exception &) {
      // Not readable: keep every complete rank file, drop temporaries only.
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.find(".tmp-") == std::string::npos)
          keep.insert(name);
      }
    }
  }
  collectStaleFiles(dir, keep);
}

CheckpointModel checkpointModel(const Checkpoint &source, const std::string &dir,
                                const std::string &modelType, const std::string &planSource) {
  CheckpointModel model{modelType, planSource, "", source.hasFusedExperts() ? "fused" : "per-expert"};
  if (const ShardedCheckpoint *sharded = source.shardedCheckpoint()) {
    model.configJson = sharded->configJson();
    model.expertLayout = sharded->expertLayout();
    return model;
  }
  std::error_code ec;
  std::string configPath = (fs::path(dir) / "config.json").string();
  if (!fs::exists(configPath, ec))
    configPath = planSource;
  model.configJson = readText(configPath);
  return model;
}

void convertCheckpoint(const std::string &planPath, const std::string &hfDir,
                       const std::string &outDir, Comm *comm) {
  PlanLayout layout = PlanLayout::load(planPath);
  const bool distributed = comm && comm->size() > 1;
  const size_t me = distributed ? static_cast<size_t>(comm->rank()) : 0;
  std::vector<int> world;
  if (distributed) {
    if (comm->size() != layout.worldSize)
      inputError("{}: moert convert was started with {} processes but the plan has {} ranks "
                 "(mpirun -np {})",
                 planPath, comm->size(), layout.worldSize, layout.worldSize);
    for (int r = 0; r < comm->size(); ++r)
      world.push_back(r);
  }
  std::unique_ptr<Checkpoint> hf = Checkpoint::open(hfDir);

  // The logical tensors in plan order, and the boxes each rank writes: its
  // primary slices, minus boxes an earlier rank (another replica) writes.
  struct Logical {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<BoxRef> boxes;
  };
  std::vector<Logical> logical;
  std::map<std::string, size_t> index;
  std::vector<std::vector<const PlanSlice *>> perRank(layout.ranks.size());
  // A save never touches the files the current manifest names: new rank
  // files get a fresh generation tag, the manifest is replaced atomically
  // last, and only then do files that no manifest names go. A save killed at
  // any moment leaves the previous checkpoint whole.
  // Under mpirun every rank uses rank 0's tag.
  // Rank 0 collects what killed saves left before any rank writes (the
  // other ranks wait for its tag).
  if (!distributed || me == 0)
    collectBeforeSave(outDir);
  std::random_device entropy;
  uint32_t tag = entropy() ^ static_cast<uint32_t>(::getpid());
  if (distributed)
    comm->broadcast(&tag, sizeof tag, 0, world, "moert convert (the rank files' generation tag)");
  const std::string generation = fmt::format("{:08x}", tag);
  auto rankFile = [&](size_t r) {
    return fmt::format("rank-{:05d}-{}.safetensors", r, generation);
  };
  for (size_t r = 0; r < layout.ranks.size(); ++r) {
    std::string file = rankFile(r);
    for (const PlanSlice &s : layout.ranks[r]) {
      auto it = index.find(s.name);
      if (it == index.end()) {
        it = index.emplace(s.name, logical.size()).first;
        logical.push_back({s.name, s.dtype, s.globalShape, {}});
      }
      Logical &l = logical[it->second];
      if (l.shape != s.globalShape || l.dtype != s.dtype)
        inputError("{}: rank {}: tensor '{}': {} {} but another rank has it as {} {}", planPath,
                   r, s.name, dtypeName(s.dtype), shapeString(s.globalShape),
                   dtypeName(l.dtype), shapeString(l.shape));
      if (!s.primary)
        continue;
      bool duplicate = false;
      for (const BoxRef &b : l.boxes)
        duplicate |= b.offset == s.offset && b.shape == s.shape;
      if (duplicate)
        continue; // the same box of another data-parallel replica
      for (const BoxRef &b : l.boxes)
        if (b.file == file)
          inputError("{}: rank {}: tensor '{}' has two primary slices on one rank", planPath, r,
                     s.name);
      l.boxes.push_back({s.offset, s.shape, file});
      perRank[r].push_back(&s);
    }
  }
  // Everything is checked before anything is written.
  for (const Logical &l : logical) {
    checkBoxCover(planPath, l.name, l.shape, l.boxes);
    TensorView view = hf->info(l.name, l.shape);
    if (view.dtype != l.dtype)
      inputError("{}: tensor '{}': expected dtype {} (the plan's) but found {}",
                 hf->fileOf(l.name), l.name, dtypeName(l.dtype), dtypeName(view.dtype));
  }
  const CheckpointModel model = checkpointModel(*hf, hfDir, layout.modelType, layout.source);
  const std::string &config = model.configJson, &expertLayout = model.expertLayout;

  makeDirectory(outDir);
  const std::string manifestPath = (fs::path(outDir) / "manifest.json").string();

  // The writes of every rank (their fills read the boxes only when run).
  auto writesOf = [&](size_t r) {
    std::vector<TensorToWrite> writes;
    for (const PlanSlice *s : perRank[r]) {
      const Checkpoint *source = hf.get();
      writes.push_back({s->name, s->dtype, s->shape, [s, source](char *dst) {
                          source->readBox(s->name, s->offset, s->shape, s->dtype, dst);
                        }});
    }
    return writes;
  };
  // This process's rank files: sizes and checksums (bytes 0: no file).
  struct Written {
    uint64_t bytes = 0, crc = 0;
  };
  std::vector<Written> written(perRank.size());
  uint64_t toWrite = 0;
  for (size_t r = 0; r < perRank.size(); ++r)
    if (!distributed || r == me)
      for (const PlanSlice *s : perRank[r])
        toWrite += TensorView{s->dtype, s->shape, nullptr}.bytes();
  {
    Progress progress("convert", toWrite, me == 0);
    std::vector<std::string> mine;
    try {
      for (size_t r = 0; r < perRank.size(); ++r) {
        if (perRank[r].empty() || (distributed && r != me))
          continue;
        std::string file = (fs::path(outDir) / rankFile(r)).string();
        writeSafetensors(file, writesOf(r), [&](uint64_t n) { progress.add(n); });
        mine.push_back(file);
        written[r] = {fs::file_size(file), crc32cOfFile(file)};
      }
    } catch (...) {
      // A failed save (a full disk, a bad source) leaves nothing of its
      // own generation behind; the current checkpoint was never touched.
      for (const std::string &file : mine) {
        std::error_code removeError;
        fs::remove(file, removeError);
      }
      throw;
    }
  }
  if (distributed) {
    // Every rank's file is complete once the gather returns; rank 0 writes
    // the manifest, and every rank waits for it before it exits.
    Written mine = written[me];
    comm->allGather(&mine, sizeof mine, written.data(), world,
                    "moert convert (gathering the rank files' sizes and checksums)");
    for (size_t r = 0; r < perRank.size(); ++r)
      if (!perRank[r].empty() && written[r].bytes == 0)
        runtimeError("{}: rank {} wrote no file", outDir, r);
    if (me != 0) {
      comm->allReduceMax(0, "moert convert (waiting for rank 0's manifest)");
      return;
    }
  }
  ordered_json files = ordered_json::array();
  std::map<std::string, std::pair<uint64_t, uint64_t>> ranges; // "file/name" -> data_offsets
  for (size_t r = 0; r < perRank.size(); ++r) {
    if (perRank[r].empty())
      continue;
    std::string name = rankFile(r);
    std::vector<std::pair<uint64_t, uint64_t>> offsets = safetensorsDataOffsets(writesOf(r));
    for (size_t i = 0; i < perRank[r].size(); ++i)
      ranges[name + "/" + perRank[r][i]->name] = offsets[i];
    files.push_back({{"name", name},
                     {"rank", r},
                     {"bytes", written[r].bytes},
                     {"crc32c", hex32(static_cast<uint32_t>(written[r].crc))}});
  }

  ordered_json tensors = ordered_json::array();
  for (const Logical &l : logical) {
    ordered_json boxes = ordered_json::array();
    for (const BoxRef &b : l.boxes) {
      auto range = ranges.at(b.file + "/" + l.name);
      boxes.push_back({{"file", b.file},
                       {"offset", b.offset},
                       {"shape", b.shape},
                       {"data_offsets", {range.first, range.second}}});
    }
    tensors.push_back(
        {{"name", l.name}, {"dtype", dtypeName(l.dtype)}, {"shape", l.shape}, {"boxes", boxes}});
  }
  ordered_json degrees = ordered_json::object();
  for (const auto &[k, v] : layout.degrees)
    degrees[k] = v;
  ordered_json manifest = {
      {"format", "moe-sharded-checkpoint"},
      {"version", kShardedCheckpointVersion},
      {"producer", "moert convert"},
      {"model", {{"model_type", layout.modelType}, {"source", layout.source},
                 {"config_json", config}, {"expert_layout", expertLayout}}},
      {"plan", {{"path", layout.path}, {"world_size", layout.worldSize}, {"degrees", degrees}}},
      {"checksum", "crc32c"},
      {"files", files},
      {"tensors", tensors}};
  writeTextAtomically(manifestPath, manifest.dump(1) + "\n");
  fsyncPath(outDir, true);
  // Now the new checkpoint is the one: rank files of earlier saves, and
  // temporary files of killed ones, can go.
  std::set<std::string> current;
  for (const auto &f : files)
    current.insert(f["name"].get<std::string>());
  collectStaleFiles(outDir, current);
  if (distributed)
    comm->allReduceMax(0, "moert convert (waiting for rank 0's manifest)");
}

} // namespace moert
