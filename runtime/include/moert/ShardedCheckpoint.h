// Sharded checkpoints (docs/checkpoint-format.md): a directory with one
// safetensors file per rank that owns primary slices of the weights and a
// manifest.json, written last, that records every logical tensor's boxes,
// the files' sizes and CRC32C checksums, and the plan layout that wrote it.
#pragma once

#include "moert/Checkpoint.h"
#include "moert/Tensor.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moert {

constexpr int kShardedCheckpointVersion = 1;

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of `bytes`,
/// continuing from `crc` (0 to start): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void *bytes, size_t size, uint32_t crc = 0);
/// The CRC32C of a whole file, read in large chunks; InputError naming it.
uint32_t crc32cOfFile(const std::string &path);

/// One box (offset, shape) of a tensor, and where it is stored (for messages).
struct BoxRef {
  std::vector<int64_t> offset, shape;
  std::string file;
};

/// InputError (prefixed by `where`, naming the tensor and the files) unless
/// `boxes` lie inside `globalShape` and cover each of its elements exactly
/// once.
void checkBoxCover(const std::string &where, const std::string &tensor,
                   const std::vector<int64_t> &globalShape, const std::vector<BoxRef> &boxes);

/// Copies the box (offset, shape) of a row-major tensor of `globalShape`
/// into / out of a contiguous row-major buffer of the box's shape.
void copyBoxOut(const char *global, const std::vector<int64_t> &globalShape,
                const std::vector<int64_t> &offset, const std::vector<int64_t> &shape,
                size_t elementBytes, char *box);
void copyBoxIn(const char *box, const std::vector<int64_t> &globalShape,
               const std::vector<int64_t> &offset, const std::vector<int64_t> &shape,
               size_t elementBytes, char *global);

/// Where a training run stood when it saved (docs/checkpoint-format.md,
/// "Training checkpoints"): the updates done, the data consumed, and the
/// plan's shape of an update, which a resumed run must have too.
struct TrainingProgress {
  int64_t step = 0;             ///< updates done
  int64_t microBatchesDone = 0; ///< micro-batches of the data consumed
  int64_t microBatches = 0, seqLen = 0, microBatchSize = 0;
  int64_t shuffleSeed = -1; ///< the sample order's seed (-1: in order)
};

/// A validated sharded checkpoint: manifest parsed, every file present with
/// its recorded size and a valid safetensors header (read with pread; no
/// file is mapped), every box in its file with the recorded dtype, shape and
/// byte range, every tensor covered exactly once. A file's CRC32C is
/// verified (read in chunks with pread) the first time a box is read from
/// it, so a rank checks exactly the files it reads; verifyAll() checks all.
/// Not thread-safe (readBox records which files it has verified).
class ShardedCheckpoint {
public:
  struct Box {
    size_t file; ///< index into files
    std::vector<int64_t> offset, shape;
  };
  struct Tensor {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    std::vector<Box> boxes;
    size_t bytes() const;
  };

  /// True when `dir` is a directory with a manifest.json.
  static bool isSharded(const std::string &dir);
  static std::unique_ptr<ShardedCheckpoint> open(const std::string &dir);
  ~ShardedCheckpoint();

  const std::string &manifestPath() const { return manifest; }
  const std::string &modelType() const { return modelType_; }
  const std::string &configJson() const { return config; }
  /// How the Hugging Face checkpoint it was converted from stored routed
  /// experts: "per-expert" (transformers 4.x names) or "fused" (5.x's
  /// gate_up_proj / down_proj); `moert export` writes it back that way.
  const std::string &expertLayout() const { return expertLayout_; }
  const std::vector<Tensor> &tensors() const { return tensors_; }
  /// A training checkpoint's progress and optimizer state (state buffers
  /// by name, e.g. "exp_avg:<weight>"); none for a checkpoint of weights.
  const std::optional<TrainingProgress> &training() const { return training_; }
  const std::vector<Tensor> &state() const { return state_; }
  /// Copies the box (offset, shape) of `tensor` into `dst` (row-major, of
  /// `dstShape`, box at its origin): only the intersections of the box with
  /// the stored boxes are read.
  void readBox(const Tensor &tensor, const std::vector<int64_t> &offset,
               const std::vector<int64_t> &shape, char *dst,
               const std::vector<int64_t> &dstShape) const;
  /// Writes the whole tensor (row-major, its global shape) into `out`.
  void assemble(const Tensor &tensor, char *out) const;
  /// InputError naming the file and a tensor it holds unless file `i`'s
  /// CRC32C is the manifest's (checked once).
  void verify(size_t i) const;
  void verifyAll() const;

private:
  std::string dir, manifest, modelType_, config, expertLayout_ = "per-expert";
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::vector<std::string> recordedCrc, holds;
  mutable std::vector<bool> verified;
  std::vector<Tensor> tensors_, state_;
  std::optional<TrainingProgress> training_;
};

class Comm;
struct TensorToWrite;

/// What a training checkpoint's manifest says of the model.
struct CheckpointModel {
  std::string modelType, source, configJson, expertLayout = "per-expert";
};

/// What a checkpoint written from `source` (read from directory `dir`)
/// records of the model: its config.json (the sharded source's, else
/// dir/config.json, else the plan's `planSource`, verbatim) and its experts'
/// layout (moert convert and moert train --save).
CheckpointModel checkpointModel(const Checkpoint &source, const std::string &dir,
                                const std::string &modelType, const std::string &planSource);

/// `moert train --save`: one process's training checkpoint in `outDir`, a
/// sharded checkpoint of one rank file (the model's tensors, which moert
/// run, train and export read as any sharded checkpoint's, then the
/// optimizer's state tensors) whose manifest also records `progress` and
/// lists the state tensors under "training". Atomic as every save: a new
/// generation of files, the manifest renamed last, then the old files go.
void writeTrainingCheckpoint(const std::string &outDir, const CheckpointModel &model,
                             const std::string &planPath,
                             const std::vector<TensorToWrite> &tensors,
                             const std::vector<TensorToWrite> &state,
                             const TrainingProgress &progress);

/// `moert convert`: writes the primary slices of every rank of the plan at
/// `planPath`, read from `source` (a Hugging Face checkpoint, or a sharded
/// checkpoint written under any plan), as a sharded checkpoint in `outDir`.
/// Streaming: one slice at a time, read with pread straight into a mapping
/// of just that tensor's bytes in the output file, unmapped after it.
/// With `comm` of more than one rank (moert convert under mpirun; its size
/// must be the plan's world size), rank r writes rank r's file, the files'
/// sizes and checksums are gathered to rank 0, and rank 0 writes the
/// manifest last; otherwise this process writes every rank's file.
void convertCheckpoint(const std::string &planPath, const std::string &source,
                       const std::string &outDir, Comm *comm = nullptr);

/// `moert export`: writes the sharded checkpoint `ckptDir` as a Hugging Face
/// directory (config.json, model.safetensors or shards above `maxShardBytes`
/// with model.safetensors.index.json) with the original names and shapes,
/// one tensor at a time. `expertLayout` "per-expert" or "fused" writes the
/// routed experts that way; "" as the checkpoint records it
/// (ShardedCheckpoint::expertLayout).
void exportCheckpoint(const std::string &ckptDir, const std::string &outDir,
                      uint64_t maxShardBytes, const std::string &expertLayout = "");

} // namespace moert
