// A train program's own members (moec compile --train; docs/plan-format.md):
// its labels, its loss and, when differentiated, its weights' gradients.
#include "PlanReaders.h"

#include <fmt/format.h>

#include <set>

namespace moert {

void readTrainingOutputs(const JsonFields &pr, const JsonFields &inputs, PlanProgram &program,
                         bool last, bool pipelined) {
  // (A pipeline stage's forward program, "train_forward", reads the labels
  // and, on the last stage, gives the loss; its backward program, "train",
  // the gradients.)
  const bool forwardPart = program.entry == "train_forward";
  const bool training = program.entry == "train" || forwardPart;
  auto buffer = [&](const JsonFields &reader, const std::string &field, int64_t id) {
    if (id < 0 || id >= static_cast<int64_t>(program.buffers.size()))
      reader.fail(field, fmt::format("buffer {} out of range", id));
    return program.buffers[id];
  };
  if ((program.labelsBuffer >= 0) != training)
    inputs.fail("labels", training ? "missing: a train program reads the labels"
                                   : "only a train program reads labels");
  program.lossBuffer = pr.has("loss") ? pr.integer("loss", -1) : -1;
  if (training && last && (forwardPart || !pipelined)) {
    if (!pr.has("loss"))
      pr.fail("loss", "missing: the last stage of a train program gives the loss");
    const PlanBuffer &b = buffer(pr, "loss", program.lossBuffer);
    if (b.dtype != DType::F32 || b.rows != 1 || b.width != 4)
      pr.fail("loss", "expected an F32 buffer of 1 row of 4 (loss, ce, aux, z)");
  } else if (program.lossBuffer != -1) {
    pr.fail("loss", "expected -1 (only the last stage of a train program gives the loss)");
  }
  if (!pr.has("gradients"))
    return;
  if (!training || forwardPart)
    pr.fail("gradients", "only a train program gives gradients");
  const nlohmann::json &list = pr.array("gradients");
  std::set<int64_t> weights, buffers;
  for (size_t i = 0; i < list.size(); ++i) {
    JsonFields g = pr.element("gradients", i);
    g.onlyMembers(moe::plan::members::kGradient);
    PlanProgram::Gradient gradient{g.integer("weight", 0), g.integer("buffer", 0)};
    if (gradient.weight >= static_cast<int64_t>(program.weights.size()))
      g.fail("weight", fmt::format("weight {} out of range", gradient.weight));
    const PlanWeight &w = program.weights[gradient.weight];
    const PlanBuffer &b = buffer(g, "buffer", gradient.buffer);
    int64_t elements = 1;
    for (int64_t d : w.shape)
      elements *= d;
    if (b.dtype != DType::F32 || b.rows * b.width != elements || b.width != w.shape.back())
      g.fail("buffer", fmt::format("buffer {} is not an F32 buffer of the shape of '{}' {}",
                                   gradient.buffer, w.name, shapeString(w.shape)));
    if (!weights.insert(gradient.weight).second || !buffers.insert(gradient.buffer).second)
      g.fail("weight", "a weight or buffer named twice");
    if (gradient.buffer == program.lossBuffer || gradient.buffer == program.labelsBuffer ||
        gradient.buffer == program.tokensBuffer || gradient.buffer == program.positionsBuffer)
      g.fail("buffer", "the buffer of an input or of the loss");
    program.gradients.push_back(gradient);
  }
}

} // namespace moert

namespace moert {

void readOptimizerMembers(const JsonFields &pr, const JsonFields &inputs, PlanProgram &program) {
  const bool optimizer = program.entry == "optimizer";
  for (const char *field : {"stats", "micro_batches"})
    if (pr.has(field) != optimizer)
      pr.fail(field, optimizer ? "missing: an optimizer program has it"
                               : "only an optimizer program has it");
  if (inputs.has("step") != optimizer)
    inputs.fail("step", optimizer ? "missing: an optimizer program reads its step"
                                  : "only an optimizer program reads a step");
  if (!optimizer)
    return;
  if (program.tokensBuffer >= 0 || program.positionsBuffer >= 0 || program.labelsBuffer >= 0)
    inputs.fail("tokens", "an optimizer program reads no tokens");
  auto buffer = [&](const JsonFields &reader, const char *field, DType dtype, int64_t width) {
    const int64_t id = reader.integer(field, 0);
    if (id >= static_cast<int64_t>(program.buffers.size()))
      reader.fail(field, fmt::format("buffer {} out of range", id));
    const PlanBuffer &b = program.buffers[id];
    if (b.dtype != dtype || b.rows != 1 || b.width != width || !b.state.empty())
      reader.fail(field, fmt::format("expected an {} buffer of 1 row of {}", dtypeName(dtype),
                                     width));
    return id;
  };
  program.stepBuffer = buffer(inputs, "step", DType::I32, 1);
  program.statsBuffer = buffer(pr, "stats", DType::F32, 4);
  program.microBatches = pr.bounded("micro_batches", 1, int64_t(1) << 30);
}

} // namespace moert
