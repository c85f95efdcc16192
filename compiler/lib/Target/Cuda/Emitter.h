//===- Emitter.h - the CUDA emitter's builder, shared by its files -*- C++ -*-===//
//
// Internal to lib/Target/Cuda: the Emitter that builds one program's CUDA
// source and kernel table (CudaEmitter.cpp: the steps and the table), its
// kernel builders by family (CudaNormKernels.cpp: embedding and norms;
// CudaAttentionKernels.cpp: RoPE, KV cache and attention;
// CudaMoEKernels.cpp: expert activation, dispatch slots, scatter, combine),
// and the text helpers they use.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_LIB_TARGET_CUDA_EMITTER_H
#define MOE_LIB_TARGET_CUDA_EMITTER_H

#include "moe/Target/Cuda.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace moe::cuda::detail {

using llvm::json::Array;
using llvm::json::Object;
using JsonValue = llvm::json::Value;

llvm::Error emitError(const llvm::Twine &message);
/// `text` with every @KEY@ replaced by values[KEY].
std::string subst(std::string text, const std::map<std::string, std::string> &values);
std::string str(int64_t v);
/// A float literal that reads back as exactly static_cast<float>(v).
std::string floatLit(double v);
/// A double literal of v.
std::string doubleLit(double v);
int64_t roundUp(int64_t v, int64_t m);

/// The CUDA element type and widening expression of a weight dtype.
struct WeightType {
  std::string type; // pointer element type
  std::string load; // a function of one element: f32
};
WeightType weightType(llvm::StringRef dtype);

/// The integer list `key` of a step ("in", "out", "weights").
std::vector<int64_t> ids(const Object &s, llvm::StringRef key);

/// A kernel parameter: its C declaration and what the table calls it.
struct Param {
  std::string decl; // e.g. "const float *__restrict__ x"
  std::string ref;  // e.g. "buf:3", "T"
};

/// Builds one program's source and table.
class Emitter {
public:
  Emitter(const Object &plan, const Object &program, int64_t index, const GpuTargetInfo &target)
      : plan(plan), program(program), index(index), target(target) {}

  llvm::Expected<EmittedProgram> run();

private:
  const Object &plan;
  const Object &program;
  int64_t index;
  const GpuTargetInfo &target;
  int64_t maxTokens = 0, maxSeqLen = 0, maxSequences = 0;
  std::string source;
  std::vector<std::string> kernels;
  llvm::StringMap<std::string> byBody; // kernel text (name-less) -> name
  Array scratch, ropeTables;
  std::vector<std::string> ropeKeys;

  // Program facts.
  const Array *buffers = nullptr, *weights = nullptr;
  int64_t width(int64_t buffer) const {
    return (*(*buffers)[buffer].getAsObject()->getInteger("width"));
  }
  int64_t rows(int64_t buffer) const {
    return (*(*buffers)[buffer].getAsObject()->getInteger("rows"));
  }
  const Object &weight(int64_t id) const { return *(*weights)[id].getAsObject(); }
  std::string dtype(int64_t id) const { return weight(id).getString("dtype")->str(); }
  std::vector<int64_t> shape(int64_t id) const {
    std::vector<int64_t> s;
    for (const JsonValue &d : *weight(id).getArray("shape"))
      s.push_back(*d.getAsInteger());
    return s;
  }
  int64_t numel(int64_t id) const {
    int64_t n = 1;
    for (int64_t d : shape(id))
      n *= d;
    return n;
  }

  /// A step-local device workspace of rows x width 4-byte values: the
  /// step's n-th scratch is scratch n of the table, shared by every step
  /// (sized for the largest use).
  std::vector<int64_t> scratchSizes;
  size_t scratchCursor = 0;
  std::string addScratch(int64_t rowCount, int64_t w, llvm::StringRef = "F32") {
    size_t id = scratchCursor++;
    if (id >= scratchSizes.size())
      scratchSizes.push_back(0);
    scratchSizes[id] = std::max(scratchSizes[id], rowCount * w);
    return "scratch:" + str(static_cast<int64_t>(id));
  }
  /// The cos/sin table of a rope attribute (one per distinct parameter set).
  int64_t ropeTable(const Object &rope) {
    std::string key;
    llvm::raw_string_ostream os(key);
    os << JsonValue(Object(rope));
    os.flush();
    for (size_t i = 0; i < ropeKeys.size(); ++i)
      if (ropeKeys[i] == key)
        return static_cast<int64_t>(i);
    ropeKeys.push_back(key);
    ropeTables.push_back(Object{{"rope", Object(rope)},
                                {"positions", maxSeqLen},
                                {"half", *rope.getInteger("rotary_dim") / 2}});
    return static_cast<int64_t>(ropeKeys.size()) - 1;
  }

