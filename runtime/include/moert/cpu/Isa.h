// The x86 instruction-set level the CPU kernels use, chosen at run time.
// Every kernel has a path per level (docs/cpu-kernels.md); the build has no
// -march flag, so one binary runs on any x86-64 CPU and uses what it has.
// MOERT_ISA=generic|avx2|avx512|avx512bf16 forces a lower level than the
// CPU's (tests run each level the machine has against the same fixtures).
#pragma once

#include <string>
#include <vector>

namespace moert::cpu {

enum class Isa : int {
  Generic = 0,    ///< portable C++ (what the compiler makes of it for x86-64)
  Avx2 = 1,       ///< AVX2 + FMA + F16C (Haswell, Zen 1-3)
  Avx512 = 2,     ///< AVX-512 F/BW/VL/DQ (Skylake-SP, Zen 4)
  Avx512Bf16 = 3, ///< AVX-512 + BF16 dot products (Cooper Lake, Zen 4)
};

/// The best level this CPU has.
Isa cpuIsa();
/// The level the kernels use: MOERT_ISA if set (checked once; a level the
/// CPU lacks or a misspelling is bad input), else cpuIsa(); setIsa changes it.
Isa activeIsa();
/// Uses `isa` from now on (tests, benchmarks); an InputError if the CPU
/// lacks it.
void setIsa(Isa isa);
/// "generic", "avx2", "avx512", "avx512bf16".
const char *isaName(Isa isa);
/// Every level this CPU can run, lowest first.
std::vector<Isa> supportedIsas();
/// Whether `name` names a level (sets `isa`).
bool parseIsa(const std::string &name, Isa &isa);

/// The inputs of products with BF16 weights (linear layers, experts, the LM
/// head). Bf16: the activations are rounded to bf16 (to nearest even) and
/// multiplied by the bf16 dot instruction, sums in f32, as a BF16 matmul in
/// PyTorch or llama.cpp computes; taken only where the active level has
/// that instruction (avx512bf16), else F32. F32: the weights are widened
/// and the activations kept, the same result on every level.
/// MOERT_MATMUL_PRECISION=bf16|f32 (default bf16) or `moert run
/// --matmul-precision` chooses; F32 and F16 weights always take F32.
enum class MatmulPrecision : int { F32 = 0, Bf16 = 1 };
/// What was asked for (checked once: a misspelling is bad input).
MatmulPrecision requestedMatmulPrecision();
void setMatmulPrecision(MatmulPrecision precision);
bool parseMatmulPrecision(const std::string &name, MatmulPrecision &precision);
/// Whether products with BF16 weights use bf16 inputs now: Bf16 asked for
/// and the active level has the bf16 dot instruction.
bool bf16Products();

} // namespace moert::cpu
