// Internal to the CPU kernels: how a function is compiled for one
// instruction-set level. The build has no -march flag; each function that
// uses a level's intrinsics carries that level's target attribute and is
// only called when moert/cpu/Isa.h's activeIsa() says the level runs.
#pragma once

#include "moert/cpu/Isa.h"

#if defined(__x86_64__) || defined(__i386__)
#define MOERT_X86 1
#include <immintrin.h>
/// The levels of moert::cpu::Isa (Isa.cpp's detect() checks each feature).
#define MOERT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define MOERT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MOERT_AVX512_BF16                                                                          \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
/// AVX-512 with VNNI's integer dot products (the int8 GEMV; checked apart
/// from the levels: Skylake-SP has AVX-512 without them).
#define MOERT_AVX512_VNNI                                                                          \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))
/// The same with AVX512_VBMI's byte permutes (the FP8 table GEMV; checked
/// apart from the levels: Cooper Lake has BF16 without VBMI).
#define MOERT_AVX512_VBMI_BF16                                                                     \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,fma")))
#endif

// GCC 12's intrinsic headers start vectors as `__Y = __Y`, which
// -Wmaybe-uninitialized / -Wuninitialized report once inlined into a
// target function (only the kernels and their tests include this header).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
