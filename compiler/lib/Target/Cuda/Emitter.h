//===- Emitter.h - the CUDA emitter's builder, shared by its files -*- C++ -*-===//
//
// Internal to lib/Target/Cuda: the Emitter that builds one exec.program's
// CUDA source and kernel table (CudaEmitter.cpp: the program's declarations,
// the table of step lowerings by kernel id, the sampler), each kernel
// family's step lowerings and kernel builders in its own file
// (CudaNormKernels.cpp: embedding and norms; CudaAttentionKernels.cpp: RoPE,
// KV cache and attention; CudaDenseKernels.cpp: linear, dense MLP, split,
// concat and elementwise ops; CudaMoEKernels.cpp: routing, dispatch, expert
// GEMMs, combine), and the text helpers they use.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_LIB_TARGET_CUDA_EMITTER_H
#define MOE_LIB_TARGET_CUDA_EMITTER_H

#include "moe/Target/Cuda.h"

#include "mlir/IR/BuiltinAttributes.h"

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
/// The kernel table's reference to buffer / weight `id`.
inline std::string buf(int64_t id) { return "buf:" + str(id); }
inline std::string wref(int64_t id) { return "weight:" + str(id); }
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

/// A launch's constants (exec.launch's dictionary) as the lowerings read
/// them. A constant that is absent or of another kind reads as zero / empty
/// and is noted in `problems`, which the emitter reports for the step.
class Constants {
public:
  Constants(mlir::DictionaryAttr dict, std::string *problems) : dict(dict), problems(problems) {}

  int64_t integer(llvm::StringRef key) const;
  /// A float (or integer) constant as a double.
  double number(llvm::StringRef key) const;
  double numberOr(llvm::StringRef key, double otherwise) const;
  bool boolean(llvm::StringRef key) const;
  llvm::StringRef string(llvm::StringRef key) const;
  /// A nested dictionary ("rope", "routing").
  Constants object(llvm::StringRef key) const;
  /// A list of integers ("widths").
  std::vector<int64_t> integers(llvm::StringRef key) const;
  /// Optional constants: their default when absent (still noted when of
  /// another kind).
  int64_t integerOr(llvm::StringRef key, int64_t otherwise) const;
  bool booleanOr(llvm::StringRef key, bool otherwise) const;
  /// The dictionary as JSON (for the plan's RoPE tables).
  Object json() const;

private:
  mlir::Attribute get(llvm::StringRef key, llvm::StringRef kind, bool optional = false) const;

  mlir::DictionaryAttr dict;
  std::string *problems;
};

/// One step of the program, read from its exec.launch: the kernel id, the
/// buffer, weight and KV-cache ids of its operands (declaration order), its
/// constants.
struct Step {
  int64_t index = 0;
  llvm::StringRef kernel;
  std::vector<int64_t> in, weights, out;
  Constants constants;
  const std::string *problems; ///< what reading `constants` found wrong
};

/// A kernel parameter: its C declaration and what the table calls it.
struct Param {
  std::string decl; // e.g. "const float *__restrict__ x"
  std::string ref;  // e.g. "buf:3", "T"
};

class Emitter;

/// An attention gradient's heads (GQA: heads share kvHeads), head dims and
/// softmax parameters, and the table references of its operands (rows of
/// heads x dq queries, kvHeads x dq keys, kvHeads x dv values, heads x dv
/// dO).
struct AttentionGradShape {
  int64_t heads, kvHeads, dq, dv;
  double scale;
  int64_t window;
};
struct AttentionGradRefs {
  AttentionGradShape shape;
  std::string dout, q, k, v, dq, dk, dv;
};

/// How the steps of one kernel id lower (the table in CudaEmitter.cpp): the
/// operand counts the lowering reads and the Emitter member that appends
/// the step's launches (and sets the rows of the steps after it, "T" or
/// "R", when it changes them).
struct StepLowering {
  llvm::StringLiteral kernel;
  int minIns, maxIns, minWeights, maxWeights, minOuts, maxOuts;
  llvm::Error (Emitter::*lower)(const Step &step, Array &launches, std::string &rowsName);
};

/// Builds one program's source and table.
class Emitter {
public:
  Emitter(moe::exec::ProgramOp program, const Workload &workload, const GpuTargetInfo &target)
      : program(program), target(target), maxTokens(workload.maxBatchTokens),
        maxSeqLen(workload.maxSeqLen) {}

  llvm::Expected<EmittedProgram> run();

