// Plan::load's reader of a program's CUDA kernel table (moert/KernelTable.h).
#pragma once

#include "JsonFields.h"
#include "moert/KernelTable.h"
#include "moert/Plan.h"

#include <memory>

namespace moert {

/// The program's "cuda" object, checked field by field against `program`
/// (its steps, buffers, weights and KV caches read already); InputError
/// naming the field.
std::shared_ptr<const KernelTable> readKernelTable(const PlanProgram &program,
                                                   const JsonFields &cuda);

} // namespace moert
