// The integrity seal of plan files (moert/PlanSeal.h).
#include "moert/PlanSeal.h"
#include "moert/Error.h"
#include "moe/PlanSchema.h"

#include <fmt/format.h>

namespace moert {
namespace {
// The seal's spelling is the plan schema's (moe/PlanSchema.h).
using moe::plan::kSealPrefix;
using moe::plan::kSealSize;
constexpr size_t kPrefixSize = moe::plan::kSealPrefixSize;
} // namespace

uint64_t fnv1a64(const char *data, size_t size) { return moe::plan::fnv1a64(data, size); }

std::string sealPlanText(const std::string &text) {
  const size_t brace = text.rfind('}');
  if (brace == std::string::npos)
    runtimeError("sealPlanText: not a JSON object");
  const uint64_t h = fnv1a64(text.data(), text.size());
  return text.substr(0, brace) + fmt::format("{}{:016x}\"", kSealPrefix, h) + text.substr(brace);
}

void checkPlanSeal(const std::string &text, const std::string &path) {
  const size_t brace = text.rfind('}');
  const size_t at = brace == std::string::npos || brace < kSealSize ? std::string::npos
                                                                    : brace - kSealSize;
  if (at == std::string::npos || text.compare(at, kPrefixSize, kSealPrefix) != 0 ||
      text[brace - 1] != '"')
    inputError("{}: the plan has no integrity seal (write it with moec compile; a plan "
               "edited by hand is not run)",
               path);
  const std::string digits = text.substr(at + kPrefixSize, 16);
  std::string rest = text.substr(0, at) + text.substr(brace);
  const std::string want = fmt::format("{:016x}", fnv1a64(rest.data(), rest.size()));
  if (digits != want)
    inputError("{}: the plan does not match its integrity seal (damaged, or edited after "
               "moec wrote it): compile it again",
               path);
}

} // namespace moert