  // Step lowerings by family (StepLowering).
  llvm::Error lowerEmbedding(const Step &, Array &, std::string &);
  llvm::Error lowerRmsNorm(const Step &, Array &, std::string &);
  llvm::Error lowerRowSumSquares(const Step &, Array &, std::string &);
  llvm::Error lowerLayerNorm(const Step &, Array &, std::string &);
  llvm::Error lowerAddNorm(const Step &, Array &, std::string &);
  llvm::Error lowerRope(const Step &, Array &, std::string &);
  llvm::Error lowerAttention(const Step &, Array &, std::string &);
  llvm::Error lowerMlaAttention(const Step &, Array &, std::string &);
  llvm::Error lowerLinear(const Step &, Array &, std::string &);
  llvm::Error lowerMlp(const Step &, Array &, std::string &);
  llvm::Error lowerSplit(const Step &, Array &, std::string &);
  llvm::Error lowerConcat(const Step &, Array &, std::string &);
  llvm::Error lowerAdd(const Step &, Array &, std::string &);
  llvm::Error lowerSigmoidGate(const Step &, Array &, std::string &);
  llvm::Error lowerRouter(const Step &, Array &, std::string &);
  llvm::Error lowerRoute(const Step &, Array &, std::string &);
  llvm::Error lowerExperts(const Step &, Array &, std::string &);
  llvm::Error lowerDispatch(const Step &, Array &, std::string &);
  llvm::Error lowerCombine(const Step &, Array &, std::string &);
  // The training program's (CudaLossKernels.cpp, CudaGradientKernels.cpp,
  // CudaAttentionKernels.cpp, CudaMoEGradKernels.cpp; experts_saved is
  // lowerExperts').
  llvm::Error lowerCrossEntropy(const Step &, Array &, std::string &);
  llvm::Error lowerLmLoss(const Step &, Array &, std::string &);
  llvm::Error lowerCrossEntropyGrad(const Step &, Array &, std::string &);
  llvm::Error lowerEmbeddingGrad(const Step &, Array &, std::string &);
  llvm::Error lowerLinearGrad(const Step &, Array &, std::string &);
  llvm::Error lowerBiasGrad(const Step &, Array &, std::string &);
  llvm::Error lowerMlpGrad(const Step &, Array &, std::string &);
  llvm::Error lowerRmsNormGrad(const Step &, Array &, std::string &);
  llvm::Error lowerRopeGrad(const Step &, Array &, std::string &);
  llvm::Error lowerSigmoidGateGrad(const Step &, Array &, std::string &);
  llvm::Error lowerAttentionGrad(const Step &, Array &, std::string &);
  llvm::Error lowerMlaAttentionGrad(const Step &, Array &, std::string &);
  llvm::Error lowerRouterStats(const Step &, Array &, std::string &);
  llvm::Error lowerRouterStatsGrad(const Step &, Array &, std::string &);
  llvm::Error lowerRouteGrad(const Step &, Array &, std::string &);
  llvm::Error lowerExpertsGrad(const Step &, Array &, std::string &);

private:
  moe::exec::ProgramOp program;
  const GpuTargetInfo &target;
  int64_t maxTokens = 0, maxSeqLen = 0;
  std::string source;
  std::vector<std::string> kernels;
  llvm::StringMap<std::string> byBody; // kernel text (name-less) -> name
  Array scratch, ropeTables;
  std::vector<std::string> ropeKeys;

