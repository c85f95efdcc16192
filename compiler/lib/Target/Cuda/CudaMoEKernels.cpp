//===- CudaMoEKernels.cpp - expert activation, dispatch, combine -*- C++ -*-===//
//
// Kernel builders of the CUDA emitter (Emitter.h): expert activation, dispatch, combine.
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

Object Emitter::activation(int64_t i, std::string g, std::string u, std::string counts,
                           int64_t I, int64_t C, llvm::StringRef act, std::string rowsRef,
                           Array grid) {
  std::string f;
  if (act == "silu")
    f = "v / (1.0f + expf(-v))";
  else if (act == "gelu")
    f = "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))";
  else if (act == "gelu_tanh")
    f = "0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))";
  else
    f = "v > 0.0f ? v : 0.0f";
  std::string body = subst(R"(  const long long idx = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= rows * @I@) return;
  const long long r = idx / @I@;
  if (@COUNTED@ && r % @C@ >= counts[r / @C@]) return;
  const float v = g[idx];
  g[idx] = (@F@) * u[idx];
)", {{"I", str(I)}, {"C", str(std::max<int64_t>(C, 1))}, {"COUNTED", counts == "null" ? "0" : "1"},
     {"F", f}});
  return kernel(i, "act_" + act.str(),
                {{"float *__restrict__ g", g},
                 {"const float *__restrict__ u", u},
                 {"const int *__restrict__ counts", counts},
                 {"long long rows", rowsRef}},
                body, std::move(grid), 256);
}

/// Capacity dispatch, positions: one thread per expert walks the (t, j)
/// assignments in order (the prefix count of its own assignments), keeps
/// the first c(T), writes the slots of its kept assignments of this part's
/// rows and its count. Ids outside [0, E) get slot -1.
Object Emitter::slots(int64_t i, std::string experts, std::string counts, std::string slotsOut,
                      int64_t E, int64_t k, int64_t C, double cf, int64_t parts,
                      int64_t stride) {
  const int64_t B = blockFor(E);
  std::string body = subst(R"(  const long long part = tp / @STRIDE@;
  const long long rowBegin = T * part / @P@, rowEnd = T * (part + 1) / @P@;
  long long c = T;
  if (@CF@ > 0.0) {
    const long long want = static_cast<long long>(ceil(@CF@ * static_cast<double>(T) *
                                                        static_cast<double>(@K@) /
                                                        static_cast<double>(@E@)));
    c = want < T ? want : T;
  }
  if (c > @C@) c = @C@;
  if (c < 0) c = 0;
  for (int e = threadIdx.x; e < @E@; e += @B@) {
    long long seen = 0;
    int count = 0;
    for (long long p = 0; p < T * @K@; ++p) {
      if (experts[p] != e) continue;
      const long long t = p / @K@;
      const bool kept = seen++ < c;
      if (kept && t >= rowBegin && t < rowEnd)
        slots[p] = e * @C@ + count++;
      else
        slots[p] = -1;
    }
    counts[e] = count;
  }
  for (long long p = threadIdx.x; p < T * @K@; p += @B@)
    if (experts[p] < 0 || experts[p] >= @E@) slots[p] = -1;
)", {{"STRIDE", str(stride)}, {"P", str(parts)}, {"CF", doubleLit(cf)}, {"K", str(k)},
     {"E", str(E)}, {"C", str(C)}, {"B", str(B)}});
  return kernel(i, "dispatch_slots",
                {{"const int *__restrict__ experts", experts},
                 {"int *__restrict__ counts", counts},
                 {"int *__restrict__ slots", slotsOut},
                 {"long long T", "T"},
                 {"long long tp", "coord:tp"}},
                body, grid1(dim(0, 1, 1)), B);
}

Object Emitter::scatter(int64_t i, std::string x, std::string slotsRef, std::string buf,
                        int64_t H, int64_t k) {
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int j = 0; j < @K@; ++j) {
    const int slot = slots[t * @K@ + j];
    if (slot >= 0) moe_copy_row(buf + static_cast<long long>(slot) * @H@, x + t * @H@, @H@, threadIdx.x, 128, @V4@);
  }
)", {{"K", str(k)}, {"H", str(H)}, {"V4", H % 4 == 0 ? "true" : "false"}});
  return kernel(i, "dispatch_scatter",
                {{"const float *__restrict__ x", x},
                 {"const int *__restrict__ slots", slotsRef},
                 {"float *__restrict__ buf", buf},
                 {"long long T", "T"}},
                body, grid1(dim(1)), 128);
}

Object Emitter::combine(int64_t i, std::string y, std::string slotsRef, std::string w,
                        std::string out, int64_t H, int64_t k) {
  std::string body;
  if (H % 4 == 0)
    body = R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  float4 *dst = reinterpret_cast<float4 *>(out + t * @H@);
  for (int c = threadIdx.x; c < @H@ / 4; c += 128) {
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < @K@; ++j) {
      const int slot = slots[t * @K@ + j];
      if (slot < 0) continue;
      const float wj = weights[t * @K@ + j];
      const float4 v = reinterpret_cast<const float4 *>(y + static_cast<long long>(slot) * @H@)[c];
      a.x = __fadd_rn(a.x, __fmul_rn(wj, v.x));
      a.y = __fadd_rn(a.y, __fmul_rn(wj, v.y));
      a.z = __fadd_rn(a.z, __fmul_rn(wj, v.z));
      a.w = __fadd_rn(a.w, __fmul_rn(wj, v.w));
    }
    dst[c] = a;
  }
)";
  else
    body = R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int c = threadIdx.x; c < @H@; c += 128) {
    float a = 0.0f;
    for (int j = 0; j < @K@; ++j) {
      const int slot = slots[t * @K@ + j];
      if (slot < 0) continue;
      a = __fadd_rn(a, __fmul_rn(weights[t * @K@ + j], y[static_cast<long long>(slot) * @H@ + c]));
    }
    out[t * @H@ + c] = a;
  }
)";
  body = subst(body, {{"H", str(H)}, {"K", str(k)}});
  return kernel(i, "combine",
                {{"const float *__restrict__ y", y},
                 {"const int *__restrict__ slots", slotsRef},
                 {"const float *__restrict__ weights", w},
                 {"float *__restrict__ out", out},
                 {"long long T", "T"}},
                body, grid1(dim(1)), 128);
}

} // namespace moe::cuda::detail
