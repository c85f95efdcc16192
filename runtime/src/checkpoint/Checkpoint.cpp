// A Hugging Face checkpoint: one model.safetensors, an index with its
// shards, or a sharded (moert) checkpoint, by tensor name. Names resolve to
// the file that holds them (the index's weight_map checked against each
// shard's header), fused expert stacks are aliased per expert
// (ExpertLayout.h), and tensors are views into the files' mappings
// (Safetensors.cpp).
#include "../InputFile.h"
#include "../JsonFields.h"
#include "moert/Checkpoint.h"
#include "ExpertLayout.h"

#include "moert/Error.h"
#include "moert/ShardedCheckpoint.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_map>

namespace moert {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

/// What Checkpoint::open fills in (its members are private, so the helpers
/// below build this and open() moves it in).
struct Opened {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::unordered_map<std::string, size_t> fileIndex;
};

Opened openSingle(const std::string &path) {
  Opened opened;
  opened.files.push_back(SafetensorsFile::open(path));
  for (const std::string &name : opened.files[0]->names())
    opened.fileIndex.emplace(name, 0);
  return opened;
}

json readIndex(const std::string &indexPath) {
  const std::string content = readInputFile(indexPath, uint64_t(1) << 28, "an index");
  checkJsonDepth(content, indexPath);
  return parseJsonObject(indexPath, content.data(), content.data() + content.size(), "index");
}

/// A shard named by the index must be a plain file name next to the index,
/// so that an index cannot make the runtime open arbitrary paths.
std::string shardPath(const std::string &indexPath, const std::string &tensor,
                      const json &shard) {
  if (!shard.is_string())
    inputError("{}: weight_map entry for tensor '{}' is a JSON {}, expected a file name",
               indexPath, tensor, shard.type_name());
  const std::string &name = shard.get_ref<const std::string &>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    inputError("{}: weight_map puts tensor '{}' in '{}', which is not a file name in the "
               "checkpoint directory",
               indexPath, tensor, name);
  return (fs::path(indexPath).parent_path() / name).string();
}

/// Opens every distinct shard of the index once and checks that each tensor
/// really is in the shard the index names. Tensors a shard holds but the
/// index does not list are not part of the checkpoint (as in transformers).
Opened openSharded(const std::string &indexPath) {
  json index = readIndex(indexPath);
  auto weightMap = index.find("weight_map");
  if (weightMap == index.end() || !weightMap->is_object())
    inputError("{}: expected a \"weight_map\" object mapping tensor names to shard files",
               indexPath);
  if (weightMap->empty())
    inputError("{}: \"weight_map\" is empty", indexPath);

  Opened opened;
  std::unordered_map<std::string, size_t> shardIndex; // shard path -> files[i]
  for (auto it = weightMap->begin(); it != weightMap->end(); ++it) {
    const std::string &tensor = it.key();
    const std::string shard = shardPath(indexPath, tensor, it.value());
    auto known = shardIndex.find(shard);
    if (known == shardIndex.end()) {
      std::error_code ec;
      if (!fs::exists(shard, ec))
        inputError("{}: weight_map puts tensor '{}' in shard {}, which does not exist",
                   indexPath, tensor, shard);
      opened.files.push_back(SafetensorsFile::open(shard));
      known = shardIndex.emplace(shard, opened.files.size() - 1).first;
    }
    if (!opened.files[known->second]->has(tensor))
      inputError("{}: weight_map puts tensor '{}' in shard {}, which does not hold it",
                 indexPath, tensor, shard);
    opened.fileIndex.emplace(tensor, known->second);
  }
  return opened;
}

/// A directory without an index: its model.safetensors, else its only
/// *.safetensors file.
std::string findSingleFile(const std::string &dir) {
  const fs::path preferred = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (fs::exists(preferred, ec))
    return preferred.string();
  std::vector<std::string> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec))
      found.push_back(it->path().filename().string());
  if (ec)
    inputError("{}: cannot list directory: {}", dir, ec.message());
  if (found.empty())
    inputError("{}: no model.safetensors.index.json, model.safetensors or other *.safetensors "
               "file in the directory",
               dir);
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    inputError("{}: {} *.safetensors files ({}) but no model.safetensors.index.json to say "
               "which tensor is where",
               dir, found.size(), fmt::format("{}", fmt::join(found, ", ")));
  }
  return (fs::path(dir) / found[0]).string();
}