  // The program's declarations, by id (declaration order).
  struct Buffer {
    int64_t rows, width;
  };
  struct Weight {
    std::vector<int64_t> shape;
    std::string dtype; // the checkpoint's spelling: "F32", "BF16", "F16"
  };
  std::vector<Buffer> buffers;
  std::vector<Weight> weights;
  int64_t kvCaches = 0;
  int64_t width(int64_t buffer) const { return buffers[buffer].width; }
  int64_t rows(int64_t buffer) const { return buffers[buffer].rows; }
  std::string dtype(int64_t id) const { return weights[id].dtype; }
  std::vector<int64_t> shape(int64_t id) const { return weights[id].shape; }
  int64_t numel(int64_t id) const {
    int64_t n = 1;
    for (int64_t d : shape(id))
      n *= d;
    return n;
  }
  /// The ids of each launch's operands.
  struct Operands {
    std::vector<int64_t> in, weights, out;
  };
  llvm::DenseMap<mlir::Operation *, Operands> stepOperands;
  /// The program's steps (exec.launch / exec.collective ops) as read, and
  /// the id of its logits buffer (-1: none).
  llvm::Error readProgram(std::vector<mlir::Operation *> &steps, int64_t &logits);
  /// A lowering's problem with step `s`.
  llvm::Error stepError(const Step &s, const llvm::Twine &message) const;
  /// The first constant of `s` read so far that was absent or of another
  /// kind, as an error (success when none). run() checks it after every
  /// lowering; a lowering checks it itself only before it computes with a
  /// constant (a divisor, a cache id).
  llvm::Error constantsRead(const Step &s) const;
  llvm::Error checkCache(const Step &s, int64_t cache) const;
  /// Weight `weight` of the step has `rank` dimensions.
  llvm::Error checkMatrix(const Step &s, size_t weight, size_t rank = 2) const;
  /// The step's "activation" names a kernel's (silu, gelu, gelu_tanh, relu).
  llvm::Error checkActivation(const Step &s) const;

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
  int64_t ropeTable(const Constants &rope) {
    std::string key;
    llvm::raw_string_ostream os(key);
    os << JsonValue(rope.json());
    os.flush();
    for (size_t i = 0; i < ropeKeys.size(); ++i)
      if (ropeKeys[i] == key)
        return static_cast<int64_t>(i);
    ropeKeys.push_back(key);
    ropeTables.push_back(Object{{"rope", rope.json()},
                                {"positions", maxSeqLen},
                                {"half", rope.integer("rotary_dim") / 2}});
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

  /// The backward pass's GEMMs (the table's transpose_a / accumulate /
  /// k_rows forms). dx[T, n] (+)= dy[T, k] B[k, n], B stored [k, n] (a
  /// weight [out, in]): the input's gradient through a linear.
  Object gemmDx(std::string dy, std::string b, std::string dx, int64_t n, int64_t k,
                llvm::StringRef bDtype, bool accumulate = false) {
    Object g{{"a", dy},   {"b", b},   {"c", dx},  {"m", "T"},
             {"n", n},    {"k", k},   {"lda", k}, {"ldb", n},
             {"ldc", n},  {"b_dtype", bDtype.str()}, {"transpose_b", false}, {"batch", 1}};
    if (accumulate)
      g["accumulate"] = true;
    return Object{{"gemm", std::move(g)}};
  }
  /// dW[m, n] = dy[T, m]^T x[T, n], summed over the step's T rows: a
  /// weight's gradient.
  Object gemmDw(std::string dy, std::string x, std::string dw, int64_t m, int64_t n) {
    return Object{{"gemm", Object{{"a", dy},
                                  {"b", x},
                                  {"c", dw},
                                  {"m", str(m)},
                                  {"n", n},
                                  {"k", maxTokens},
                                  {"k_rows", "T"},
                                  {"lda", m},
                                  {"ldb", n},
                                  {"ldc", n},
                                  {"b_dtype", "F32"},
                                  {"transpose_a", true},
                                  {"transpose_b", false},
                                  {"batch", 1}}}};
  }

  // Kernel builders.
  Object embedding(int64_t i, int64_t out, int64_t ids, int64_t table, bool shard);
  Object rmsNorm(int64_t i, int64_t in, int64_t w, int64_t out, double eps);
  Object rmsNormOfSquares(int64_t i, int64_t in, int64_t squares, int64_t w, int64_t out,
                          double eps, int64_t rowWidth);
  Object route(int64_t i, const Constants &routing, int64_t E, const std::string &logits,
               int64_t bias, int64_t weightsOut, int64_t expertsOut);
  Object layerNorm(int64_t i, int64_t in, int64_t w, int64_t b, int64_t out, double eps);
  Object rope(int64_t i, std::string in, std::string out, std::string positions, int64_t width,
              int64_t headDim, int64_t headStride, int64_t headOffset, const Constants &rope,
              llvm::StringRef what, bool transposed = false);
  void attendGradQ(int64_t i, const AttentionGradRefs &r, const std::string &stats,
                   Array &launches);
  Object attendGradKV(int64_t i, const AttentionGradRefs &r, const std::string &stats);
  Object gatedProduct(int64_t i, std::string a, std::string u, std::string h, int64_t I,
                      int64_t C, std::string counts, llvm::StringRef act, std::string rowsRef,
                      Array grid);
  Object gatedProductGrad(int64_t i, std::string a, std::string u, std::string dh,
                          std::string da, std::string du, int64_t I, int64_t C,
                          std::string counts, llvm::StringRef act, std::string rowsRef,
                          Array grid);
  Object pairRows(int64_t i, llvm::StringRef what, std::string pairs, std::string slotsRef,
                  std::string blocks, int64_t W, int64_t k, bool toBlocks, bool fromToken,
                  std::string weights);
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
