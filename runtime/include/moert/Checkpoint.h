// Checkpoints: Hugging Face safetensors (a single `model.safetensors`, or
// shards listed by `model.safetensors.index.json`), read through mmap views
// or pread boxes, and sharded checkpoints (ShardedCheckpoint.h), read as
// boxes. Every header, offset, dtype and shape is checked; a mismatch is an
// InputError naming the tensor and the file. Only the bytes of tensors (or
// boxes) that are read become resident.
#pragma once

#include "moert/Tensor.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moert {

/// One safetensors file: its header parsed and checked at open (read with
/// pread, so opening touches no tensor bytes), its tensors read either as
/// views into a read-only mapping (`map`: Hugging Face checkpoints, whose
/// whole tensors single-rank runs use in place) or as boxes copied with
/// pread (readBox: only the requested bytes, through a bounded buffer).
class SafetensorsFile {
public:
  /// Opens and validates `path`: header length, JSON header, every entry's
  /// dtype (F32/BF16/F16/I32/I64), shape, and data_offsets (in bounds,
  /// matching dtype size x element count, not overlapping). `map`: also map
  /// the file (tensor() views); without it, tensor() is an internal error.
  static std::unique_ptr<SafetensorsFile> open(const std::string &path, bool map = true);
  ~SafetensorsFile();

  struct Entry { DType dtype; std::vector<int64_t> shape; size_t begin, end; };

  const std::string &path() const { return path_; }
  bool has(const std::string &name) const { return entries.count(name) != 0; }
  /// The tensor's header entry; InputError if absent.
  const Entry &entry(const std::string &name) const;
  /// The tensor's view (data points into the mapping); InputError if absent.
  TensorView tensor(const std::string &name) const;
  bool mapped() const { return mapping != nullptr; }
  std::vector<std::string> names() const;
  /// The tensor's [begin, end) byte range in the data section (after the
  /// header), as its header's data_offsets say; InputError if absent.
  std::pair<size_t, size_t> dataOffsets(const std::string &name) const;
  /// The file offset of the data section (8 + header length).
  uint64_t dataFileOffset() const { return dataOffset; }
  uint64_t fileBytes() const { return fileBytes_; }

  /// Copies the box (`offset`, `shape`) of the stored tensor `name` with
  /// pread into `dst`, a row-major tensor of `dstShape`, at `dstOffset`.
  /// Reads go through one buffer of at most kReadBufferBytes (rows of a box
  /// that lie close together are read with one call), or straight into
  /// `dst` for rows at least that long; nothing is mapped.
  static constexpr size_t kReadBufferBytes = 4u << 20;
  void readBox(const std::string &name, const std::vector<int64_t> &offset,
               const std::vector<int64_t> &shape, char *dst,
               const std::vector<int64_t> &dstShape,
               const std::vector<int64_t> &dstOffset) const;

private:
  SafetensorsFile() = default;
  std::string path_;
  int fd = -1;
  void *mapping = nullptr;
  size_t fileBytes_ = 0;
  uint64_t dataOffset = 0;
  std::unordered_map<std::string, Entry> entries;
  const char *dataStart = nullptr;
};

class ShardedCheckpoint;

/// A checkpoint directory (or a single .safetensors file path).
class Checkpoint {
public:
  /// Opens DIR/model.safetensors.index.json if present (opening the shards
  /// it names), else DIR/model.safetensors, else the single *.safetensors in
  /// DIR; `path` may also be a .safetensors file.
  /// A directory with a manifest.json is a sharded checkpoint
  /// (ShardedCheckpoint.h): its manifest and every file's size and header
  /// are validated here; no tensor is assembled, and a file's CRC32C is
  /// verified when readBox first reads from it.
  static std::unique_ptr<Checkpoint> open(const std::string &path);
  Checkpoint();
  ~Checkpoint();
  /// The model_type a sharded checkpoint's manifest records ("" otherwise).
  const std::string &modelType() const { return modelType_; }
  bool isSharded() const { return sharded != nullptr; }
  const ShardedCheckpoint *shardedCheckpoint() const { return sharded.get(); }

  bool has(const std::string &name) const;
  /// The tensor's dtype and shape (data null), checked: InputError naming
  /// the tensor and the file when it is missing, its shape differs from
  /// `shape`, or its dtype is not a float type.
  TensorView info(const std::string &name, const std::vector<int64_t> &shape) const;
  /// Whether tensor() gives views into a mapping (Hugging Face checkpoints).
  bool hasViews() const { return sharded == nullptr; }
  /// The tensor, checked as info(), as a view into the mapping (Hugging
  /// Face checkpoints only: a sharded checkpoint has no whole tensors, an
  /// internal error here; use readBox).
  TensorView tensor(const std::string &name, const std::vector<int64_t> &shape) const;
  /// Copies the box (`offset`, `shape`) of tensor `name` into `dst`, a
  /// row-major tensor of `dstShape` (default: the box's shape), at its
  /// origin; elements of `dst` outside the box are left as they are. Reads
  /// only the bytes of the box (pread; from a sharded checkpoint, only the
  /// intersections of the box with the stored boxes, whatever plan wrote
  /// them), through a buffer of at most SafetensorsFile::kReadBufferBytes.
  /// InputError when the tensor is missing, its dtype is not `expected`, or
  /// the box lies outside it.
  void readBox(const std::string &name, const std::vector<int64_t> &offset,
               const std::vector<int64_t> &shape, DType expected, char *dst,
               const std::vector<int64_t> &dstShape = {}) const;
  /// The file that holds `name` (for messages).
  const std::string &fileOf(const std::string &name) const;
  /// Every tensor name of the checkpoint.
  std::vector<std::string> names() const;
  /// The stored shape of tensor `name` (InputError naming it when missing).
  std::vector<int64_t> shapeOf(const std::string &name) const;
  /// The tensor of the files that holds `name`: itself, or, in a checkpoint
  /// with fused expert tensors (transformers 5.x, ExpertLayout.h), the fused
  /// tensor of a per-expert name or the new name of a renamed one. Every
  /// method above accepts such per-expert names: info and shapeOf give the
  /// per-expert shape, tensor a view into the fused tensor, readBox reads
  /// from it. "" when the checkpoint holds no such tensor.
  std::string storedName(const std::string &name) const;
  /// Whether the files store routed experts as fused tensors.
  bool hasFusedExperts() const;
  const std::string &path() const { return path_; }

private:
  /// A tensor name the files hold under another (a fused expert slot).
  struct Alias {
    std::string stored;
    int64_t expert = -1; ///< -1: a plain rename
    int64_t parts = 1, part = 0;
  };
  std::optional<Alias> alias(const std::string &name) const;
  /// The per-expert shape of an alias, checked against the stored tensor.
  std::vector<int64_t> aliasShape(const std::string &name, const Alias &a) const;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::unordered_map<std::string, size_t> fileIndex; // tensor -> files[i]
  // A sharded checkpoint: boxes read from its files on demand.
  std::string manifestPath, modelType_;
  std::unique_ptr<ShardedCheckpoint> sharded;
  std::unordered_map<std::string, size_t> shardedIndex; // tensor -> tensors()[i]
};

} // namespace moert
