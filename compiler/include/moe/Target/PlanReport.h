//===- PlanReport.h - a plan as one HTML page -------------------*- C++ -*-===//
//
// `moec report PLAN -o report.html` (and `moec compile ... --report FILE`):
// one self-contained HTML page (inline SVG and CSS, no script, no network)
// drawn from the plan and the planner's search it carries: the device mesh
// and its axes, expert placement, memory per rank against the device,
// step time per stage, the layouts considered and why the others were
// rejected, vocabulary padding and checkpoint slices; with `moert run
// --report-json` figures, what was measured beside what was predicted.
// docs/plan-report.md.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TARGET_PLANREPORT_H
#define MOE_TARGET_PLANREPORT_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace moe {

/// Writes the report of the plan at `planPath` to `outPath` (atomically);
/// `measuredPath` (may be empty) is a `moert run --report-json` file.
/// Errors name the file and field.
llvm::Error writePlanReport(llvm::StringRef planPath, llvm::StringRef measuredPath,
                            llvm::StringRef outPath);

} // namespace moe

#endif // MOE_TARGET_PLANREPORT_H
