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
