// Run-time choice of the CPU kernels' instruction-set level (moert/cpu/Isa.h).
#include "moert/cpu/Isa.h"

#include "moert/Error.h"

#include <atomic>
#include <cstdlib>

namespace moert::cpu {
namespace {

Isa detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    return Isa::Generic;
  // F16C has no __builtin_cpu_supports name in GCC 12: CPUID leaf 1, ECX 29.
  unsigned eax, ebx, ecx, edx;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  if (!(ecx & (1u << 29)))
    return Isa::Generic;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
    return Isa::Avx2;
  return __builtin_cpu_supports("avx512bf16") ? Isa::Avx512Bf16 : Isa::Avx512;
#else
  return Isa::Generic;
#endif
}

std::string supportedList() {
  std::string list;
  for (Isa isa : supportedIsas())
    list += std::string(list.empty() ? "" : ", ") + isaName(isa);
  return list;
}

/// The level MOERT_ISA asks for, or the CPU's.
Isa initial() {
  const char *env = std::getenv("MOERT_ISA");
  if (!env || !*env)
    return cpuIsa();
  Isa isa;
  if (!parseIsa(env, isa))
    inputError("MOERT_ISA={}: expected one of generic, avx2, avx512, avx512bf16", env);
  if (static_cast<int>(isa) > static_cast<int>(cpuIsa()))
    inputError("MOERT_ISA={}: this CPU does not have it (it runs {})", env, supportedList());
  return isa;
}

std::atomic<int> &active() {
  static std::atomic<int> level{static_cast<int>(initial())};
  return level;
}

MatmulPrecision initialPrecision() {
  const char *env = std::getenv("MOERT_MATMUL_PRECISION");
  MatmulPrecision precision = MatmulPrecision::Bf16;
  if (env && *env && !parseMatmulPrecision(env, precision))
    inputError("MOERT_MATMUL_PRECISION={}: expected bf16 or f32", env);
  return precision;
}

std::atomic<int> &precision() {
  static std::atomic<int> value{static_cast<int>(initialPrecision())};
  return value;
}

} // namespace

MatmulPrecision requestedMatmulPrecision() {
  return static_cast<MatmulPrecision>(precision().load(std::memory_order_relaxed));
}

void setMatmulPrecision(MatmulPrecision p) { precision().store(static_cast<int>(p)); }

bool parseMatmulPrecision(const std::string &name, MatmulPrecision &p) {
  if (name != "bf16" && name != "f32")
    return false;
  p = name == "bf16" ? MatmulPrecision::Bf16 : MatmulPrecision::F32;
  return true;
}

bool bf16Products() {
  return requestedMatmulPrecision() == MatmulPrecision::Bf16 && activeIsa() >= Isa::Avx512Bf16;
}

Isa cpuIsa() {
  static const Isa isa = detect();
  return isa;
}

Isa activeIsa() { return static_cast<Isa>(active().load(std::memory_order_relaxed)); }

void setIsa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(cpuIsa()))
    inputError("ISA level {}: this CPU does not have it (it runs {})", isaName(isa),
               supportedList());
  active().store(static_cast<int>(isa));
}

const char *isaName(Isa isa) {
  switch (isa) {
  case Isa::Generic: return "generic";
  case Isa::Avx2: return "avx2";
  case Isa::Avx512: return "avx512";
  case Isa::Avx512Bf16: return "avx512bf16";
  }
  return "?";
}

std::vector<Isa> supportedIsas() {
  std::vector<Isa> levels;
  for (int i = 0; i <= static_cast<int>(cpuIsa()); ++i)
    levels.push_back(static_cast<Isa>(i));
  return levels;
}

bool parseIsa(const std::string &name, Isa &isa) {
  for (Isa candidate : {Isa::Generic, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16})
    if (name == isaName(candidate)) {
      isa = candidate;
      return true;
    }
  return false;
}

} // namespace moert::cpu
