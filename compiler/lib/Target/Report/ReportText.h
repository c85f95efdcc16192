//===- ReportText.h - numbers and names as a plan report prints them -*- C++ -*-===//
#ifndef MOE_LIB_TARGET_REPORT_REPORTTEXT_H
#define MOE_LIB_TARGET_REPORT_REPORTTEXT_H

#include "ReportModel.h"

#include "llvm/ADT/StringRef.h"

#include <string>
#include <vector>

namespace moe::report {

/// `s` with & < > " escaped for HTML.
std::string escape(llvm::StringRef s);
/// Bytes as GiB (MiB below 0.1 GiB), milliseconds, a percentage, a number
/// with thousands separators.
std::string gib(int64_t bytes);
std::string ms(double seconds);
std::string percent(double x);
std::string thousands(double v);
/// Sorted distinct ranks as "0-3,8,10-11", an arithmetic progression of
/// three or more with a stride > 1 as "0-2016:32" (every 32nd from 0 to 2016).
std::string ranges(std::vector<int64_t> v);
/// "dp 0, pp 0, tp 1, ep 0, etp 0".
std::string coordsText(const Rank &k);

} // namespace moe::report

#endif // MOE_LIB_TARGET_REPORT_REPORTTEXT_H
