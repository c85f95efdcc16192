// Errors of the runtime. The runtime never aborts on bad input: it throws
// InputError (a bad plan, checkpoint, token id, option: exit code 2) and the
// tool's main prints the message. Internal failures throw RuntimeError
// (exit code 1).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moert {

struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Bad input: the message names the file, tensor, field or option.
struct InputError : RuntimeError {
  using RuntimeError::RuntimeError;
};

template <typename... Args>
[[noreturn]] void inputError(fmt::format_string<Args...> format, Args &&...args) {
  throw InputError(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void runtimeError(fmt::format_string<Args...> format, Args &&...args) {
  throw RuntimeError(fmt::format(format, std::forward<Args>(args)...));
}

} // namespace moert
