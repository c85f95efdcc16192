// The writer's side of the plan schema (moe/PlanSchema.h): every object of
// the plans moec writes has only the members the schema lists, and the
// reader (moert) refuses any other (PlanLoad.BadFieldsAreNamed), so a field
// added on one side only fails a test.
#include "TinyModel.h"
#include "moe/PlanSchema.h"
#include "moe/Pipelines.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "gtest/gtest.h"

#include <set>

namespace {

namespace members = moe::plan::members;
using llvm::json::Array;
using llvm::json::Object;

template <size_t N> void expectMembers(const Object &o, const char *const (&allowed)[N],
                                       const std::string &where) {
  std::set<std::string> known(std::begin(allowed), std::end(allowed));
  for (const auto &[key, value] : o)
    EXPECT_TRUE(known.count(key.str())) << where << "." << key.str() << " is not in the schema";
}

template <size_t N> void expectEach(const Object &o, llvm::StringRef key,
                                    const char *const (&allowed)[N], const std::string &where) {
  if (const Array *a = o.getArray(key))
    for (const llvm::json::Value &e : *a)
      expectMembers(*e.getAsObject(), allowed, where + "." + key.str() + "[]");
}

/// The plan moec writes for a small Mixtral-like model with `layout`.
Object writePlan(std::optional<moe::LayoutRequest> layout) {
  std::unique_ptr<mlir::MLIRContext> owned = moe::test::makeContext();
  mlir::MLIRContext &context = *owned;
  mlir::OwningOpRef<mlir::ModuleOp> module = moe::test::importTinyMixtral(context);
  llvm::SmallString<128> path;
  EXPECT_FALSE(llvm::sys::fs::createTemporaryFile("plan-schema", "plan", path));
  moe::CompileOptions options;
  options.maxSeqLen = 128;
  options.layout = layout;
  options.output = path.str().str();
  mlir::PassManager pm(&context);
  moe::buildPipeline(pm, options, moe::Phase::Plan);
  EXPECT_TRUE(mlir::succeeded(pm.run(*module)));
  auto text = llvm::MemoryBuffer::getFile(path);
  llvm::sys::fs::remove(path);
  EXPECT_TRUE(static_cast<bool>(text));
  llvm::Expected<llvm::json::Value> plan = llvm::json::parse((*text)->getBuffer());
  EXPECT_TRUE(static_cast<bool>(plan)) << llvm::toString(plan.takeError());
  return std::move(*plan->getAsObject());
}

void expectSchema(const Object &plan) {
  expectMembers(plan, members::kRoot, "");
  expectMembers(*plan.getObject("model"), members::kModel, "model");
  expectMembers(*plan.getObject("workload"), members::kWorkload, "workload");
  expectMembers(*plan.getObject("degrees"), members::kDegrees, "degrees");
  if (const Object *vocab = plan.getObject("vocab"))
    expectMembers(*vocab, members::kVocab, "vocab");
  expectEach(plan, "weights", members::kWeight, "");
  for (const llvm::json::Value &p : *plan.getArray("programs")) {
    const Object &program = *p.getAsObject();
    expectMembers(program, members::kProgram, "programs[]");
    expectEach(program, "weights", members::kWeight, "programs[]");
    expectEach(program, "buffers", members::kBuffer, "programs[]");
    expectEach(program, "kv_caches", members::kKVCache, "programs[]");
    expectEach(program, "steps", members::kStep, "programs[]");
    expectMembers(*program.getObject("inputs"), members::kInputs, "programs[].inputs");
    expectMembers(*program.getObject("memory"), members::kProgramMemory, "programs[].memory");
  }
  for (const llvm::json::Value &r : *plan.getArray("ranks")) {
    const Object &rank = *r.getAsObject();
    expectMembers(rank, members::kRank, "ranks[]");
    if (const Object *coords = rank.getObject("coords"))
      expectMembers(*coords, members::kCoords, "ranks[].coords");
    expectMembers(*rank.getObject("memory"), members::kRankMemory, "ranks[].memory");
    expectEach(rank, "weights", members::kSlice, "ranks[]");
  }
}

TEST(PlanSchema, TheWriterEmitsOnlySchemaMembers) {
  Object single = writePlan(std::nullopt);
  expectSchema(single);
  EXPECT_EQ(*single.getArray("programs")->front().getAsObject()->getString("entry"), "forward");

  moe::LayoutRequest four;
  four.worldSize = 4;
  four.ep = 2;
  four.tp = 2;
  Object partitioned = writePlan(four);
  expectSchema(partitioned);
  EXPECT_EQ(partitioned.getArray("ranks")->size(), 4u);
  EXPECT_TRUE(partitioned.getObject("vocab"));
}

} // namespace
