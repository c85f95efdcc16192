#include "moert/RankExecutor.h"
#include "Device.h"
#include "RankProgram.h"
#include "StepLoop.h"
#include "moert/Error.h"
#include "moert/PlanLayout.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <set>

namespace moert {

RankExecutor::RankExecutor(std::unique_ptr<Device> device) : device(std::move(device)) {}

RankExecutor::~RankExecutor() = default;

std::unique_ptr<RankExecutor> RankExecutor::create(DeviceKind kind) {
  return std::unique_ptr<RankExecutor>(
      new RankExecutor(kind == DeviceKind::Cuda ? createCudaDevice() : createCpuDevice()));
}

std::string RankExecutor::deviceName() const { return device->name(); }

namespace {

/// Weight `w`'s f32 values as the checkpoint stores them: the rank's slice
/// of each tensor (an expert stack's experts one after another), from the
/// origin of the rank's shape (a padded part's extra rows 0).
std::vector<float> checkpointValues(const Plan &plan, int64_t rank, const Checkpoint &ckpt,
                                    const PlanWeight &w) {
  const std::vector<int64_t> shape = w.experts ? w.tensorShape() : w.shape;
  const size_t size = static_cast<size_t>(TensorView{DType::F32, shape, nullptr}.numel());
  std::vector<float> values(size * static_cast<size_t>(std::max<int64_t>(w.experts, 1)), 0.0f);
  for (int64_t l = 0; l < std::max<int64_t>(w.experts, 1); ++l) {
    const std::string name =
        w.experts ? w.expertName(plan.ranks.at(rank).coords.ep * w.experts + l) : w.name;
    const PlanSlice *slice = plan.layout->slice(rank, name);
    if (!slice || slice->dtype != DType::F32)
      runtimeError("'{}': no f32 slice of it for rank {} to start its master weights from",
                   name, rank);
    ckpt.readBox(name, slice->offset, slice->shape, DType::F32,
                 reinterpret_cast<char *>(values.data() + static_cast<size_t>(l) * size), shape);
  }
  return values;
}

} // namespace

void RankExecutor::prepare(const Plan &plan, int64_t rank, const Checkpoint &weights,
                           Comm &comm) {
  device->open(plan, rank, weights, comm);
  programs.clear();
  seconds.clear();
  for (const PlanProgram *entry : plan.entriesOf(rank)) {
    programs.push_back(std::make_unique<RankProgram>());
    programs.back()->prepare(plan, rank, device->memory(), device->communicator(),
                             device->staging(), entry,
                             programs.size() > 1 ? programs.front().get() : nullptr,
                             programs.size() > 1 ? programs[programs.size() - 2].get() : nullptr);
    device->bind(*programs.back());
    programs.back()->setWeightParts(
        [d = device.get()](int64_t id) { return d->weightParts(static_cast<size_t>(id)); });
    programs.back()->setPhase(&phase_);
    seconds.emplace_back(entry->steps.size(), 0.0);
  }
  // A bf16 weight's f32 master starts as the checkpoint's values: the
  // weight widened (exact) when the checkpoint holds it in bf16, the f32
  // values it was rounded from when in f32 (--param-dtype bf16).
  const std::vector<std::string> states = stateNames();
  const std::vector<PlanWeight> &bound = programs.front()->program().weights;
  std::vector<float> values; // (one buffer for every weight: its pages are touched once)
  for (size_t i = 0; i < bound.size(); ++i) {
    const PlanWeight &w = bound[i];
    if (!std::binary_search(states.begin(), states.end(), "master:" + w.name))
      continue;
    const PlanSlice *slice = plan.layout->slice(
        rank, w.experts ? w.expertName(plan.ranks.at(rank).coords.ep * w.experts) : w.name);
    if (slice && slice->dtype == DType::F32)
      values = checkpointValues(plan, rank, weights, w);
    else
      readWeight(i, values);
    writeState("master:" + w.name, values);
  }
}

size_t RankExecutor::entryIndex(const std::string &entry) const {
  if (entry.empty())
    return 0;
  for (size_t i = 0; i < programs.size(); ++i)
    if (programs[i]->program().entry == entry)
      return i;
  runtimeError("the rank has no program of entry '{}'", entry);
}

void RankExecutor::forward(const Batch &batch, std::vector<float> &logits,
                           const std::string &entry) {
  const size_t index = entryIndex(entry);
  RankProgram &program = *programs[index];
  program.writeInputs(batch);
  device->run(program, batch, [&] {
    runSteps(program.collectives(), batch.size(), *device,
             device->synchronous() ? &seconds[index] : nullptr);
  });
  // The last stage's logits buffer is vocab_size wide (the compiler drops
  // the padding of a sharded head with a split): the LM head computed the
  // batch's logit rows only.
  program.readOutput(static_cast<int64_t>(batch.logitRows.size()), logits);
  device->synchronize();
}

void RankExecutor::pipelineStep(const Plan::PipelineStep &step, const Batch &batch,
                                std::vector<float> &loss, const Plan::PipelineStep *next,
                                const Batch *nextBatch) {
  auto indexOf = [&](const Plan::PipelineStep &s) {
    return entryIndex(s.backward ? "train" : "train_forward");
  };
  const size_t index = indexOf(step);
  RankProgram &program = *programs[index];
  program.bindSlot(step.microBatch);
  program.writeInputs(batch);
  // A fused step's first receives came with the step before's sends; its
  // own last sends go with the next step's receives.
  // (The receives and sends timed apart: the time a stage waits for its
  // neighbours, the pipeline's bubble, is in them.)
  using Clock = std::chrono::steady_clock;
  auto timed = [&](auto &&f) {
    const auto t = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const size_t recvs = program.leadingRecvs(), sends = program.trailingSends();
  const size_t begin = step.fused ? recvs : 0;
  const bool fuseNext = next && next->fused;
  const size_t size = program.program().steps.size();
  const size_t end = size - (fuseNext ? sends : 0);
  const size_t computeBegin = std::max(begin, recvs), computeEnd = std::max(computeBegin, size - sends);
  device->run(program, batch, [&] {
    std::vector<double> *times = device->synchronous() ? &seconds[index] : nullptr;
    const collectives::Context &c = program.collectives();
    pipelineWait_ += timed([&] { runSteps(c, batch.size(), *device, times, begin, computeBegin); });
    pipelineBusy_ += timed([&] { runSteps(c, batch.size(), *device, times, computeBegin, computeEnd); });
    pipelineWait_ += timed([&] { runSteps(c, batch.size(), *device, times, computeEnd, end); });
  });
  program.readOutput(static_cast<int64_t>(batch.logitRows.size()), loss);
  if (!fuseNext)
    return;
  RankProgram &after = *programs[indexOf(*next)];
  after.bindSlot(next->microBatch);
  const collectives::Context &from = program.collectives(), &to = after.collectives();
  std::vector<Comm::Piece> sendPieces, recvPieces;
  int peer = -1;
  auto samePeer = [&](int p) {
    if (peer >= 0 && p != peer)
      runtimeError("a fused pipeline step exchanges with ranks {} and {}", peer, p);
    peer = p;
  };
  for (size_t i = end; i < program.program().steps.size(); ++i) {
    const PlanStep &s = program.program().steps[i];
    samePeer(collectives::peerOf(from, s));
    sendPieces.push_back({0, from.address(s.in[0]),
                     collectives::transferBytes(from, s.in[0], batch.size())});
  }
  for (size_t i = 0; i < after.leadingRecvs(); ++i) {
    const PlanStep &s = after.program().steps[i];
    samePeer(collectives::peerOf(to, s));
    recvPieces.push_back({0, to.address(s.out[0]),
                     collectives::transferBytes(to, s.out[0], nextBatch->size())});
  }
  if (peer < 0 || sendPieces.empty() || recvPieces.empty())
    runtimeError("a fused pipeline step without sends or receives");
  device->synchronize();
  pipelineWait_ += timed([&] {
    from.comm->sendRecv(sendPieces, recvPieces, peer,
                        fmt::format("{}{}exchange with rank {} (pipeline)", phase_,
                                    phase_.empty() ? "" : ": ", peer));
  });
}

void RankExecutor::readGradient(size_t i, std::vector<float> &out, const std::string &entry) {
  programs[entryIndex(entry)]->readGradient(i, out);
  device->synchronize();
}

void RankExecutor::optimizerStep(int64_t step, std::vector<float> &stats) {
  const size_t index = entryIndex("optimizer");
  RankProgram &program = *programs[index];
  program.writeStep(step);
  const Batch none;
  device->run(program, none, [&] {
    runSteps(program.collectives(), 0, *device,
             device->synchronous() ? &seconds[index] : nullptr);
  });
  program.readStats(stats);
  device->synchronize();
}

void RankExecutor::readWeight(size_t i, std::vector<float> &out) {
  device->synchronize();
  device->readWeight(i, out);
}

std::vector<std::string> RankExecutor::stateNames() const {
  std::set<std::string> names;
  for (const auto &program : programs)
    for (const std::string &name : program->stateNames())
      names.insert(name);
  return {names.begin(), names.end()};
}

/// The program of the rank that holds state `name` (every entry naming it
/// shares one buffer).
RankProgram &RankExecutor::stateHolder(const std::string &name) const {
  for (const auto &program : programs)
    for (const std::string &held : program->stateNames())
      if (held == name)
        return *program;
  runtimeError("the rank has no state '{}'", name);
}

void RankExecutor::readState(const std::string &name, std::vector<float> &out) {
  device->synchronize();
  stateHolder(name).readState(name, out);
}

bool stateOfKind(const std::string &name, const std::vector<std::string> &kinds) {
  const std::string kind = name.substr(0, name.find(':'));
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

int64_t RankExecutor::stateBytes(const std::vector<std::string> &kinds) const {
  int64_t bytes = 0;
  for (const std::string &name : stateNames())
    if (stateOfKind(name, kinds))
      bytes += stateShard(name).elements * 4;
  return bytes;
}

StateShard RankExecutor::stateShard(const std::string &name) const {
  return stateHolder(name).stateShard(name);
}

void RankExecutor::writeState(const std::string &name, const std::vector<float> &values) {
  stateHolder(name).writeState(name, values);
  device->synchronize();
}

void Device::readWeight(size_t, std::vector<float> &) {
  runtimeError("reading trained weights back from the {} device: not supported yet", name());
}

int64_t RankExecutor::weightBytes() const { return device->weightBytes(); }
int64_t RankExecutor::peakBytes() const {
  int64_t bytes = device->ownPeakBytes();
  for (const auto &program : programs)
    bytes += program->bytes();
  return bytes;
}
int64_t RankExecutor::workspaceBytes() const { return peakBytes() - weightBytes(); }
int64_t RankExecutor::loadedWeightBytes() const { return device->loadedWeightBytes(); }

std::vector<double> RankExecutor::stepSeconds(const std::string &entry) const {
  return device->synchronous() ? seconds[entryIndex(entry)] : std::vector<double>{};
}

bool planTargetsCuda(const Plan &plan) {
  for (const PlanProgram &p : plan.programs)
    if (p.cuda)
      return true;
  return false;
}

DeviceKind chooseDevice(const Plan &plan, const std::string &planPath, const std::string &name,
                        const char *compileHint) {
  if (!name.empty() && name != "cpu" && name != "cuda")
    inputError("--device {}: expected cpu or cuda", name);
  const bool cuda = planTargetsCuda(plan);
  if (name == "cuda" && !cuda)
    inputError("--device cuda: {} has no CUDA kernels (compile it with {})", planPath,
               compileHint);
  return name == "cuda" || (name.empty() && cuda) ? DeviceKind::Cuda : DeviceKind::Cpu;
}

#ifndef MOERT_HAVE_CUDA
std::unique_ptr<Device> createCudaDevice() {
  inputError("this moert was built without the CUDA toolkit: it runs CUDA plans on the CPU "
             "only (--device cpu); rebuild with the toolkit installed to run them on a GPU");
}
#endif

} // namespace moert
