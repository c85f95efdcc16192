// A training run's weights held in parts (TrainParts.h). Every part is a
// box of the whole tensor that the plan's layout names (PlanLayout: an
// expert's per rank, or a tensor-parallel weight's), so gathering is the
// same for all of them: every rank's part (an all-gather over the world;
// replicas hold the same values) put in its box.
#include "TrainParts.h"
#include "moert/Error.h"
#include "moert/PlanLayout.h"

#include <fmt/format.h>

#include <algorithm>

namespace moert {
namespace {

int64_t numel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// Runs copy(at in the part, at in the whole, count) over the rows of box
/// `shape` at `offset` of a whole of `wholeShape`, the part (of
/// `partShape`) holding it from its origin (1-D: one row).
template <typename Copy>
void forBox(const std::vector<int64_t> &partShape, const std::vector<int64_t> &wholeShape,
            const std::vector<int64_t> &offset, const std::vector<int64_t> &shape, Copy copy) {
  const bool matrix = shape.size() == 2;
  const int64_t rows = matrix ? shape[0] : 1, cols = shape.back();
  const int64_t partCols = partShape.back(), wholeCols = wholeShape.back();
  const int64_t row0 = matrix ? offset[0] : 0, col0 = offset.back();
  for (int64_t r = 0; r < rows; ++r)
    copy(r * partCols, (row0 + r) * wholeCols + col0, cols);
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

void WeightParts::forParts(int rank, const std::function<void(int64_t, int64_t, int64_t)> &copy) const {
  if (own_.experts == 0) {
    const PlanSlice *s = plan_.layout->slice(rank, own_.name);
    forBox(own_.shape, whole_.shape, s->offset, s->shape, copy);
    return;
  }
  const std::vector<int64_t> partExpert(own_.shape.begin() + 1, own_.shape.end()),
      wholeExpert(whole_.shape.begin() + 1, whole_.shape.end());
  const int64_t partSize = numel(partExpert), wholeSize = numel(wholeExpert);
  for (int64_t l = 0; l < own_.experts; ++l) {
    const int64_t e = firstExpert(rank) + l;
    const PlanSlice *s = plan_.layout->slice(rank, own_.expertName(e));
    if (!s)
      runtimeError("'{}': rank {} holds no slice of it in the plan's layout", own_.expertName(e),
                   rank);
    forBox(partExpert, wholeExpert, s->offset, s->shape, [&](int64_t at, int64_t to, int64_t n) {
      copy(l * partSize + at, e * wholeSize + to, n);
    });
  }
}

void WeightParts::gather(Comm &comm, const std::string &what, const std::vector<float> &own,
                         std::vector<float> &whole) const {
  std::vector<int> world(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r)
    world[static_cast<size_t>(r)] = r;
  std::vector<float> all(own.size() * world.size());
  comm.allGather(own.data(), static_cast<int64_t>(own.size()) * 4, all.data(), world,
                 fmt::format("the parts of '{}'", what));
  whole.assign(static_cast<size_t>(numel(whole_.shape)), 0.0f);
  for (int r : world) {
    const float *from = all.data() + static_cast<size_t>(r) * own.size();
    forParts(r, [&](int64_t at, int64_t to, int64_t n) {
      std::copy_n(from + at, n, whole.data() + to);
    });
  }
}

std::vector<float> WeightParts::part(const std::vector<float> &whole) const {
  if (!split_)
    return whole;
  std::vector<float> own(static_cast<size_t>(numel(own_.shape)), 0.0f);
  forParts(rank_, [&](int64_t at, int64_t to, int64_t n) {
    std::copy_n(whole.data() + to, n, own.data() + at);
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
