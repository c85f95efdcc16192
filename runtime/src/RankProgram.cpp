#include "RankProgram.h"

#include "moert/Error.h"
#include "moert/Op.h"

#include <algorithm>

namespace moert {

void RankProgram::prepare(const Plan &plan, int64_t rank, DeviceMemory &memory_, Comm *comm,
                          Staging staging, const PlanProgram *entry,
                          const RankProgram *cachesOf, const RankProgram *statesOf) {
  plan_ = &plan;
  program_ = entry ? entry : &plan.programOf(rank);
  memory = &memory_;
  const int64_t before = memory->allocatedBytes();
  buffers.clear();
  // A state buffer persists: the rank's first program that names it
  // allocates it (zeros) and its later entries share it (the states of
  // the entries prepared before, which statesOf holds).
  states = statesOf ? statesOf->states : std::map<std::string, State>();
  slotted.clear();
  for (const PlanBuffer &b : program_->buffers) {
    if (b.state.empty()) {
      buffers.push_back(memory->allocate(b.rows * b.width * 4));
      continue;
    }
    // A ZeRO shard: member d of its group (dp, or edp) holds rows
    // [d rows, (d + 1) rows) of its logical state.
    StateShard shard{b.rows * b.width, b.rows * b.width, 0, false};
    if (b.logicalRows > 0) {
      const RankCoords &coords = plan.ranks.at(rank).coords;
      shard.logicalElements = b.logicalRows * b.width;
      shard.offset = (b.shardOverEdp ? coords.edp : coords.dp) * b.rows * b.width;
      shard.sharded = true;
      shard.overEdp = b.shardOverEdp;
    }
    auto [it, added] = states.emplace(b.state, State{nullptr, b.rows * b.width, shard, {}});
    const bool kept = b.kept();
    if (added && kept) {
      for (int64_t i = 0; i < plan.stashSlots(program_->stage); ++i)
        it->second.slots.push_back(memory->allocate(b.rows * b.width * 4));
      it->second.address = it->second.slots.front();
    } else if (added) {
      it->second.address = memory->allocate(b.rows * b.width * 4);
    } else if (it->second.elements != b.rows * b.width ||
             it->second.shard.logicalElements != shard.logicalElements ||
             it->second.shard.overEdp != shard.overEdp)
      runtimeError("state buffer '{}' of {} values ({} logical, shard over {}), {} ({}, over "
                   "{}) in another entry",
                   b.state, b.rows * b.width, shard.logicalElements, shard.overEdp ? "edp" : "dp",
                   it->second.elements, it->second.shard.logicalElements,
                   it->second.shard.overEdp ? "edp" : "dp");
    if (kept)
      slotted.push_back({buffers.size(), b.state});
    buffers.push_back(it->second.address);
  }
  caches.clear();
  const int64_t positions = plan.maxSequences * plan.maxSeqLen;
  if (cachesOf) // the plan's entries of a stage declare the same caches
    caches = cachesOf->caches;
  else
    for (const PlanCache &c : program_->caches)
      caches.push_back({static_cast<float *>(memory->allocate(positions * c.keyWidth * 4)),
                        static_cast<float *>(memory->allocate(positions * c.valueWidth * 4))});
  allocated = memory->allocatedBytes() - before;
  // all_gather lands the members' blocks here before they are laid out as
  // columns: at most max_batch_tokens rows of its output's width.
  gatherStage = nullptr;
  gatherBytes = 0;
  if (staging == Staging::Reserved) {
    for (const PlanStep &s : program_->steps)
      if (s.op->collective == Collective::AllGather && s.weights.empty()) // (a weight's: ZeRO)
        gatherBytes = std::max(gatherBytes,
                               program_->maxBatchTokens * program_->buffers[s.out[0]].width * 4);
    gatherStage = gatherBytes ? memory->allocate(gatherBytes) : nullptr;
  }

  context = {};
  context.plan = &plan;
  context.program = program_;
  context.rank = rank;
  context.comm = comm;
  context.memory = memory;
  context.groups = collectives::groupsOf(plan, rank, *program_);
  context.address = [this](int64_t id) { return buffer(id); };
  context.gatherStage = [this, staging](int64_t bytes) {
    if (bytes > gatherBytes) {
      if (staging == Staging::Reserved)
        runtimeError("all_gather of {} bytes exceeds the {} bytes reserved for it", bytes,
                     gatherBytes);
      if (gatherStage)
        memory->release(gatherStage, gatherBytes);
      gatherStage = memory->allocate(bytes);
      gatherBytes = bytes;
    }
    return gatherStage;
  };
}

void RankProgram::writeInputs(const Batch &batch) {
  const int64_t T = batch.size();
  if (T > program_->maxBatchTokens)
    runtimeError("batch of {} tokens exceeds the {} entry's max_batch_tokens ({})", T,
                 program_->entry, program_->maxBatchTokens);
  if (batch.positions.size() != batch.tokens.size())
    runtimeError("batch of {} tokens with {} positions", T, batch.positions.size());
  if (program_->tokensBuffer >= 0)
    memory->write(buffer(program_->tokensBuffer), batch.tokens.data(), T * 4);
  if (program_->positionsBuffer >= 0)
    memory->write(buffer(program_->positionsBuffer), batch.positions.data(), T * 4);
  if (program_->labelsBuffer >= 0) {
    if (batch.labels.size() != batch.tokens.size())
      runtimeError("training batch of {} tokens with {} labels", T, batch.labels.size());
    memory->write(buffer(program_->labelsBuffer), batch.labels.data(), T * 4);
  }
}

void RankProgram::writeStep(int64_t step) {
  if (program_->stepBuffer < 0)
    runtimeError("the {} entry reads no optimizer step", program_->entry);
  const auto value = static_cast<int32_t>(step);
  memory->write(buffer(program_->stepBuffer), &value, 4);
}

void RankProgram::readStats(std::vector<float> &stats) {
  stats.resize(4);
  memory->read(stats.data(), buffer(program_->statsBuffer), 4 * 4);
}

std::vector<std::string> RankProgram::stateNames() const {
  std::vector<std::string> names;
  for (const auto &[name, state] : states)
    if (state.slots.empty()) // (a pipeline stage's kept values are no training state)
      names.push_back(name);
  return names;
}

void RankProgram::readState(const std::string &name, std::vector<float> &out) const {
  auto it = states.find(name);
  if (it == states.end())
    runtimeError("the {} entry has no state '{}'", program_->entry, name);
  out.resize(static_cast<size_t>(it->second.elements));
  memory->read(out.data(), it->second.address, it->second.elements * 4);
}

void RankProgram::writeState(const std::string &name, const std::vector<float> &values) {
  auto it = states.find(name);
  const int64_t n = static_cast<int64_t>(values.size());
  if (it == states.end() ||
      (it->second.shard.sharded ? it->second.shard.logicalElements : it->second.elements) != n)
    runtimeError("the {} entry has no state '{}' of {} values", program_->entry, name,
                 values.size());
  const State &s = it->second;
  if (!s.shard.sharded) {
    memory->write(s.address, values.data(), n * 4);
    return;
  }
  // The whole logical state: this shard's rows of it (zeros past its end).
  std::vector<float> own(static_cast<size_t>(s.elements), 0.0f);
  for (int64_t i = 0; i < s.elements && s.shard.offset + i < n; ++i)
    own[static_cast<size_t>(i)] = values[static_cast<size_t>(s.shard.offset + i)];
  memory->write(s.address, own.data(), s.elements * 4);
}

StateShard RankProgram::stateShard(const std::string &name) const {
  auto it = states.find(name);
  if (it == states.end())
    runtimeError("the {} entry has no state '{}'", program_->entry, name);
  return it->second.shard;
}

void RankProgram::readOutput(int64_t rows, std::vector<float> &logits) {
  if (program_->lossBuffer >= 0) {
    logits.resize(4);
    memory->read(logits.data(), buffer(program_->lossBuffer), 4 * 4);
    return;
  }
  if (program_->logitsBuffer < 0)
    return;
  if (rows == 0) {
    logits.clear();
    return;
  }
  logits.resize(static_cast<size_t>(rows * plan_->vocabSize));
  memory->read(logits.data(), buffer(program_->logitsBuffer),
               static_cast<int64_t>(logits.size()) * 4);
}

void RankProgram::readGradient(size_t i, std::vector<float> &out) {
  const PlanProgram::Gradient &g = program_->gradients.at(i);
  const PlanBuffer &b = program_->buffers[g.buffer];
  out.resize(static_cast<size_t>(b.rows * b.width));
  memory->read(out.data(), buffer(g.buffer), static_cast<int64_t>(out.size()) * 4);
}

void RankProgram::bindSlot(int64_t microBatch) {
  for (const auto &[buffer, name] : slotted) {
    const std::vector<void *> &slots = states.at(name).slots;
    buffers[buffer] = slots[static_cast<size_t>(microBatch) % slots.size()];
  }
}

size_t RankProgram::leadingRecvs() const {
  size_t n = 0;
  while (n < program_->steps.size() && program_->steps[n].op->collective == Collective::Recv)
    ++n;
  return n;
}

size_t RankProgram::trailingSends() const {
  size_t n = 0;
  const std::vector<PlanStep> &steps = program_->steps;
  while (n < steps.size() && steps[steps.size() - 1 - n].op->collective == Collective::Send)
    ++n;
  return n;
}

} // namespace moert
