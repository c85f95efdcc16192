// A training run's state in checkpoints (TrainParts.h): the weights and
// optimizer states gathered from the parts the ranks hold for --save and
// --weights-out, and handed back to them at --resume.
#include "TrainParts.h"
#include "moert/Error.h"
#include "moert/PlanLayout.h"
#include "moert/RankExecutor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

namespace moert {

bool stageLead(const Plan &plan, int rank) {
  const int64_t stage = plan.ranks.at(rank).coords.pp;
  return plan.stageRank(0, stage) == rank;
}

void gatherStages(const Plan &plan, Comm &comm, std::vector<TensorToWrite> &tensors,
                  const std::string &what) {
  if (plan.degrees.pp <= 1)
    return;
  // Each stage's lead sends rank 0 its tensors: a count, then per tensor
  // its name, dtype, shape and bytes (the stages' weights in stage order
  // are the one-rank program's).
  auto lead = [&](int64_t stage) { return static_cast<int>(plan.stageRank(0, stage)); };
  for (int64_t stage = 1; stage < plan.degrees.pp; ++stage) {
    const std::string message = fmt::format("{} of stage {}", what, stage);
    if (comm.rank() == lead(stage)) {
      std::string blob;
      auto put = [&](const void *data, size_t bytes) {
        blob.append(static_cast<const char *>(data), bytes);
      };
      const int64_t count = static_cast<int64_t>(tensors.size());
      put(&count, 8);
      for (const TensorToWrite &t : tensors) {
        const int64_t nameSize = static_cast<int64_t>(t.name.size()),
                      dtype = static_cast<int64_t>(t.dtype),
                      rank = static_cast<int64_t>(t.shape.size());
        put(&nameSize, 8);
        put(t.name.data(), t.name.size());
        put(&dtype, 8);
        put(&rank, 8);
        put(t.shape.data(), t.shape.size() * 8);
        const size_t bytes = TensorView{t.dtype, t.shape, nullptr}.bytes();
        const size_t at = blob.size();
        blob.resize(at + bytes);
        t.fill(blob.data() + at);
      }
      const int64_t size = static_cast<int64_t>(blob.size());
      comm.send(&size, 8, 0, message);
      comm.send(blob.data(), size, 0, message);
    } else if (comm.rank() == 0) {
      int64_t size = 0;
      comm.recv(&size, 8, lead(stage), message);
      auto blob = std::make_shared<std::string>(static_cast<size_t>(size), '\0');
      comm.recv(blob->data(), size, lead(stage), message);
      size_t at = 0;
      auto get = [&](void *data, size_t bytes) {
        if (at + bytes > blob->size())
          runtimeError("{}: a truncated message", message);
        std::memcpy(data, blob->data() + at, bytes);
        at += bytes;
      };
      int64_t count = 0;
      get(&count, 8);
      for (int64_t i = 0; i < count; ++i) {
        int64_t nameSize = 0, dtype = 0, rank = 0;
        get(&nameSize, 8);
        TensorToWrite t;
        t.name.resize(static_cast<size_t>(nameSize));
        get(t.name.data(), t.name.size());
        get(&dtype, 8);
        t.dtype = static_cast<DType>(dtype);
        get(&rank, 8);
        t.shape.resize(static_cast<size_t>(rank));
        get(t.shape.data(), t.shape.size() * 8);
        const size_t bytes = TensorView{t.dtype, t.shape, nullptr}.bytes(), from = at;
        at += bytes;
        if (at > blob->size())
          runtimeError("{}: a truncated message", message);
        t.fill = [blob, from, bytes](char *to) { std::memcpy(to, blob->data() + from, bytes); };
        tensors.push_back(std::move(t));
      }
    }
  }
  if (comm.rank() != 0) {
    tensors.clear();
    return;
  }
  // (A table tied over the first and last stages comes from both, the
  // same values: once.)
  std::vector<TensorToWrite> once;
  for (TensorToWrite &t : tensors)
    if (std::none_of(once.begin(), once.end(),
                     [&](const TensorToWrite &o) { return o.name == t.name; }))
      once.push_back(std::move(t));
  tensors = std::move(once);
}

/// `values` (f32, weight w's local shape) as the checkpoint's tensors of w:
/// one, or one per expert of a stack, by their checkpoint names.
/// In `dtype` F32, or BF16 (values that are bf16 already: exact).
void appendByName(const PlanWeight &w, const std::vector<float> &values,
                  std::vector<TensorToWrite> &tensors, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    runtimeError("'{}': writing {} weights: not supported", w.name, dtypeName(dtype));
  auto fill = [&values, dtype](size_t begin, size_t count) {
    return [&values, dtype, begin, count](char *to) {
      if (dtype == DType::F32) {
        std::memcpy(to, values.data() + begin, count * sizeof(float));
        return;
      }
      for (size_t i = 0; i < count; ++i) {
        const uint16_t b = floatToBf16(values[begin + i]);
        std::memcpy(to + 2 * i, &b, 2);
      }
    };
  };
  if (w.experts == 0) {
    tensors.push_back({w.name, dtype, w.shape, fill(0, values.size())});
    return;
  }
  const std::vector<int64_t> shape(w.shape.begin() + 1, w.shape.end());
  const size_t size = values.size() / static_cast<size_t>(w.experts);
  for (int64_t e = 0; e < w.experts; ++e)
    tensors.push_back({w.expertName(e), dtype, shape, fill(e * size, size)});
}

/// The dtype the checkpoint holds weight `w` in (its slices').
DType storedDtype(const PlanLayout &layout, const PlanWeight &w) {
  const PlanSlice *s = layout.slice(0, w.experts ? w.expertName(0) : w.name);
  return s ? s->dtype : w.dtype;
}

/// State `name`'s whole logical values on rank 0, the writer (a ZeRO
/// shard's gathered over its group, dp or an expert stack's edp, in member
/// order; a weight held in parts, its experts or a TP box, then gathered
/// over the world into its boxes); other ranks get none. Every rank calls
/// it, for the same states in the same order.
void readWholeState(const Plan &plan, const PlanProgram &program, RankExecutor &executor,
                    Comm &comm, const std::string &name, std::vector<float> &out) {
  const StateShard shard = executor.stateShard(name);
  const PlanWeight *w = weightOfState(program, name);
  const std::optional<WeightParts> parts =
      w ? std::optional<WeightParts>(std::in_place, plan, comm.rank(), *w) : std::nullopt;
  if (!shard.sharded && parts && parts->split()) {
    std::vector<float> own;
    executor.readState(name, own);
    parts->gather(comm, name, own, out);
    if (!stageLead(plan, comm.rank()))
      out.clear();
    return;
  }
  if (!shard.sharded) {
    if (stageLead(plan, comm.rank()))
      executor.readState(name, out);
    else
      out.clear();
    return;
  }
  // A ZeRO shard: the replicas' rows of the rank's state (its part of a
  // tensor-parallel weight, its experts), gathered over the dp group (an
  // expert stack's over edp), then the parts.
  std::vector<float> own;
  executor.readState(name, own);
  const std::vector<int> replicas = plan.groupOf(
      comm.rank(), shard.overEdp
                       ? CollectiveGroup{CollectiveGroup::Mesh::Experts, CollectiveGroup::Axis::EDP}
                       : CollectiveGroup{CollectiveGroup::Mesh::Attention, CollectiveGroup::Axis::DP});
  out.resize(static_cast<size_t>(shard.elements) * replicas.size());
  comm.allGather(own.data(), shard.elements * 4, out.data(), replicas,
                 fmt::format("the shards of state '{}'", name));
  out.resize(static_cast<size_t>(shard.logicalElements));
  if (parts && parts->split()) {
    std::vector<float> part = std::move(out);
    parts->gather(comm, name, part, out);
  }
  if (!stageLead(plan, comm.rank()))
    out.clear();
}

/// The trained weights by checkpoint name (`values` keeps them; a bf16
/// weight's are its f32 master's, gathered when sharded or split over ep:
/// every rank calls it, rank 0 gets them, the others none): f32, or with
/// `layout` each in the dtype of its slices (a checkpoint the plan loads:
/// f32 for --param-dtype bf16).
std::vector<TensorToWrite> trainedWeights(const Plan &plan, RankExecutor &executor, Comm &comm,
                                          const PlanProgram &program,
                                          std::vector<std::vector<float>> &values,
                                          const PlanLayout *layout) {
  std::vector<TensorToWrite> tensors;
  values.assign(program.weights.size(), {});
  const std::vector<std::string> states = executor.stateNames();
  for (size_t i = 0; i < program.weights.size(); ++i) {
    const PlanWeight &w = program.weights[i];
    const WeightParts parts(plan, comm.rank(), w);
    if (std::binary_search(states.begin(), states.end(), "master:" + w.name)) {
      readWholeState(plan, program, executor, comm, "master:" + w.name, values[i]);
    } else if (parts.split()) {
      std::vector<float> own;
      executor.readWeight(i, own);
      parts.gather(comm, w.name, own, values[i]);
    } else if (stageLead(plan, comm.rank())) {
      executor.readWeight(i, values[i]);
    }
    if (stageLead(plan, comm.rank()))
      appendByName(parts.whole(), values[i], tensors,
                   layout ? storedDtype(*layout, w) : DType::F32);
  }
  gatherStages(plan, comm, tensors, "the trained weights");
  return tensors;
}

/// --save: the weights (in their slices' dtypes: a bf16 weight's f32 master
/// is a state, or, in an f32 checkpoint (--param-dtype bf16), the weight
/// itself), and every other state buffer that is not all zeros (a
/// state the checkpoint lacks starts as zeros: the expert loads between two
/// updates), each in its weight's shape, but the gradient sums: between two
/// updates they are zeros, or the last update's gradients where adamw
/// keeps them for the backward pass to overwrite (keep_sum), no state of
/// the training either way. Every rank calls it (ZeRO shards are
/// gathered); rank 0 writes.
void saveCheckpoint(const Plan &plan, RankExecutor &executor, Comm &comm,
                    const PlanProgram &program, const CheckpointTarget &target,
                    const TrainingProgress &progress) {
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors =
      trainedWeights(plan, executor, comm, program, values, &target.layout);
  std::vector<TensorToWrite> state;
  std::vector<std::vector<float>> stateValues;
  for (const std::string &name : executor.stateNames()) {
    if (stateOfKind(name, {"grad_sum", "grad_err"}))
      continue;
    // A state in a weight's shape; a master is none when the checkpoint
    // holds that weight in f32 (--param-dtype bf16: the weight is the master).
    const std::string of = name.substr(name.find(':') + 1);
    const auto w = std::find_if(program.weights.begin(), program.weights.end(),
                                [&](const PlanWeight &p) { return p.name == of; });
    if (w != program.weights.end() && name.rfind("master:", 0) == 0 &&
        storedDtype(target.layout, *w) == DType::F32)
      continue;
    std::vector<float> v;
    readWholeState(plan, program, executor, comm, name, v);
    if (!stageLead(plan, comm.rank()) ||
        std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }))
      continue;
    std::vector<int64_t> shape{static_cast<int64_t>(v.size())};
    if (w != program.weights.end()) {
      const std::vector<int64_t> whole = WeightParts(plan, comm.rank(), *w).whole().shape;
      if (TensorView{DType::F32, whole, nullptr}.numel() == shape[0])
        shape = whole;
    }
    stateValues.push_back(std::move(v));
    state.push_back({name, DType::F32, shape, [&stateValues, i = stateValues.size() - 1](char *to) {
                       std::memcpy(to, stateValues[i].data(), stateValues[i].size() * 4);
                     }});
  }
  gatherStages(plan, comm, state, "the optimizer states");
  // (In the order one rank saves them: by name.)
  std::stable_sort(state.begin(), state.end(),
                   [](const TensorToWrite &a, const TensorToWrite &b) { return a.name < b.name; });
  if (comm.rank() == 0)
    writeTrainingCheckpoint(target.dir, target.model, target.planPath, tensors, state, progress);
}

