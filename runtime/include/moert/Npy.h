// NumPy .npy files (version 1.0, little-endian, C order): what --logits-out
// writes so that any tool can compare logits (float32), and the token data
// of `moert tokenize` (int32 tokens, int64 document offsets).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moert {

/// Writes `values` as a float32 array of `shape`, atomically (temporary file,
/// fsync, rename). InputError naming the path on failure.
void writeNpy(const std::string &path, const std::vector<int64_t> &shape,
              const std::vector<float> &values);
void writeNpy(const std::string &path, const std::vector<int64_t> &shape,
              const std::vector<int32_t> &values);
void writeNpy(const std::string &path, const std::vector<int64_t> &shape,
              const std::vector<int64_t> &values);

/// Reads a float32 C-order .npy (used by tests and tools).
std::vector<float> readNpy(const std::string &path, std::vector<int64_t> &shape);

} // namespace moert
