// A training run's weights held in parts (TrainParts.h). Every part is a
// box of the whole tensor that the plan's layout names (PlanLayout: an
// expert's per rank, or a tensor-parallel weight's), held from the origin
// of the rank's part (a padded part's extra rows come last), so gathering
// is the same for all of them: every rank's part (an all-gather over the
// world; replicas hold the same values) put in its box (copyBoxIn).
#include "TrainParts.h"
#include "moert/Error.h"
#include "moert/PlanLayout.h"
#include "moert/ShardedCheckpoint.h"
#include "moert/Tensor.h"

#include <fmt/format.h>

#include <algorithm>

namespace moert {
namespace {

int64_t numel(const std::vector<int64_t> &shape) {
  return TensorView{DType::F32, shape, nullptr}.numel();
}

} // namespace

WeightParts::WeightParts(const Plan &plan, int rank, const PlanWeight &w)
    : plan_(plan), rank_(rank), own_(w), whole_(w) {
  if (!plan.layout)
    return;
  if (w.experts > 0) {
    if (plan.degrees.ep <= 1 && plan.degrees.etp <= 1)
      return;
    // The stack of every expert, each of the model's shape.
    const PlanSlice *s = plan.layout->slice(rank, w.expertName(firstExpert(rank)));
    if (!s || s->globalShape.size() > 2)
      runtimeError("'{}': training an expert stack split over ep / etp: no 1-D or 2-D slice of "
                   "its experts in the plan's layout",
                   w.name);
    split_ = true;
    whole_.experts = w.experts * plan.degrees.ep;
    whole_.shape.assign(1, whole_.experts);
    whole_.shape.insert(whole_.shape.end(), s->globalShape.begin(), s->globalShape.end());
    return;
  }
  if (plan.degrees.tp <= 1)
    return;
  const PlanSlice *s = plan.layout->slice(rank, w.name);
  if (!s || s->shape == s->globalShape)
    return;
  if (w.shape.size() > 2)
    runtimeError("'{}': training a {}-D weight split over tp: not supported", w.name,
                 w.shape.size());
  split_ = true;
  whole_.shape = s->globalShape;
}

int64_t WeightParts::firstExpert(int rank) const {
  return plan_.ranks.at(rank).coords.ep * own_.experts;
}

void WeightParts::forParts(int rank, const std::function<void(int64_t, int64_t,
                                                                const PlanSlice &)> &box) const {
  if (own_.experts == 0) {
    box(0, 0, *plan_.layout->slice(rank, own_.name));
    return;
  }
  const int64_t partSize = numel({own_.shape.begin() + 1, own_.shape.end()}),
                wholeSize = numel({whole_.shape.begin() + 1, whole_.shape.end()});
  for (int64_t l = 0; l < own_.experts; ++l) {
    const int64_t e = firstExpert(rank) + l;
    const PlanSlice *s = plan_.layout->slice(rank, own_.expertName(e));
    if (!s)
      runtimeError("'{}': rank {} holds no slice of it in the plan's layout", own_.expertName(e),
                   rank);
    box(l * partSize, e * wholeSize, *s);
  }
}

void WeightParts::gather(Comm &comm, const std::string &what, const std::vector<float> &own,
                         std::vector<float> &whole) const {
  // The ranks of the rank's pipeline stage (all of them without stages).
  std::vector<int> stage;
  for (int r = 0; r < comm.size(); ++r)
    if (plan_.ranks.at(r).coords.pp == plan_.ranks.at(rank_).coords.pp)
      stage.push_back(r);
  std::vector<float> all(own.size() * stage.size());
  comm.allGather(own.data(), static_cast<int64_t>(own.size()) * 4, all.data(), stage,
                 fmt::format("the parts of '{}'", what));
  whole.assign(static_cast<size_t>(numel(whole_.shape)), 0.0f);
  for (size_t i = 0; i < stage.size(); ++i) {
    const int r = stage[i];
    const float *from = all.data() + i * own.size();
    forParts(r, [&](int64_t at, int64_t to, const PlanSlice &s) {
      copyBoxIn(reinterpret_cast<const char *>(from + at), s.globalShape, s.offset, s.shape, 4,
                reinterpret_cast<char *>(whole.data() + to));
    });
  }
}

std::vector<float> WeightParts::part(const std::vector<float> &whole) const {
  if (!split_)
    return whole;
  std::vector<float> own(static_cast<size_t>(numel(own_.shape)), 0.0f);
  forParts(rank_, [&](int64_t at, int64_t to, const PlanSlice &s) {
    copyBoxOut(reinterpret_cast<const char *>(whole.data() + to), s.globalShape, s.offset,
               s.shape, 4, reinterpret_cast<char *>(own.data() + at));
  });
  return own;
}

const PlanWeight *weightOfState(const PlanProgram &program, const std::string &state) {
  const std::string of = state.substr(state.find(':') + 1);
  for (const PlanWeight &w : program.weights)
    if (w.name == of)
      return &w;
  return nullptr;
}

} // namespace moert