bool endsWith(const std::string &text, const std::string &suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

Checkpoint::Checkpoint() = default;
Checkpoint::~Checkpoint() = default;

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string &path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status))
    inputError("{}: no such checkpoint (expected a directory or a .safetensors file)", path);

  if (fs::is_directory(status) && ShardedCheckpoint::isSharded(path)) {
    auto checkpoint = std::make_unique<Checkpoint>();
    checkpoint->sharded = ShardedCheckpoint::open(path);
    checkpoint->path_ = path;
    checkpoint->manifestPath = checkpoint->sharded->manifestPath();
    checkpoint->modelType_ = checkpoint->sharded->modelType();
    const auto &tensors = checkpoint->sharded->tensors();
    for (size_t i = 0; i < tensors.size(); ++i)
      checkpoint->shardedIndex.emplace(tensors[i].name, i);
    return checkpoint;
  }
  Opened opened;
  if (fs::is_directory(status)) {
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    opened = fs::exists(index, ec) ? openSharded(index.string()) : openSingle(findSingleFile(path));
  } else {
    // An index may also be named directly; anything else is read as one file.
    opened = endsWith(path, ".index.json") ? openSharded(path) : openSingle(path);
  }
  auto checkpoint = std::make_unique<Checkpoint>();
  checkpoint->path_ = path;
  checkpoint->files = std::move(opened.files);
  checkpoint->fileIndex = std::move(opened.fileIndex);
  return checkpoint;
}

std::optional<Checkpoint::Alias> Checkpoint::alias(const std::string &name) const {
  // Sharded checkpoints store the plan's logical names; only Hugging Face
  // files can hold the fused layout.
  if (sharded || fileIndex.count(name))
    return std::nullopt;
  if (std::optional<FusedSlot> slot = fusedSlotOf(name))
    if (fileIndex.count(slot->fused))
      return Alias{slot->fused, slot->expert, slot->parts, slot->part};
  if (std::optional<std::string> renamed = fusedLayoutRename(name))
    if (fileIndex.count(*renamed))
      return Alias{*renamed, -1, 1, 0};
  return std::nullopt;
}

std::vector<int64_t> Checkpoint::aliasShape(const std::string &name, const Alias &a) const {
  const SafetensorsFile::Entry &e = files[fileIndex.at(a.stored)]->entry(a.stored);
  if (a.expert < 0)
    return e.shape;
  if (e.shape.size() != 3 || e.shape[1] % a.parts != 0)
    inputError("{}: tensor '{}' (the fused experts holding '{}'): expected a shape [experts, "
               "{} x rows, columns] but found {}",
               files[fileIndex.at(a.stored)]->path(), a.stored, name, a.parts,
               shapeString(e.shape));
  if (a.expert >= e.shape[0])
    inputError("{}: tensor '{}' holds {} experts, not expert {} ('{}')",
               files[fileIndex.at(a.stored)]->path(), a.stored, e.shape[0], a.expert, name);
  return {e.shape[1] / a.parts, e.shape[2]};
}

std::string Checkpoint::storedName(const std::string &name) const {
  if (fileIndex.count(name) || shardedIndex.count(name))
    return name;
  std::optional<Alias> a = alias(name);
  return a ? a->stored : std::string();
}

bool Checkpoint::hasFusedExperts() const {
  const std::string suffix = ".mlp.experts.gate_up_proj";
  for (const auto &entry : fileIndex)
    if (endsWith(entry.first, suffix))
      return true;
  return false;
}

bool Checkpoint::has(const std::string &name) const {
  return fileIndex.count(name) != 0 || shardedIndex.count(name) != 0 || alias(name);
}

const std::string &Checkpoint::fileOf(const std::string &name) const {
  if (shardedIndex.count(name))
    return manifestPath;
  auto it = fileIndex.find(name);
  if (it == fileIndex.end()) {
    if (std::optional<Alias> a = alias(name))
      return files[fileIndex.at(a->stored)]->path();
    inputError("{}: missing tensor '{}'", path_, name);
  }
  return files[it->second]->path();
}

TensorView Checkpoint::info(const std::string &name, const std::vector<int64_t> &shape) const {
  const std::string &file = fileOf(name);
  TensorView view;
  if (sharded) {
    const ShardedCheckpoint::Tensor &t = sharded->tensors()[shardedIndex.at(name)];
    view.dtype = t.dtype;
    view.shape = t.shape;
  } else if (std::optional<Alias> a = alias(name)) {
    view.dtype = files[fileIndex.at(a->stored)]->entry(a->stored).dtype;
    view.shape = aliasShape(name, *a);
  } else {
    const SafetensorsFile::Entry &e = files[fileIndex.at(name)]->entry(name);
    view.dtype = e.dtype;
    view.shape = e.shape;
  }
  std::string what = name;
  if (std::optional<Alias> a = alias(name))
    what += fmt::format("' (stored in '{}'", a->stored) +
            (a->expert >= 0 ? fmt::format(", expert {})", a->expert) : std::string(")"));
  else
    what += "'";
  if (view.shape != shape)
    inputError("{}: tensor '{}: expected shape {} but found {}", file, what, shapeString(shape),
               shapeString(view.shape));
  if (view.dtype != DType::F32 && view.dtype != DType::BF16 && view.dtype != DType::F16 &&
      view.dtype != DType::F8E4M3)
    inputError("{}: tensor '{}: dtype {} is not a float type (expected F32, BF16, F16 or "
               "F8_E4M3)",
               file, what, dtypeName(view.dtype));
  return view;
}

