// Writing safetensors files: the format moert reads (Checkpoint.h), used by
// the benchmark's weight generator now and by sharded checkpoint saves later.
#pragma once

#include "moert/Tensor.h"

#include <functional>
#include <string>
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

/// Writes `tensors` to `path` atomically: a temporary file beside it, filled
/// through mmap, fsync, rename. InputError naming the path on failure.
void writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors);

} // namespace moert
