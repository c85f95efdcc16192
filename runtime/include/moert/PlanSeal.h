// The integrity seal of a plan file (docs/plan-format.md): moec appends
// `,"integrity":"fnv1a64:<16 hex digits>"` before the closing brace of the
// plan's JSON object, the 64-bit FNV-1a hash of every other byte of the file.
// moert refuses a plan whose seal is missing or does not match: an edited
// or damaged plan could otherwise compute another model (a step dropped, a
// weight id swapped) while passing every structural check.
#ifndef MOERT_PLANSEAL_H
#define MOERT_PLANSEAL_H

#include <cstdint>
#include <string>

namespace moert {

/// FNV-1a, 64 bits.
uint64_t fnv1a64(const char *data, size_t size);

/// `text` (a JSON object) with its seal inserted before the last '}'.
std::string sealPlanText(const std::string &text);

/// InputError naming `path` unless `text` ends with a seal that matches the
/// rest of it.
void checkPlanSeal(const std::string &text, const std::string &path);

} // namespace moert

#endif // MOERT_PLANSEAL_H
