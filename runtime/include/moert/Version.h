// moert: the MoE runtime. No MLIR, no LLVM: the plan is its only input from
// the compiler.
#pragma once

namespace moert {

/// The runtime's version, printed by `moert --version`.
const char *version();

} // namespace moert
