// Readers of parts of a plan's JSON, for Plan::load (which parses the plan
// once): the distribution (moert/PlanLayout.h) and a program's CUDA kernel
// table (moert/KernelTable.h).
#pragma once

#include "JsonFields.h"
#include "moert/KernelTable.h"
#include "moert/Plan.h"
#include "moert/PlanLayout.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace moert {

/// A plan file read, parsed and checked up to its content: its size limit,
/// JSON depth, a JSON object, format and version, then the integrity seal.
/// InputError naming the file (and field) otherwise. Plan::load and
/// PlanLayout::load (moert convert) both start here.
struct PlanDocument {
  std::string text;
  nlohmann::json root;
};
PlanDocument readPlanDocument(const std::string &path);

/// One entry of a weights list (the plan's or a program's; PlanProgram.cpp):
/// its dtype, expert stack, int8 blocks and bytes checked.
PlanWeight readWeight(const JsonFields &w);
/// programs[index] (PlanProgram.cpp): its weights checked against the
/// plan's logical weights, every step against its buffers and weights.
PlanProgram readProgram(const Plan &plan, const JsonFields &pr, size_t index);

/// The programs' entries (the first program's, one program per stage, then
/// each other entry's) and the schedule that runs them (PlanEntries.cpp): a
/// rank binds its weights once and shares its KV caches between its
/// entries, so the entries of a stage declare the same ones. InputError
/// naming the field.
void readEntries(const JsonFields &r, Plan &plan);

/// The program's "cuda" object, checked field by field against `program`
/// (its steps, buffers, weights and KV caches read already); InputError
/// naming the field.
std::shared_ptr<const KernelTable> readKernelTable(const PlanProgram &program,
                                                   const JsonFields &cuda);

/// A train program's labels (read with the inputs already), loss and
/// gradients (PlanTraining.cpp), checked against its buffers and weights;
/// other programs must have none of them. InputError naming the field.
void readTrainingOutputs(const JsonFields &pr, const JsonFields &inputs, PlanProgram &program,
                         bool last, bool pipelined);
/// An optimizer program's step input, stats and micro_batches
/// (PlanTraining.cpp); refuses them in any other program.
void readOptimizerMembers(const JsonFields &pr, const JsonFields &inputs, PlanProgram &program);

/// The plan's distribution (format and version checked already); InputError
/// naming the field.
PlanLayout readPlanLayout(const JsonFields &top, const std::string &path);

} // namespace moert
