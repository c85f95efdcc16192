// The plan's contract, once for the writer (moec: compiler/lib/Target/Plan)
// and the reader (moert: runtime/src/Plan*.cpp): its format name and
// version, the limits on the sizes it may ask for, and its integrity seal.
// Dependency-free (the C++ standard library only) so that the runtime,
// which never sees MLIR or LLVM, and the compiler include the same file.
// The fields themselves are documented in docs/plan-format.md.
#ifndef MOE_PLANSCHEMA_H
#define MOE_PLANSCHEMA_H

#include <cstddef>
#include <cstdint>

namespace moe::plan {

/// The plan's "format" and "version" (a reader refuses any other version).
inline constexpr const char *kFormat = "moe-plan";
inline constexpr int kFormatVersion = 4;

/// Limits on the sizes a plan may ask for: within them every size moert
/// computes fits in 64 bits. moec refuses a workload beyond them, moert a
/// plan beyond them, each naming the field.
inline constexpr int64_t kMaxBatchTokens = int64_t(1) << 20;
inline constexpr int64_t kMaxSeqLen = int64_t(1) << 24;
inline constexpr int64_t kMaxSequences = int64_t(1) << 16;
inline constexpr int64_t kMaxWorldSize = int64_t(1) << 16;
inline constexpr int64_t kMaxWidth = int64_t(1) << 20; ///< a KV cache's key / value width
inline constexpr uint64_t kMaxPlanBytes = uint64_t(1) << 30;

/// The integrity seal, the last member of the plan's object:
/// `,"integrity":"fnv1a64:<16 lowercase hex digits>"` written right before
/// the closing '}', the 64-bit FNV-1a hash of every other byte of the file.
inline constexpr const char kSealPrefix[] = ",\"integrity\":\"fnv1a64:";
inline constexpr size_t kSealPrefixSize = sizeof kSealPrefix - 1;
inline constexpr size_t kSealSize = kSealPrefixSize + 16 + 1; ///< prefix, digits, quote

/// The members each object of a plan may have (docs/plan-format.md
/// describes them): the writer emits no others and the reader refuses any
/// other by name, and every plan the writer makes in the tests is read back,
/// so the two sides cannot drift apart. A step's "attrs" are its op's
/// (checked by the op's definition in moert) and a program's "cuda" object
/// is the kernel table's (typed by moert's KernelTable).
namespace members {
inline constexpr const char *kRoot[] = {"format",   "version",  "producer",    "model",
                                        "workload", "world_size", "ranks_per_process", "fp8_activations",
                                        "degrees",  "vocab",    "stage_begin", "weights",
                                        "programs", "ranks",    "planner",     "schedule",
                                        "pipeline_schedule", "integrity"};
inline constexpr const char *kModel[] = {"model_type",   "source", "vocab_size",
                                         "max_position_embeddings", "eos_token_ids",
                                         "unused_tensor_prefixes"};
inline constexpr const char *kWorkload[] = {"max_batch_tokens", "max_seq_len", "max_sequences"};
inline constexpr const char *kDegrees[] = {"dp", "pp", "tp", "ep", "etp", "edp"};
inline constexpr const char *kVocab[] = {"size", "padded", "pad_to"};
/// A logical weight (top-level "weights") and a program's local weight.
inline constexpr const char *kWeight[] = {"name", "shape", "dtype", "bytes", "experts",
                                          "int8_block"};
inline constexpr const char *kProgram[] = {"stage",  "entry",  "weights", "buffers", "kv_caches",
                                           "inputs", "logits", "memory",  "steps",   "cuda",
                                           "max_batch_tokens", "loss", "gradients", "stats",
                                           "micro_batches"};
/// A differentiated training program's gradient of one weight.
inline constexpr const char *kGradient[] = {"weight", "buffer"};
/// Which entry runs each phase of generation (a plan of one entry has none:
/// its programs run every phase).
inline constexpr const char *kSchedule[] = {"prefill", "decode"};
inline constexpr const char *kBuffer[] = {"rows", "width", "dtype", "bytes", "state",
                                            "logical_rows", "shard_group"};
inline constexpr const char *kKVCache[] = {"key_width", "value_width", "bytes"};
inline constexpr const char *kInputs[] = {"tokens", "positions", "labels", "step"};
inline constexpr const char *kProgramMemory[] = {"weights", "activations", "kv_cache", "state",
                                                 "peak"};
inline constexpr const char *kStep[] = {"op", "in", "in_from", "weights", "out", "attrs"};
inline constexpr const char *kRank[] = {"rank",   "program", "coords",
                                        "memory", "weights", "weights_of_rank"};
inline constexpr const char *kCoords[] = {"dp", "pp", "tp", "edp", "ep", "etp"};
inline constexpr const char *kRankMemory[] = {"weights", "kv_cache", "activations", "workspace",
                                              "state", "peak"};
/// One slice of a rank's checkpoint (ranks[].weights[]).
inline constexpr const char *kSlice[] = {"name",  "global_shape", "offset",  "shape",
                                         "dtype", "bytes",        "primary", "block"};
} // namespace members

/// FNV-1a, 64 bits, of `size` bytes, continuing from `h`.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline uint64_t fnv1a64(const char *data, size_t size, uint64_t h = kFnvOffset) {
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

} // namespace moe::plan

#endif // MOE_PLANSCHEMA_H
