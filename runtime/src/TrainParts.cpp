// A training run's weights held in parts (TrainParts.h).
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

/// Copies box `shape` between a [rows, cols] part (from its origin) and the
/// whole [wholeRows, wholeCols] at `offset` (1-D: one row).
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
  if (plan.degrees.ep > 1 && w.experts > 0) {
    kind_ = Kind::Experts;
    whole_.experts = w.experts * plan.degrees.ep;
    whole_.shape[0] = whole_.experts;
    return;
  }
  if (plan.degrees.tp <= 1 || w.experts > 0 || !plan.layout)
    return;
  const PlanSlice *s = plan.layout->slice(rank, w.name);
  if (!s || s->shape == s->globalShape)
    return;
  if (w.shape.size() > 2)
    runtimeError("'{}': training a {}-D weight split over tp: not supported", w.name,
                 w.shape.size());
  kind_ = Kind::Tensor;
  whole_.shape = s->globalShape;
}

void WeightParts::gather(Comm &comm, const std::string &what, const std::vector<float> &own,
                         std::vector<float> &whole) const {
  const bool experts = kind_ == Kind::Experts;
  const std::vector<int> group = plan_.groupOf(
      rank_, experts ? CollectiveGroup{CollectiveGroup::Mesh::Experts, CollectiveGroup::Axis::EP}
                     : CollectiveGroup{CollectiveGroup::Mesh::Attention, CollectiveGroup::Axis::TP});
  std::vector<float> all(own.size() * group.size());
  comm.allGather(own.data(), static_cast<int64_t>(own.size()) * 4, all.data(), group,
                 fmt::format("the parts of '{}'", what));
  if (experts) { // member q holds experts [q El, (q + 1) El): consecutive
    whole = std::move(all);
    return;
  }
  // Each member's slice (PlanLayout) from the origin of its part.
  whole.assign(static_cast<size_t>(numel(whole_.shape)), 0.0f);
  for (size_t q = 0; q < group.size(); ++q) {
    const PlanSlice *s = plan_.layout->slice(group[q], own_.name);
    const float *from = all.data() + q * own.size();
    forBox(own_.shape, whole_.shape, s->offset, s->shape,
           [&](int64_t at, int64_t to, int64_t n) { std::copy_n(from + at, n, whole.data() + to); });
  }
}

std::vector<float> WeightParts::part(const std::vector<float> &whole) const {
  if (kind_ == Kind::Whole)
    return whole;
  const size_t n = static_cast<size_t>(numel(own_.shape));
  if (kind_ == Kind::Experts) {
    const size_t member = static_cast<size_t>(plan_.ranks.at(rank_).coords.ep);
    return std::vector<float>(whole.begin() + member * n, whole.begin() + (member + 1) * n);
  }
  std::vector<float> own(n, 0.0f);
  const PlanSlice *s = plan_.layout->slice(rank_, own_.name);
  forBox(own_.shape, whole_.shape, s->offset, s->shape,
         [&](int64_t at, int64_t to, int64_t count) {
           std::copy_n(whole.data() + to, count, own.data() + at);
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
