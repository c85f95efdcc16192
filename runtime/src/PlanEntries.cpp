// A plan's entries and its schedule (docs/plan-format.md: programs, entry,
// schedule), read for Plan::load once its programs are read.
#include "PlanReaders.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace moert {

namespace {

/// "pipeline_schedule": per stage, each micro-batch of a replica's share
/// of an update once forward ("F<j>") and, later, once backward ("B<j>");
/// "+" fuses a step's receives with the sends of the step before.
void readPipelineSchedule(const JsonFields &r, Plan &plan) {
  const nlohmann::json &stages = r.array("pipeline_schedule");
  if (static_cast<int64_t>(stages.size()) != plan.degrees.pp)
    r.fail("pipeline_schedule", fmt::format("{} stages for pp = {}", stages.size(),
                                            plan.degrees.pp));
  int64_t micro = 0;
  for (const PlanProgram &p : plan.programs)
    if (p.entry == "optimizer")
      micro = p.microBatches / std::max<int64_t>(plan.degrees.dp, 1);
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::string where = fmt::format("pipeline_schedule[{}]", s);
    if (!stages[s].is_array())
      r.fail(where, "expected a list of steps");
    std::vector<Plan::PipelineStep> steps;
    std::vector<int> seen(static_cast<size_t>(micro), 0); // 1: forward, 2: and backward
    for (const nlohmann::json &step : stages[s]) {
      std::string text = step.is_string() ? step.get<std::string>() : "";
      Plan::PipelineStep p;
      p.fused = !text.empty() && text[0] == '+';
      if (p.fused)
        text.erase(0, 1);
      p.backward = !text.empty() && text[0] == 'B';
      int64_t j = -1;
      if (text.size() > 1 && (text[0] == 'F' || text[0] == 'B') &&
          text.find_first_not_of("0123456789", 1) == std::string::npos && text.size() < 10)
        j = std::stoll(text.substr(1));
      if (j < 0 || j >= micro)
        r.fail(where, fmt::format("step {}: expected F<j>, B<j> (or with '+') for a micro-batch "
                                  "j below {}",
                                  step.dump(), micro));
      int &state = seen[static_cast<size_t>(j)];
      if (state != (p.backward ? 1 : 0))
        r.fail(where, fmt::format("step {}: each micro-batch runs forward once, then backward "
                                  "once",
                                  step.dump()));
      ++state;
      p.microBatch = j;
      steps.push_back(p);
    }
    if (std::count(seen.begin(), seen.end(), 2) != micro)
      r.fail(where, fmt::format("expected every one of the {} micro-batches forward and backward",
                                micro));
    plan.pipelineSchedule.push_back(std::move(steps));
  }
}

} // namespace

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
  plan.optimizer = entries.size() >= 2 && entries[1] == "optimizer";
  if (std::find(entries.begin(), entries.end(), "optimizer") != entries.end() &&
      !(plan.training && plan.optimizer))
    r.fail("programs", "an optimizer program is the second entry of a training plan");
  // A pipelined one: each stage's forward program beside its backward one.
  const bool pipelined = plan.training && plan.degrees.pp > 1;
  if (pipelined && !(plan.optimizer && entries.size() == 3 && entries[2] == "train_forward"))
    r.fail("programs", "a training plan over pipeline stages has the train (backward), "
                       "optimizer and train_forward entries");
  if (plan.training && entries.size() > 1 + plan.optimizer + pipelined)
    r.fail("programs", fmt::format("a train program beside entry '{}' (a training plan has "
                                   "the train and optimizer entries)",
                                   entries[1 + plan.optimizer]));
  if (!plan.training && std::find(entries.begin(), entries.end(), "train_forward") != entries.end())
    r.fail("programs", "a train_forward program in a plan that does not train");
  if (r.has("pipeline_schedule") != pipelined)
    r.fail("pipeline_schedule", pipelined ? "missing: a pipelined training plan's order of "
                                            "steps"
                                          : "only a training plan over pipeline stages has one");
  if (pipelined)
    readPipelineSchedule(r, plan);
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

int64_t Plan::stashSlots(int64_t stage) const {
  if (stage < 0 || stage >= static_cast<int64_t>(pipelineSchedule.size()))
    return 1;
  int64_t held = 0, most = 1;
  for (const PipelineStep &s : pipelineSchedule[static_cast<size_t>(stage)]) {
    held += s.backward ? -1 : 1;
    most = std::max(most, held);
  }
  return most;
}

} // namespace moert
