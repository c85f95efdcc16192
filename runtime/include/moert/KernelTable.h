// The CUDA kernel table of a plan program (moec --target cuda, docs/cuda.md
// "The kernel table"), typed: read and checked once by Plan::load, field by
// field, every reference bounds-checked against the program, so that the
// CUDA device never parses a string or meets an index out of range while it
// launches. No CUDA types here: a CPU-only moert reads (and checks) it too.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moert {

/// A launch parameter or a GEMM operand: "buf:3", "T", "const:64", ...
struct KernelRef {
  enum class Kind {
    T,              ///< the batch's tokens
    R,              ///< the logit rows
    Null,           ///< a null pointer
    CoordTp,        ///< the rank's tp coordinate
    Const,          ///< `value`
    Buffer,         ///< plan buffer `value`
    Weight,         ///< program weight `value` (as stored)
    Scratch,        ///< scratch[`value`]
    CacheKeys,      ///< KV cache `value`, keys
    CacheValues,    ///< KV cache `value`, values
    RopeCos,        ///< rope_tables[`value`], cosines
    RopeSin,        ///< rope_tables[`value`], sines
    BatchSequence,  ///< i32 per token: KV-cache slot
    BatchPosition,  ///< i32 per token: position
    BatchLogitRows, ///< i32 per logit row
    BatchArgmax,    ///< i32 output per logit row
  };
  Kind kind = Kind::Null;
  int64_t value = 0;
};

/// C[m, n] (+)= op(A)[m, k] op(B)[k, n] through cuBLAS: A stored [m, k]
/// (or [k, m] with transposeA), B stored [n, k] with transposeB (a weight
/// [out, in]) or [k, n]; accumulate adds to C (beta 1).
struct KernelGemm {
  KernelRef a, b, c;
  enum class Rows { T, R, Fixed } rows = Rows::Fixed; ///< m
  Rows kRows = Rows::Fixed; ///< k: the step's rows (k then their most) or fixed
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool transposeA = false, transposeB = true, accumulate = false;
  std::string bDtype = "F32"; ///< F32, BF16 or F16
  int64_t batch = 1, strideA = 0, strideB = 0, strideC = 0;
  int64_t bBatchModulo = 1; ///< blocks b use expert b % modulo (batch when absent)
  /// i32 counts of each block: the rows of its token-row operands (A and
  /// C; with transposeA, A and B: k) past them are not read.
  std::optional<KernelRef> rowsFromCounts;
};

struct KernelLaunch {
  enum class Kind { Kernel, Gemm, Collective } kind = Kind::Kernel;
  enum class Rows { Step, T, R } rows = Rows::Step; ///< the rows it runs on
  // Kernel:
  std::string kernel;
  std::array<std::array<int64_t, 3>, 3> grid{}; ///< dim d: ceil(a N / b) + c
  unsigned block = 0, sharedBytes = 0;
  std::vector<KernelRef> params;
  // Gemm:
  KernelGemm gemm;
  // Collective: the plan step's op name ("all_to_all", ...).
  std::string collective;
};

struct KernelStep {
  std::vector<KernelLaunch> launches;
};

struct KernelTable {
  std::string source; ///< the source's name (messages)
  std::string code;   ///< the kernels' CUDA C++ source
  std::string fatbin; ///< nvcc's fatbin of it, decoded ("" if compiled without nvcc)
  std::vector<int64_t> scratchBytes;
  struct RopeTable {
    int64_t positions = 0, half = 0;
  };
  std::vector<RopeTable> ropeTables;
  std::vector<KernelStep> steps;  ///< one per plan step
  std::vector<KernelLaunch> sampling;
  bool hasAllToAll = false; ///< a step reads exchanged counts on the host
};

} // namespace moert
