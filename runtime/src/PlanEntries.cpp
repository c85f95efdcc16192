// A plan's entries and its schedule (docs/plan-format.md: programs, entry,
// schedule), read for Plan::load once its programs are read.
#include "PlanReaders.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace moert {

void readEntries(const JsonFields &r, Plan &plan) {
  const std::vector<PlanProgram> &programs = plan.programs;
  const std::string &first = programs[0].entry;
  std::vector<std::string> entries;
  for (size_t i = 0; i < programs.size(); ++i) {
    const PlanProgram &p = programs[i];
    const std::string where = fmt::format("programs[{}]", i);
    if (std::find(entries.begin(), entries.end(), p.entry) == entries.end())
      entries.push_back(p.entry);
    int64_t count = 0;
    const PlanProgram *primary = nullptr;
    for (const PlanProgram &q : programs) {
      count += q.stage == p.stage && q.entry == p.entry;
      if (q.stage == p.stage && q.entry == first && !primary)
        primary = &q;
    }
    if (count != 1)
      r.fail(where, fmt::format("entry '{}' has {} programs of stage {} (expected one)", p.entry,
                                count, p.stage));
    if (!primary)
      r.fail(where, fmt::format("stage {} has no program of the first entry ('{}')", p.stage,
                                first));
    auto sameWeight = [](const PlanWeight &a, const PlanWeight &b) {
      return a.name == b.name && a.shape == b.shape && a.dtype == b.dtype &&
             a.experts == b.experts;
    };
    auto sameCache = [](const PlanCache &a, const PlanCache &b) {
      return a.keyWidth == b.keyWidth && a.valueWidth == b.valueWidth;
    };
    if (!std::equal(p.weights.begin(), p.weights.end(), primary->weights.begin(),
                    primary->weights.end(), sameWeight))
      r.fail(where, fmt::format("its weights differ from those of entry '{}' of stage {} (the "
                                "entries of a stage share them)",
                                first, p.stage));
    if (!std::equal(p.caches.begin(), p.caches.end(), primary->caches.begin(),
                    primary->caches.end(), sameCache))
      r.fail(where, fmt::format("its KV caches differ from those of entry '{}' of stage {} (the "
                                "entries of a stage share them)",
                                first, p.stage));
  }
  for (size_t i = 0; i < programs.size(); ++i)
    if (programs[i].entry == first && i != static_cast<size_t>(programs[i].stage))
      r.fail(fmt::format("programs[{}]", i),
             fmt::format("expected entry '{}''s programs first, stage {} at programs[{}]", first,
                         programs[i].stage, programs[i].stage));
  for (int64_t stage = 0; stage < plan.degrees.pp; ++stage)
    if (std::none_of(programs.begin(), programs.end(),
                     [&](const PlanProgram &p) { return p.stage == stage; }))
      r.fail("programs", fmt::format("no program of stage {}", stage));

  // Every entry has one program per stage.
  for (const std::string &entry : entries) {
    const auto count = std::count_if(programs.begin(), programs.end(),
                                     [&](const PlanProgram &p) { return p.entry == entry; });
    if (count != plan.degrees.pp)
      r.fail("programs", fmt::format("entry '{}' has programs for {} of the {} stages", entry,
                                     count, plan.degrees.pp));
  }

  plan.prefillEntry = plan.decodeEntry = first;
  plan.training = first == "train";
  // A training plan: the train entry and, with moec compile --optimizer,
  // the optimizer entry.
  plan.optimizer = entries.size() == 2 && entries[1] == "optimizer";
  if (std::find(entries.begin(), entries.end(), "optimizer") != entries.end() &&
      !(plan.training && plan.optimizer))
    r.fail("programs", "an optimizer program is the second entry of a training plan");
  if (plan.training && entries.size() > 1 + plan.optimizer)
    r.fail("programs", fmt::format("a train program beside entry '{}' (a training plan has "
                                   "the train and optimizer entries)",
                                   entries[1 + plan.optimizer]));
  if (plan.training) {
    if (r.has("schedule"))
      r.fail("schedule", "a training plan has no generation schedule");
    return;
  }
  if (!r.has("schedule")) {
    if (entries.size() > 1)
      r.fail("schedule", fmt::format("missing: the programs have entries '{}' and '{}'",
                                     entries[0], entries[1]));
    if (first != "forward" && !plan.training)
      r.fail("schedule", fmt::format("missing: no phase runs entry '{}'", first));
    return;
  }
  JsonFields schedule = r.child("schedule");
  schedule.onlyMembers(moe::plan::members::kSchedule);
  std::vector<std::string> used;
  for (auto [phase, entry] : {std::pair<const char *, std::string *>{"prefill", &plan.prefillEntry},
                              {"decode", &plan.decodeEntry}}) {
    *entry = schedule.string(phase);
    if (std::find(entries.begin(), entries.end(), *entry) == entries.end())
      schedule.fail(phase, fmt::format("'{}' is not an entry of the programs", *entry));
    used.push_back(*entry);
  }
  for (const std::string &entry : entries)
    if (std::find(used.begin(), used.end(), entry) == used.end())
      schedule.fail("decode", fmt::format("no phase runs entry '{}'", entry));
}

} // namespace moert
