// Writing safetensors files: the format moert reads (Checkpoint.h), used by
// the benchmark's weight generator now and by sharded checkpoint saves later.
#pragma once

#include "moert/Tensor.h"

#include <functional>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moert {

/// One tensor to write; `fill` writes its bytes (numel x dtype size) into
/// the destination, so large tensors never need a second copy in memory.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<void(char *destination)> fill;
};

/// The [begin, end) data_offsets writeSafetensors gives each tensor (8-byte
/// aligned, in order), so that a manifest can record them without reading
/// the file back.
std::vector<std::pair<uint64_t, uint64_t>>
safetensorsDataOffsets(const std::vector<TensorToWrite> &tensors);

/// Writes `tensors` to `path` atomically: a temporary file beside it, each
/// tensor filled through a mapping of just its own bytes (unmapped after it,
/// so at most one tensor is resident), fsync, rename. `onBytes` (if set) is
/// called with each tensor's bytes once it is filled. InputError naming the
/// path on failure.
void writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors,
                      const std::function<void(uint64_t)> &onBytes = {});

} // namespace moert