  /// Emits (or reuses) a kernel; `body` uses @NAME@ for its name, params
  /// are given separately. Returns the launch entry.
  Object kernel(int64_t step, llvm::StringRef what, const std::vector<Param> &params,
                const std::string &body, Array grid, int64_t block) {
    std::string sig;
    for (size_t i = 0; i < params.size(); ++i)
      sig += (i ? ", " : "") + params[i].decl;
    std::string text = declaration("@NAME@", block) + "(" + sig + ") {\n" + body + "}\n";
    std::string name;
    auto found = byBody.find(text);
    if (found != byBody.end()) {
      name = found->second;
    } else {
      name = "moe_s" + str(step) + "_" + what.str();
      byBody[text] = name;
      kernels.push_back(name);
      source += "\n" + subst(text, {{"NAME", name}});
      // The CPU execution layer's trampoline.
      std::string call;
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string &decl = params[i].decl;
        size_t cut = decl.find_last_of(" *");
        std::string type = decl.substr(0, cut + 1);
        call += (i ? ", " : "") + std::string("(") + type + ")args[" + str(int64_t(i)) + "]";
      }
      source += "#ifdef MOE_HOST_EMULATION\nextern \"C\" void " + name +
                "__host(const unsigned long long *args) { " + name + "(" + call +
                "); }\n#endif\n";
    }
    Array refs;
    for (const Param &p : params)
      refs.push_back(p.ref);
    return Object{{"kernel", name}, {"grid", std::move(grid)}, {"block", block},
                  {"shared_bytes", 0}, {"params", std::move(refs)}};
  }

  /// `qualifiers void bounds name` of a kernel with `block` threads.
  std::string declaration(llvm::StringRef name, int64_t block) const {
    std::string bounds = subst(target.launchBounds, {{"N", str(block)}});
    return target.kernelQualifiers + " void " + (bounds.empty() ? "" : bounds + " ") + name.str();
  }
  /// A block size for `work` items per block: a multiple of the warp size
  /// in [warp, cap].
  int64_t blockFor(int64_t work, int64_t cap = 256) const {
    const int64_t w = target.warpSize;
    return std::max<int64_t>(w, std::min<int64_t>(cap, roundUp(work, w)));
  }

  /// Grid dimension ceil(a * N / d) + c (N: the step's rows, T or R).
  static Array dim(int64_t a, int64_t d = 1, int64_t c = 0) { return Array{a, d, c}; }
  static Array grid1(Array x) { return Array{std::move(x), dim(0, 1, 1), dim(0, 1, 1)}; }

  Object gemm(std::string a, std::string b, std::string c, std::string m, int64_t n, int64_t k,
              llvm::StringRef bDtype) {
    return Object{{"gemm", Object{{"a", a}, {"b", b}, {"c", c}, {"m", m}, {"n", n}, {"k", k},
                                  {"lda", k}, {"ldb", k}, {"ldc", n}, {"b_dtype", bDtype.str()},
                                  {"transpose_b", true}, {"batch", 1}}}};
  }

  llvm::Error step(int64_t i, const Object &s, Array &launches, std::string &rowsName);

  // Kernel builders.
  Object embedding(int64_t i, int64_t out, int64_t ids, int64_t table, bool shard);
  Object rmsNorm(int64_t i, int64_t in, int64_t w, int64_t out, double eps);
  Object route(int64_t i, const Object &routing, int64_t E, const std::string &logits,
               int64_t bias, int64_t weightsOut, int64_t expertsOut);
  Object layerNorm(int64_t i, int64_t in, int64_t w, int64_t b, int64_t out, double eps);
  Object addNorm(int64_t i, const Object &step);
  Object rope(int64_t i, std::string in, std::string out, std::string positions, int64_t width,
              int64_t headDim, int64_t headStride, int64_t headOffset, const Object &rope,
              llvm::StringRef what);
  Object kvWrite(int64_t i, std::string k, std::string v, int64_t kw, int64_t vw, int64_t cache);
  Object attend(int64_t i, std::string q, int64_t ldq, std::string out, int64_t heads,
                int64_t kvHeads, int64_t dq, int64_t dv, double scale, int64_t window,
                int64_t cache);
  Object activation(int64_t i, std::string g, std::string u, std::string counts, int64_t I,
                    int64_t C, llvm::StringRef act, std::string rowsRef, Array grid);
  Object slots(int64_t i, std::string experts, std::string counts, std::string slotsOut,
               int64_t E, int64_t k, int64_t C, double cf, int64_t parts, int64_t stride);
  Object scatter(int64_t i, std::string x, std::string slotsRef, std::string buf, int64_t H,
                 int64_t k);
  Object combine(int64_t i, std::string y, std::string slotsRef, std::string w, std::string out,
                 int64_t H, int64_t k);
};

} // namespace moe::cuda::detail

#endif // MOE_LIB_TARGET_CUDA_EMITTER_H
