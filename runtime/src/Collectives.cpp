#include "Collectives.h"

#include "moert/Error.h"
#include "moert/cpu/Optimizer.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

namespace moert::collectives {

namespace {

const char *axisName(CollectiveGroup::Axis axis) {
  switch (axis) {
  case CollectiveGroup::Axis::PP: return "pp";
  case CollectiveGroup::Axis::DP: return "dp";
  case CollectiveGroup::Axis::TP: return "tp";
  case CollectiveGroup::Axis::EDP: return "edp";
  case CollectiveGroup::Axis::EP: return "ep";
  case CollectiveGroup::Axis::ETP: return "etp";
  }
  return "?";
}

int64_t widthOf(const Context &c, int64_t id) { return c.program->buffers[id].width; }

} // namespace

int peerOf(const Context &c, const PlanStep &s) {
  return static_cast<int>(c.plan->stageRank(c.rank, peerStage(s, c.program->stage)));
}

int64_t transferBytes(const Context &c, int64_t id, int64_t rows) {
  // The batch's rows of an activation; all rows of a value of fixed size.
  const PlanBuffer &b = c.program->buffers[id];
  return (b.rows == c.program->maxBatchTokens ? rows : b.rows) * b.width * 4;
}

namespace {
char *bytesOf(const Context &c, int64_t id) { return static_cast<char *>(c.address(id)); }

/// The step's rows (a state buffer: addInFixedOrder).
void allReduce(const Context &c, const PlanStep &s, int64_t rows,
               const std::vector<int> &group, const std::string &what) {
  const int64_t n = rows * widthOf(c, s.in[0]);
  if (s.out[0] != s.in[0])
    c.memory->copy2d(c.address(s.out[0]), n * 4, c.address(s.in[0]), n * 4, n * 4, 1);
  c.comm->allReduceSum(static_cast<float *>(c.address(s.out[0])), n, group, what);
}

/// A state buffer of an optimizer program over the group, in place, in a
/// fixed order: a sum of the replicas' gradients (with its error buffer: a
/// compensated sum, moert/cpu/Optimizer.h), expert loads, or ZeRO's sum of
/// squares. Member q adds part q of the values (`part` of them, a chunk at
/// a time): every member sends it its (sum, error) pairs of that part (a
/// reduce-scatter), it adds them with compensation in member order
/// (cpu::combineCompensated). With `gather` (all_reduce) every member then
/// gathers the parts (an all-gather): every member ends with the same bits,
/// the sum a single rank's compensated sum gives, each sending and
/// receiving about 4 n values whatever the group's size. Without it (ZeRO-1's
/// reduce_scatter in place, part = shard_rows x width) a member's other
/// parts keep its own values. A buffer without an error buffer gets the
/// compensated sum rounded once. (Host staging: optimizer programs run on
/// the CPU device.)
void addInFixedOrder(const Context &c, const PlanStep &s, const std::vector<int> &group,
                     const std::string &what, int64_t part, bool gather) {
  // (In place on the outputs: the inputs themselves, or a copy of them.)
  const PlanBuffer &in = c.program->buffers[s.out[0]];
  const int64_t n = in.rows * in.width, members = static_cast<int64_t>(group.size());
  const int64_t me =
      std::find(group.begin(), group.end(), static_cast<int>(c.rank)) - group.begin();
  const bool paired = s.in.size() == 2;
  constexpr int64_t kChunk = int64_t(1) << 18; // values
  const int64_t chunk = std::max<int64_t>(1, std::min(part, kChunk));
  // Per member: m sums, then m errors.
  std::vector<float> out(static_cast<size_t>(2 * chunk * members)),
      all(static_cast<size_t>(2 * chunk * members)), mine(static_cast<size_t>(2 * chunk));
  char *sum = bytesOf(c, s.out[0]), *err = paired ? bytesOf(c, s.out[1]) : nullptr;
  // Values [from, from + m) of member q's part that exist.
  auto valid = [&](int64_t from, int64_t m) { return std::clamp<int64_t>(n - from, 0, m); };
  // Member q's (sum, error) pairs of chunk `at` of its part into `piece`.
  auto write = [&](int64_t q, int64_t at, int64_t m, const float *piece) {
    const int64_t from = q * part + at, v = valid(from, m);
    if (v <= 0)
      return;
    c.memory->copy2d(sum + from * 4, v * 4, piece, v * 4, v * 4, 1);
    if (paired)
      c.memory->copy2d(err + from * 4, v * 4, piece + m, v * 4, v * 4, 1);
  };
  for (int64_t at = 0; at < part; at += chunk) {
    const int64_t m = std::min(chunk, part - at);
    std::vector<Comm::Piece> sends, recvs;
    for (int64_t q = 0; q < members; ++q) {
      float *piece = out.data() + 2 * m * q;
      const int64_t from = q * part + at, v = valid(from, m);
      std::fill(piece, piece + 2 * m, 0.0f);
      if (v > 0) {
        c.memory->read(piece, sum + from * 4, v * 4);
        if (paired)
          c.memory->read(piece + m, err + from * 4, v * 4);
      }
      sends.push_back({static_cast<int>(q), piece, 2 * m * 4});
      recvs.push_back({static_cast<int>(q), all.data() + 2 * m * q, 2 * m * 4});
    }
    c.comm->exchange(sends, recvs, group, what);
    cpu::combineCompensated(all.data(), members, m, mine.data(), mine.data() + m);
    if (!paired)
      cpu::addCompensation(mine.data(), mine.data() + m, m);
    if (!gather) {
      write(me, at, m, mine.data());
      continue;
    }
    c.comm->allGather(mine.data(), 2 * m * 4, all.data(), group, what);
    for (int64_t q = 0; q < members; ++q)
      write(q, at, m, all.data() + 2 * m * q);
  }
}

/// ZeRO-2: rows [d k, (d + 1) k) of every member's gradient (the step's
/// first input, the whole logical [R, width]) added into member d's shard of
/// the sum, in member order, a chunk at a time (each member's rows of every
/// shard go to that shard's member: one exchange). With the shard's error
/// buffer, a compensated sum (cpu::accumulate's TwoSum); without it, the
/// shard and the members' rows added with compensation and rounded once.
/// A gradient with its error (gradient_error, in[1]: a compensated sum of its own) sends
/// both; each member's error is added to the shard's after its gradient.
/// (Host staging: the train program's gradients in device memory.)
void reduceScatterState(const Context &c, const PlanStep &s, const std::vector<int> &group,
                        const std::string &what) {
  const bool withError = s.gradientError;
  const size_t first = withError ? 2 : 1; // the shard's input
  const PlanBuffer &shard = c.program->buffers[s.in[first]];
  const int64_t n = shard.rows * shard.width, total = shard.logicalRows * shard.width;
  const int64_t members = static_cast<int64_t>(group.size());
  const bool paired = s.in.size() == first + 2;
  const int64_t parts = withError ? 2 : 1; // per member: its rows (and their errors)
  constexpr int64_t kChunk = int64_t(1) << 18; // values
  const int64_t chunk = std::min(n, kChunk);
  std::vector<float> out(static_cast<size_t>(parts * chunk * members)),
      in(static_cast<size_t>(parts * chunk * members)), sum(static_cast<size_t>(chunk)),
      err(static_cast<size_t>(chunk));
  char *g = bytesOf(c, s.in[0]), *ge = withError ? bytesOf(c, s.in[1]) : nullptr,
       *sums = bytesOf(c, s.in[first]), *errs = paired ? bytesOf(c, s.in[first + 1]) : nullptr;
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t m = std::min(chunk, n - at);
    std::vector<Comm::Piece> sends, recvs;
    for (int64_t q = 0; q < members; ++q) {
      // Member q's shard: elements [q n + at, q n + at + m) of the gradient
      // (zeros past its end), then as many of its error.
      float *piece = out.data() + parts * q * m;
      const int64_t from = q * n + at, valid = std::clamp<int64_t>(total - from, 0, m);
      for (int64_t p = 0; p < parts; ++p) {
        std::fill(piece + p * m + valid, piece + (p + 1) * m, 0.0f);
        if (valid > 0)
          c.memory->read(piece + p * m, (p == 0 ? g : ge) + from * 4, valid * 4);
      }
      sends.push_back({static_cast<int>(q), piece, parts * m * 4});
      recvs.push_back({static_cast<int>(q), in.data() + parts * q * m, parts * m * 4});
    }
    c.comm->exchange(sends, recvs, group, what);
    c.memory->read(sum.data(), sums + at * 4, m * 4);
    if (paired)
      c.memory->read(err.data(), errs + at * 4, m * 4);
    else
      std::fill(err.begin(), err.begin() + m, 0.0f);
    for (int64_t q = 0; q < members; ++q) {
      const float *rows = in.data() + parts * q * m;
      cpu::accumulate(rows, sum.data(), err.data(), m);
      if (withError)
        for (int64_t i = 0; i < m; ++i)
          err[i] += rows[m + i];
    }
    if (!paired)
      cpu::addCompensation(sum.data(), err.data(), m);
    c.memory->copy2d(sums + at * 4, m * 4, sum.data(), m * 4, m * 4, 1);
    if (paired)
      c.memory->copy2d(errs + at * 4, m * 4, err.data(), m * 4, m * 4, 1);
  }
}

/// A weight gathered whole, in place, over the group (ZeRO-1): member q
/// updated rows [q k, (q + 1) k) of its state view (elements as rows of the
/// last dimension), k = shard_rows; each member's rows go to every member a
/// chunk at a time. (Host weights: optimizer programs run on the CPU.)
void allGatherWeight(const Context &c, const PlanStep &s, const std::vector<int> &group,
                     const std::string &what) {
  const PlanWeight &w = c.program->weights[s.weights[0]];
  const std::vector<WeightPart> parts =
      c.weightParts ? c.weightParts(s.weights[0]) : std::vector<WeightPart>();
  if (parts.empty())
    runtimeError("rank {}: {}: the device does not hold '{}' in host memory", c.rank, what,
                 w.name);
  const int64_t size = w.dtype == DType::BF16 ? 2 : 4, shard = s.shardRows * w.shape.back();
  int64_t total = 0;
  for (const WeightPart &p : parts)
    total += p.elements;
  // Elements [from, from + n) of the weight (clipped to its end) to / from `at`.
  auto copy = [&](int64_t from, int64_t n, char *at, bool out) {
    int64_t offset = 0;
    for (const WeightPart &p : parts) {
      const int64_t a = std::max(from, offset), b = std::min(from + n, offset + p.elements);
      if (a < b) {
        char *weight = p.data + (a - offset) * size, *buffer = at + (a - from) * size;
        if (out)
          std::memcpy(buffer, weight, static_cast<size_t>((b - a) * size));
        else
          std::memcpy(weight, buffer, static_cast<size_t>((b - a) * size));
      }
      offset += p.elements;
    }
  };
  const int64_t members = static_cast<int64_t>(group.size());
  const int64_t me = std::find(group.begin(), group.end(), static_cast<int>(c.rank)) - group.begin();
  constexpr int64_t kChunk = int64_t(1) << 18; // values
  const int64_t chunk = std::min(shard, kChunk);
  std::vector<char> mine(static_cast<size_t>(chunk * size)),
      all(static_cast<size_t>(chunk * size * members));
  for (int64_t at = 0; at < shard; at += chunk) {
    const int64_t m = std::min(chunk, shard - at);
    std::fill(mine.begin(), mine.end(), char(0));
    copy(me * shard + at, m, mine.data(), /*out=*/true);
    c.comm->allGather(mine.data(), m * size, all.data(), group, what);
    for (int64_t q = 0; q < members; ++q)
      if (q != me && q * shard + at < total)
        copy(q * shard + at, m, all.data() + q * m * size, /*out=*/false);
  }
}

/// Member q's [rows, w] block becomes columns [q w, (q + 1) w) of the
/// output [rows, n w].
void allGather(const Context &c, const PlanStep &s, int64_t rows,
               const std::vector<int> &group, const std::string &what) {
  const int64_t n = static_cast<int64_t>(group.size()), w = widthOf(c, s.in[0]) * 4;
  char *all = static_cast<char *>(c.gatherStage(n * rows * w));
  c.comm->allGather(c.address(s.in[0]), rows * w, all, group, what);
  if (rows > 0)
    for (int64_t q = 0; q < n; ++q)
      c.memory->copy2d(bytesOf(c, s.out[0]) + q * w, n * w, all + q * rows * w, w, w, rows);
}

/// The counts first (El per member), then each expert's counted rows: what
/// member q sent for its expert slot e lands in rows e * C of the output, its
/// counts in counts'. Counts outside [0, C] end the step with an error.
int64_t allToAll(const Context &c, const PlanStep &s, const std::vector<int> &group,
                 const std::string &what) {
  const int64_t n = static_cast<int64_t>(group.size()), E = widthOf(c, s.in[1]), El = E / n;
  const int64_t C = c.program->buffers[s.in[0]].rows / E, H = widthOf(c, s.in[0]) * 4;
  char *counts = bytesOf(c, s.in[1]), *countsOut = bytesOf(c, s.out[1]);
  std::vector<Comm::Piece> sends, recvs;
  for (int64_t q = 0; q < n; ++q) {
    sends.push_back({static_cast<int>(q), counts + q * El * 4, El * 4});
    recvs.push_back({static_cast<int>(q), countsOut + q * El * 4, El * 4});
  }
  c.comm->exchange(sends, recvs, group, what);

  std::vector<int32_t> sent(static_cast<size_t>(E)), received(static_cast<size_t>(E));
  c.memory->read(sent.data(), counts, E * 4);
  c.memory->read(received.data(), countsOut, E * 4);
  for (int64_t e = 0; e < E; ++e) {
    if (sent[e] < 0 || sent[e] > C)
      runtimeError("rank {}: {}: {} rows to send for an expert of capacity {}", c.rank, what,
                   sent[e], C);
    if (received[e] < 0 || received[e] > C)
      runtimeError("rank {}: {}: rank {} sent {} rows for an expert of capacity {}", c.rank,
                   what, group[e / El], received[e], C);
  }
  sends.clear();
  recvs.clear();
  char *in = bytesOf(c, s.in[0]), *out = bytesOf(c, s.out[0]);
  int64_t most = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int member = static_cast<int>(e / El);
    if (sent[e] > 0)
      sends.push_back({member, in + e * C * H, sent[e] * H});
    if (received[e] > 0)
      recvs.push_back({member, out + e * C * H, received[e] * H});
    most = std::max<int64_t>(most, received[e]);
  }
  c.comm->exchange(sends, recvs, group, what);
  return most;
}

} // namespace

