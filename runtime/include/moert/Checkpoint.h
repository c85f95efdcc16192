// Hugging Face safetensors checkpoints, read through mmap: a single
// `model.safetensors`, or shards listed by `model.safetensors.index.json`.
// Every header, offset, dtype and shape is checked; a mismatch is an
// InputError naming the tensor and the file. Only the pages of tensors that
// are read become resident.
#pragma once

#include "moert/Tensor.h"

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moert {

/// One mmapped safetensors file.
class SafetensorsFile {
public:
  /// Opens and validates `path`: header length, JSON header, every entry's
  /// dtype (F32/BF16/F16/I32/I64), shape, and data_offsets (in bounds,
  /// matching dtype size x element count, not overlapping).
  static std::unique_ptr<SafetensorsFile> open(const std::string &path);
  ~SafetensorsFile();

  const std::string &path() const { return path_; }
  bool has(const std::string &name) const { return entries.count(name) != 0; }
  /// The tensor's view (data points into the mapping); InputError if absent.
  TensorView tensor(const std::string &name) const;
  std::vector<std::string> names() const;
  /// The tensor's [begin, end) byte range in the data section (after the
  /// header), as its header's data_offsets say; InputError if absent.
  std::pair<size_t, size_t> dataOffsets(const std::string &name) const;

private:
  SafetensorsFile() = default;
  std::string path_;
  void *mapping = nullptr;
  size_t mappedBytes = 0;
  struct Entry { DType dtype; std::vector<int64_t> shape; size_t begin, end; };
  std::unordered_map<std::string, Entry> entries;
  const char *dataStart = nullptr;
};

/// A checkpoint directory (or a single .safetensors file path).
class Checkpoint {
public:
  /// Opens DIR/model.safetensors.index.json if present (opening the shards
  /// it names), else DIR/model.safetensors, else the single *.safetensors in
  /// DIR; `path` may also be a .safetensors file.
  /// A directory with a manifest.json is a sharded checkpoint
  /// (ShardedCheckpoint.h): validated in full, and each logical tensor
  /// assembled from its boxes into a buffer the Checkpoint owns.
  static std::unique_ptr<Checkpoint> open(const std::string &path);
  /// The model_type a sharded checkpoint's manifest records ("" otherwise).
  const std::string &modelType() const { return modelType_; }

  bool has(const std::string &name) const;
  /// The tensor, checked: InputError naming the tensor and the file when it
  /// is missing, its shape differs from `shape`, or its dtype is not a float
  /// type.
  TensorView tensor(const std::string &name, const std::vector<int64_t> &shape) const;
  /// The file that holds `name` (for messages).
  const std::string &fileOf(const std::string &name) const;
  /// Every tensor name of the checkpoint.
  std::vector<std::string> names() const;
  const std::string &path() const { return path_; }

private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::unordered_map<std::string, size_t> fileIndex; // tensor -> files[i]
  // A sharded checkpoint: whole tensors assembled into owned buffers.
  std::string manifestPath, modelType_;
  std::vector<std::unique_ptr<char[]>> owned;
  std::unordered_map<std::string, TensorView> assembled;
};

} // namespace moert
