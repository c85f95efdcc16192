// Reads a program's CUDA kernel table (moert/KernelTable.h) out of the plan,
// checking every field: a damaged table is an input error naming the field
// (programs[i].cuda.steps[j].launches[k].params[m]), never an exception or
// an out-of-range index in the CUDA device.
#include "PlanReaders.h"

#include <fmt/format.h>

#include <charconv>
#include <optional>

namespace moert {
namespace {

using json = nlohmann::json;

/// Bounds of what a table may hold: CUDA's own limits, and the sizes cuBLAS
/// takes (int).
constexpr int64_t kMaxInt = (int64_t(1) << 31) - 1;
constexpr int64_t kMaxBlock = 1024;
constexpr int64_t kMaxSharedBytes = int64_t(1) << 20;

/// "name:N" -> N when `text` starts with `prefix` and the rest is a decimal
/// int64 (sign allowed); the caller checks the range.
std::optional<int64_t> suffixNumber(const std::string &text, const std::string &prefix) {
  if (text.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  const char *begin = text.data() + prefix.size(), *end = text.data() + text.size();
  int64_t value = 0;
  auto [at, error] = std::from_chars(begin, end, value);
  if (begin == end || error != std::errc() || at != end)
    return std::nullopt;
  return value;
}

/// Standard base64 (RFC 4648, '=' padding); false on any other character.
bool decodeBase64(const std::string &text, std::string &out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0)
    return false;
  out.clear();
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        v[j] = 0;
        ++pad;
      } else if (pad > 0 || (v[j] = value(c)) < 0) {
        return false;
      }
    }
    const uint32_t n = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) |
                       uint32_t(v[3]);
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2)
      out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1)
      out.push_back(static_cast<char>(n & 0xff));
  }
  return true;
}

class Reader {
public:
  Reader(const PlanProgram &program, const JsonFields &cuda) : program(program), cuda(cuda) {}

  KernelTable read() {
    if (cuda.integer("format") != 2)
      cuda.fail("format", fmt::format("this moert reads kernel table format 2, not {}",
                                      cuda.integer("format")));
    table.source = cuda.has("source") ? cuda.string("source") : "stage.cu";
    table.code = cuda.string("code");
    if (table.code.empty())
      cuda.fail("code", "expected the kernels' CUDA C++ source");
    if (cuda.has("fatbin")) {
      if (!decodeBase64(cuda.string("fatbin"), table.fatbin) || table.fatbin.size() < 16)
        cuda.fail("fatbin", "expected nvcc's fatbin in base64");
    }
    const json &scratch = cuda.array("scratch");
    for (size_t i = 0; i < scratch.size(); ++i)
      table.scratchBytes.push_back(
          cuda.element("scratch", i).bounded("bytes", 0, int64_t(1) << 40));
    const json &rope = cuda.array("rope_tables");
    for (size_t i = 0; i < rope.size(); ++i) {
      JsonFields r = cuda.element("rope_tables", i);
      table.ropeTables.push_back({r.bounded("positions", 1, int64_t(1) << 24),
                                  r.bounded("half", 1, int64_t(1) << 16)});
    }
    const json &steps = cuda.array("steps");
    if (steps.size() != program.steps.size())
      cuda.fail("steps", fmt::format("expected one entry per plan step ({}) but got {}",
                                     program.steps.size(), steps.size()));
    // The rows the step loop gives each step: T up to the LM head, the logit
    // rows R after it. A table that says otherwise was made for another
    // program.
    bool afterHead = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      JsonFields s = cuda.element("steps", i);
      KernelStep step;
      if (s.has("rows") && (rows(s) == KernelLaunch::Rows::R) != afterHead)
        s.fail("rows", afterHead ? "expected \"R\": the step follows the LM head"
                                 : "expected \"T\": the step runs before the LM head's logit rows");
      afterHead = afterHead || program.steps[i].head;
      const json &launches = s.array("launches");
      for (size_t j = 0; j < launches.size(); ++j)
        step.launches.push_back(launch(s.element("launches", j), program.steps[i].op));
      table.steps.push_back(std::move(step));
    }
    if (cuda.has("sampling")) {
      JsonFields sampling = cuda.child("sampling");
      for (const auto &[name, value] : cuda.get("sampling").items()) {
        (void)value;
        KernelLaunch l = launch(sampling.child(name), nullptr);
        if (l.kind != KernelLaunch::Kind::Kernel)
          sampling.fail(name, "expected a kernel launch");
        table.sampling.push_back(std::move(l));
      }
    }
    return std::move(table);
  }