/// A training program's collective in messages: "update 3, micro-batch 2:
/// train program step 75 (reduce_scatter over dp)" (the phase the caller
/// set, Context::phase).
std::string trainingStep(const Context &c, size_t index, const PlanStep &s) {
  const std::string step = fmt::format("{} program {}", c.program->entry, describe(index, s));
  return c.phase && !c.phase->empty() ? *c.phase + ": " + step : step;
}

std::string describe(size_t index, const PlanStep &step) {
  if (step.op->has(OpDef::InGroup))
    return fmt::format("step {} ({} over {})", index, step.op->name, axisName(step.group.axis));
  return fmt::format("step {} ({})", index, step.op->name);
}

std::vector<std::vector<int>> groupsOf(const Plan &plan, int64_t rank,
                                       const PlanProgram &program) {
  std::vector<std::vector<int>> groups(program.steps.size());
  for (size_t i = 0; i < program.steps.size(); ++i) {
    if (program.steps[i].op->has(OpDef::InGroup))
      groups[i] = plan.groupOf(rank, program.steps[i].group);
  }
  return groups;
}

/// A step in messages: in a training program with its update and
/// micro-batch (trainingStep), else "step N (op over axis)".
std::string named(const Context &c, size_t index, const PlanStep &s) {
  return c.phase && !c.phase->empty() ? trainingStep(c, index, s) : describe(index, s);
}

