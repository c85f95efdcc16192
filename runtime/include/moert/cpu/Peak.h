// The machine's measured multiply-add peak for the instruction-set level the
// kernels use (moert/cpu/Isa.h): what `moe-bench machine` prints and what
// `moert train` reports its model FLOP utilisation against.
#pragma once

#include <cstdint>

namespace moert::cpu {

struct PeakFlops {
  double fma = 0;  ///< fp32 FMA of the active level's vector width (scalar for generic), FLOP/s
  double bf16 = 0; ///< the bf16 dot product (vdpbf16ps) where the level has it, else 0
};

/// Runs `iterations` x 12 independent multiply-adds per thread on `threads`
/// threads (parallelFor; best of `repeats`) and returns FLOP/s.
PeakFlops measurePeakFlops(int threads, int64_t iterations = 20'000'000, int repeats = 3);

} // namespace moert::cpu
