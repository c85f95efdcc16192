//===- ReportText.cpp - numbers and names as a plan report prints them ----===//
#include "ReportText.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

using namespace llvm;

namespace moe::report {

std::string escape(StringRef s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    default: out += c;
    }
  }
  return out;
}

std::string gib(int64_t bytes) {
  const double g = static_cast<double>(bytes) / (1024.0 * 1024 * 1024);
  if (g >= 10)
    return formatv("{0:f1} GiB", g).str();
  if (g >= 0.1)
    return formatv("{0:f2} GiB", g).str();
  return formatv("{0:f1} MiB", static_cast<double>(bytes) / (1024.0 * 1024)).str();
}

std::string ms(double seconds) { return formatv("{0:f2} ms", seconds * 1e3).str(); }

std::string percent(double x) { return formatv("{0:f0}%", x * 100).str(); }

std::string thousands(double v) {
  std::string digits = formatv("{0:f0}", v).str(), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-')
      out += ',';
    out += digits[i];
  }
  return out;
}

std::string ranges(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  if (v.size() >= 3 && v[1] - v[0] > 1) {
    const int64_t stride = v[1] - v[0];
    bool progression = true;
    for (size_t i = 2; i < v.size() && progression; ++i)
      progression = v[i] - v[i - 1] == stride;
    if (progression)
      return formatv("{0}-{1}:{2}", v.front(), v.back(), stride).str();
  }
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1)
      ++j;
    out += (out.empty() ? "" : ",") + std::to_string(v[i]);
    if (j > i)
      out += "-" + std::to_string(v[j]);
    i = j + 1;
  }
  return out;
}

std::string coordsText(const Rank &k) {
  return formatv("dp {0}, pp {1}, tp {2}, ep {3}, etp {4}", k.dp, k.pp, k.tp, k.ep, k.etp).str();
}

} // namespace moe::report