/// --resume: the checkpoint's progress (its update's shape must be the
/// plan's) and its state buffers into the executor's.
TrainingProgress resumeFrom(const std::string &dir, const Checkpoint &checkpoint,
                            RankExecutor &executor, const Plan &plan, int rank,
                            const PlanProgram &optimizer, int64_t B, int64_t L, int64_t steps,
                            int64_t shuffleSeed, bool saveAgain) {
  const ShardedCheckpoint *sharded = checkpoint.shardedCheckpoint();
  if (!sharded || !sharded->training())
    inputError("--resume {}: not a training checkpoint (moert train --save writes one)", dir);
  const TrainingProgress &p = *sharded->training();
  if (p.microBatches != optimizer.microBatches || p.seqLen != L || p.microBatchSize != B)
    inputError("{}/manifest.json: training: an update of {} micro-batches of {} x {} tokens, "
               "but the plan's is {} of {} x {}: resume with a plan of the same shape",
               dir, p.microBatches, p.microBatchSize, p.seqLen, optimizer.microBatches, B, L);
  // (--steps equal to the checkpoint's with --save: no update, the
  // checkpoint written again from this plan's layout.)
  if (p.step > steps || (p.step == steps && !saveAgain))
    inputError("--steps {}: {} is at update {} already{}", steps, dir, p.step,
               p.step == steps ? " (with --save it is written again, from this plan's layout)"
                               : "");
  if (p.shuffleSeed != shuffleSeed)
    inputError("--resume {}: its sample order is {}, this run's {}: give the same "
               "--shuffle-seed",
               dir, p.shuffleSeed < 0 ? std::string("in order") : fmt::format("seed {}", p.shuffleSeed),
               shuffleSeed < 0 ? std::string("in order") : fmt::format("seed {}", shuffleSeed));
  const std::vector<std::string> names = executor.stateNames();
  for (const ShardedCheckpoint::Tensor &t : sharded->state()) {
    // (Pipeline stages: the states of another stage's weights are its.)
    const std::string of = t.name.substr(t.name.find(':') + 1);
    if (plan.degrees.pp > 1 && std::find(names.begin(), names.end(), t.name) == names.end() &&
        std::any_of(plan.weights.begin(), plan.weights.end(),
                    [&](const PlanWeight &w) { return w.name == of; }) &&
        std::none_of(optimizer.weights.begin(), optimizer.weights.end(),
                     [&](const PlanWeight &w) { return w.name == of; }))
      continue;
    if (t.dtype != DType::F32 || std::find(names.begin(), names.end(), t.name) == names.end())
      inputError("{}/manifest.json: training.state: '{}' is not an F32 state of the plan's "
                 "programs",
                 dir, t.name);
    std::vector<float> values(t.bytes() / 4);
    sharded->assemble(t, reinterpret_cast<char *>(values.data()));
    // (A ZeRO shard takes its rows of the whole; a weight held in parts
    // the rank's part: its experts, its box.)
    const PlanWeight *w = weightOfState(optimizer, t.name);
    const std::optional<WeightParts> parts =
        w ? std::optional<WeightParts>(std::in_place, plan, rank, *w) : std::nullopt;
    const bool split = parts && parts->split();
    const int64_t expected =
        split ? TensorView{DType::F32, parts->whole().shape, nullptr}.numel()
              : executor.stateShard(t.name).logicalElements;
    if (static_cast<int64_t>(values.size()) != expected)
      inputError("{}/manifest.json: training.state: '{}' has {} values, the plan's {}", dir,
                 t.name, values.size(), expected);
    if (split)
      values = parts->part(values);
    executor.writeState(t.name, values);
  }
  return p;
}

} // namespace moert