TensorView Checkpoint::tensor(const std::string &name, const std::vector<int64_t> &shape) const {
  TensorView view = info(name, shape);
  if (sharded)
    runtimeError("{}: tensor '{}': a sharded checkpoint has no whole-tensor views (read boxes)",
                 manifestPath, name);
  if (std::optional<Alias> a = alias(name)) {
    // Expert e's part is one contiguous block of the fused tensor.
    const char *base =
        static_cast<const char *>(files[fileIndex.at(a->stored)]->tensor(a->stored).data);
    const int64_t block = view.numel();
    const int64_t index = a->expert < 0 ? 0 : a->expert * a->parts + a->part;
    view.data = base + static_cast<size_t>(index * block) * dtypeSize(view.dtype);
    return view;
  }
  view.data = files[fileIndex.at(name)]->tensor(name).data;
  return view;
}

void Checkpoint::readBox(const std::string &name, const std::vector<int64_t> &offset,
                         const std::vector<int64_t> &shape, DType expected, char *dst,
                         const std::vector<int64_t> &dstShape) const {
  if (std::optional<Alias> a = alias(name)) {
    if (a->expert < 0) {
      readBox(a->stored, offset, shape, expected, dst, dstShape);
      return;
    }
    // The box of expert e's part: one more leading dimension.
    const std::vector<int64_t> rows = aliasShape(name, *a);
    const std::vector<int64_t> &into = dstShape.empty() ? shape : dstShape;
    if (offset.size() != 2 || shape.size() != 2 || into.size() != 2)
      inputError("{}: tensor '{}': a box of rank {} of a {} tensor", fileOf(name), name,
                 offset.size(), shapeString(rows));
    for (size_t d = 0; d < 2; ++d)
      if (offset[d] < 0 || shape[d] < 0 || offset[d] + shape[d] > rows[d] || shape[d] > into[d])
        inputError("{}: tensor '{}': box at offset {} of shape {} (into {}) does not fit its "
                   "shape {}",
                   fileOf(name), name, shapeString(offset), shapeString(shape),
                   shapeString(into), shapeString(rows));
    readBox(a->stored, {a->expert, a->part * rows[0] + offset[0], offset[1]},
            {1, shape[0], shape[1]}, expected, dst, {1, into[0], into[1]});
    return;
  }
  const std::string &file = fileOf(name);
  const ShardedCheckpoint::Tensor *t =
      sharded ? &sharded->tensors()[shardedIndex.at(name)] : nullptr;
  const SafetensorsFile *f = sharded ? nullptr : files[fileIndex.at(name)].get();
  const DType dtype = t ? t->dtype : f->entry(name).dtype;
  const std::vector<int64_t> &global = t ? t->shape : f->entry(name).shape;
  if (dtype != expected)
    inputError("{}: tensor '{}': expected dtype {} but found {}", file, name,
               dtypeName(expected), dtypeName(dtype));
  const std::vector<int64_t> &into = dstShape.empty() ? shape : dstShape;
  bool inside = offset.size() == global.size() && shape.size() == global.size() &&
                into.size() == global.size();
  for (size_t d = 0; inside && d < global.size(); ++d)
    inside = offset[d] >= 0 && shape[d] >= 0 && offset[d] + shape[d] <= global[d] &&
             shape[d] <= into[d];
  if (!inside)
    inputError("{}: tensor '{}': box at offset {} of shape {} (into {}) does not fit its shape {}",
               file, name, shapeString(offset), shapeString(shape), shapeString(into),
               shapeString(global));
  if (t)
    sharded->readBox(*t, offset, shape, dst, into);
  else
    f->readBox(name, offset, shape, dst, into, std::vector<int64_t>(shape.size(), 0));
}

std::vector<int64_t> Checkpoint::shapeOf(const std::string &name) const {
  fileOf(name); // InputError when missing
  if (sharded)
    return sharded->tensors()[shardedIndex.at(name)].shape;
  if (std::optional<Alias> a = alias(name))
    return aliasShape(name, *a);
  return files[fileIndex.at(name)]->entry(name).shape;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  for (const auto &[name, at] : sharded ? shardedIndex : fileIndex)
    names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace moert