int64_t run(const Context &c, size_t index, const PlanStep &s, int64_t rows) {
  switch (s.op->collective) {
  case Collective::AllReduce:
    // (A weight gradient computed in parts too: every member gets the same
    // bits, so the weights it updates stay the same on every member.)
    if ((!c.program->buffers[s.in[0]].state.empty() && !c.program->buffers[s.in[0]].kept()) ||
        s.in.size() == 2 || s.elements > 0) {
      const PlanBuffer &in = c.program->buffers[s.in[0]];
      const int64_t members = static_cast<int64_t>(c.groups.at(index).size());
      const int64_t part = (in.rows * in.width + members - 1) / members;
      if (s.out[0] != s.in[0]) // (added in place on the output)
        c.memory->copy2d(c.address(s.out[0]), in.rows * in.width * 4,
                         c.address(s.in[0]), in.rows * in.width * 4, in.rows * in.width * 4, 1);
      addInFixedOrder(c, s, c.groups.at(index), trainingStep(c, index, s), part,
                      /*gather=*/true);
    } else {
      allReduce(c, s, rows, c.groups.at(index), named(c, index, s));
    }
    return -1;
  case Collective::AllGather:
    if (!s.weights.empty())
      allGatherWeight(c, s, c.groups.at(index),
                      trainingStep(c, index, s));
    else
      allGather(c, s, rows, c.groups.at(index), named(c, index, s));
    return -1;
  case Collective::AllToAll:
    return allToAll(c, s, c.groups.at(index), named(c, index, s));
  case Collective::ReduceScatter:
    if (s.in.size() == s.out.size()) // ZeRO-1's, in place
      addInFixedOrder(c, s, c.groups.at(index), trainingStep(c, index, s),
                      s.shardRows * c.program->buffers[s.in[0]].width, /*gather=*/false);
    else
      reduceScatterState(c, s, c.groups.at(index), trainingStep(c, index, s));
    return -1;
  case Collective::Send:
  case Collective::Recv: {
    // The pipeline: activations go to the rank with the same dp and tp on
    // the next stage (a pipelined backward's gradients to the one before).
    const bool sending = s.op->collective == Collective::Send;
    const int peer = peerOf(c, s);
    const int64_t id = sending ? s.in[0] : s.out[0];
    const int64_t bytes = transferBytes(c, id, rows);
    // (In training, what the rank is doing: "update 3, micro-batch 2
    // (backward)".)
    const std::string what =
        (c.phase && !c.phase->empty() ? *c.phase + ": " : std::string()) +
        fmt::format("step {} ({} rank {})", index, sending ? "send to" : "recv from", peer);
    if (sending)
      c.comm->send(c.address(id), bytes, peer, what);
    else
      c.comm->recv(c.address(id), bytes, peer, what);
    return -1;
  }
  default:
    runtimeError("{}: not a collective", describe(index, s));
  }
}

} // namespace moert::collectives