private:
  const PlanProgram &program;
  const JsonFields &cuda;
  KernelTable table;

  static KernelLaunch::Rows rows(const JsonFields &f) {
    const std::string r = f.string("rows");
    if (r != "T" && r != "R")
      f.fail("rows", fmt::format("expected \"T\" or \"R\" but got \"{}\"", r));
    return r == "R" ? KernelLaunch::Rows::R : KernelLaunch::Rows::T;
  }

  KernelLaunch launch(const JsonFields &l, const OpDef *op) {
    KernelLaunch out;
    if (l.has("rows"))
      out.rows = rows(l);
    const int kinds = l.has("kernel") + l.has("gemm") + l.has("collective");
    if (kinds != 1)
      l.fail("kernel", "expected exactly one of kernel, gemm and collective");
    if (l.has("collective")) {
      out.kind = KernelLaunch::Kind::Collective;
      out.collective = l.string("collective");
      if (!op || op->collective == Collective::None || findOp(out.collective) != op)
        l.fail("collective", fmt::format("'{}' is not the step's op ({})", out.collective,
                                         op ? op->name : "none"));
      if (op->collective == Collective::AllToAll)
        table.hasAllToAll = true;
      return out;
    }
    if (l.has("gemm")) {
      out.kind = KernelLaunch::Kind::Gemm;
      out.gemm = gemm(l.child("gemm"));
      return out;
    }
    out.kind = KernelLaunch::Kind::Kernel;
    out.kernel = l.string("kernel");
    if (out.kernel.empty() || out.kernel.size() > 256 ||
        out.kernel.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789_") != std::string::npos)
      l.fail("kernel", "expected a kernel name (letters, digits and _)");
    const json &grid = l.array("grid");
    if (grid.size() != 3)
      l.fail("grid", fmt::format("expected 3 dimensions but got {}", grid.size()));
    for (size_t d = 0; d < 3; ++d) {
      const json &g = grid[d];
      const std::string field = fmt::format("grid[{}]", d);
      if (!g.is_array() || g.size() != 3)
        l.fail(field, "expected [a, b, c] (ceil(a N / b) + c)");
      for (size_t k = 0; k < 3; ++k) {
        if (!g[k].is_number_integer() || g[k].get<int64_t>() < (k == 1 ? 1 : 0) ||
            g[k].get<int64_t>() > kMaxInt)
          l.fail(field, fmt::format("expected integers a, c in [0, {1}] and b in [1, {1}]",
                                    kMaxInt, kMaxInt));
        out.grid[d][k] = g[k].get<int64_t>();
      }
    }
    out.block = static_cast<unsigned>(l.bounded("block", 1, kMaxBlock));
    out.sharedBytes =
        l.has("shared_bytes") ? static_cast<unsigned>(l.bounded("shared_bytes", 0, kMaxSharedBytes))
                              : 0;
    const json &params = l.array("params");
    for (size_t p = 0; p < params.size(); ++p)
      out.params.push_back(ref(l, fmt::format("params[{}]", p), params[p]));
    return out;
  }

  KernelGemm gemm(const JsonFields &g) {
    KernelGemm out;
    out.a = ref(g, "a", g.get("a"));
    out.b = ref(g, "b", g.get("b"));
    out.c = ref(g, "c", g.get("c"));
    for (auto [field, r] : {std::pair<const char *, KernelRef *>{"a", &out.a}, {"c", &out.c}})
      if (r->kind != KernelRef::Kind::Buffer && r->kind != KernelRef::Kind::Scratch &&
          r->kind != KernelRef::Kind::Weight)
        g.fail(field, "expected a buffer, scratch or weight");
    if (out.b.kind != KernelRef::Kind::Weight && out.b.kind != KernelRef::Kind::Buffer &&
        out.b.kind != KernelRef::Kind::Scratch)
      g.fail("b", "expected a weight, buffer or scratch");
    const json &m = g.get("m");
    if (m.is_string() && (m == "T" || m == "R")) {
      out.rows = m == "T" ? KernelGemm::Rows::T : KernelGemm::Rows::R;
    } else {
      std::optional<int64_t> fixed;
      if (m.is_number_integer())
        fixed = m.get<int64_t>();
      else if (m.is_string())
        fixed = suffixNumber(m.get<std::string>(), "");
      if (!fixed || *fixed < 0 || *fixed > kMaxInt)
        g.fail("m", "expected \"T\", \"R\" or a row count");
      out.m = *fixed;
    }
    out.n = g.bounded("n", 1, kMaxInt);
    out.k = g.bounded("k", 1, kMaxInt);
    out.lda = g.bounded("lda", 1, kMaxInt);
    out.ldb = g.bounded("ldb", 1, kMaxInt);
    out.ldc = g.bounded("ldc", 1, kMaxInt);
    if (g.has("transpose_a"))
      out.transposeA = g.boolean("transpose_a");
    if (g.has("transpose_b"))
      out.transposeB = g.boolean("transpose_b");
    if (g.has("accumulate"))
      out.accumulate = g.boolean("accumulate");
    if (g.has("k_rows")) {
      const std::string kRows = g.string("k_rows");
      if (kRows != "T" && kRows != "R")
        g.fail("k_rows", fmt::format("expected \"T\" or \"R\" but got '{}'", kRows));
      out.kRows = kRows == "T" ? KernelGemm::Rows::T : KernelGemm::Rows::R;
    }
    if (!out.transposeA && out.lda < out.k)
      g.fail("lda", fmt::format("expected at least k ({})", out.k));
    if (out.ldb < (out.transposeB ? out.k : out.n))
      g.fail("ldb", fmt::format("expected at least {} ({})", out.transposeB ? "k" : "n",
                                out.transposeB ? out.k : out.n));
    if (out.ldc < out.n)
      g.fail("ldc", fmt::format("expected at least n ({})", out.n));
    if (g.has("b_dtype")) {
      out.bDtype = g.string("b_dtype");
      if (out.bDtype != "F32" && out.bDtype != "BF16" && out.bDtype != "F16")
        g.fail("b_dtype", fmt::format("expected F32, BF16 or F16 but got '{}'", out.bDtype));
    }
    out.batch = g.has("batch") ? g.bounded("batch", 1, kMaxInt) : 1;
    out.bBatchModulo = g.has("b_batch_modulo") ? g.bounded("b_batch_modulo", 1, out.batch)
                                               : out.batch;
    if (out.batch > 1 && out.kRows != KernelGemm::Rows::Fixed)
      g.fail("batch", "a batched GEMM has a fixed k (its blocks' rows come from counts)");
    if (out.batch > 1) {
      out.strideA = g.bounded("stride_a", 0, int64_t(1) << 40);
      out.strideB = g.bounded("stride_b", 0, int64_t(1) << 40);
      out.strideC = g.bounded("stride_c", 0, int64_t(1) << 40);
    } else if (g.has("stride_a")) {
      out.strideA = g.bounded("stride_a", 0, int64_t(1) << 40);
    }
    if (g.has("rows_from_counts")) {
      out.rowsFromCounts = ref(g, "rows_from_counts", g.get("rows_from_counts"));
      const KernelRef &counts = *out.rowsFromCounts;
      const bool fits =
          counts.kind == KernelRef::Kind::Buffer
              ? program.buffers[counts.value].dtype == DType::I32 &&
                    program.buffers[counts.value].rows * program.buffers[counts.value].width >=
                        out.batch
          : counts.kind == KernelRef::Kind::Scratch
              ? table.scratchBytes[counts.value] >= out.batch * 4
              : false;
      if (!fits)
        g.fail("rows_from_counts",
               fmt::format("expected an I32 buffer or a scratch entry of at least {} counts",
                           out.batch));
    }
    return out;
  }

  /// A reference, with its index checked against what the program and the
  /// table hold.
  KernelRef ref(const JsonFields &f, const std::string &field, const json &value) {
    if (!value.is_string())
      f.fail(field, "expected a reference such as \"buf:3\" or \"T\"");
    const std::string text = value.get<std::string>();
    using K = KernelRef::Kind;
    static const std::pair<const char *, K> plain[] = {
        {"T", K::T},
        {"R", K::R},
        {"null", K::Null},
        {"coord:tp", K::CoordTp},
        {"batch:sequence", K::BatchSequence},
        {"batch:position", K::BatchPosition},
        {"batch:logit_rows", K::BatchLogitRows},
        {"batch:argmax", K::BatchArgmax}};
    for (auto [name, kind] : plain)
      if (text == name)
        return {kind, 0};
    if (std::optional<int64_t> c = suffixNumber(text, "const:"))
      return {K::Const, *c};
    const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
    struct Indexed {
      const char *prefix;
      K kind;
      size_t count;
      const char *what;
    };
    const Indexed indexed[] = {
        {"buf:", K::Buffer, program.buffers.size(), "buffers"},
        {"weight:", K::Weight, program.weights.size(), "weights"},
        {"scratch:", K::Scratch, table.scratchBytes.size(), "scratch entries"},
        {"cache_keys:", K::CacheKeys, program.caches.size(), "KV caches"},
        {"cache_values:", K::CacheValues, program.caches.size(), "KV caches"},
        {"rope_cos:", K::RopeCos, table.ropeTables.size(), "rope tables"},
        {"rope_sin:", K::RopeSin, table.ropeTables.size(), "rope tables"}};
    for (const Indexed &i : indexed)
      if (text.compare(0, std::string(i.prefix).size(), i.prefix) == 0) {
        std::optional<int64_t> n = suffixNumber(text, i.prefix);
        if (!n || *n < 0 || *n >= static_cast<int64_t>(i.count))
          f.fail(field, fmt::format("'{}' is out of range (the program has {} {})", shown,
                                    i.count, i.what));
        return {i.kind, *n};
      }
    f.fail(field, fmt::format("unknown reference '{}'", shown));
  }
};

} // namespace

std::shared_ptr<const KernelTable> readKernelTable(const PlanProgram &program,
                                                   const JsonFields &cuda) {
  return std::make_shared<const KernelTable>(Reader(program, cuda).read());
}

} // namespace moert
