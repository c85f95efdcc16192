// Reading input files that a user names: only regular files (a FIFO would
// block open() forever, a device such as /dev/zero never ends), of bounded
// size, and JSON of bounded nesting. Internal to the runtime.
#ifndef MOERT_SRC_INPUTFILE_H
#define MOERT_SRC_INPUTFILE_H

#include <cstdint>
#include <string>
#include <string_view>

namespace moert {

/// InputError naming `path` unless it is (a link to) a regular file.
void checkRegularFile(const std::string &path);

/// The whole of `path`, a regular file of at most `maxBytes` (`what` names
/// the kind of file in the size error, e.g. "a plan").
std::string readInputFile(const std::string &path, uint64_t maxBytes, const char *what);

/// InputError naming `path` when `text` nests arrays and objects deeper than
/// kMaxJsonDepth (JSON parsers and destructors recurse).
constexpr int kMaxJsonDepth = 256;
void checkJsonDepth(const std::string &text, const std::string &path);

/// Writes `head` then `body` to `path` atomically: a temporary file beside
/// it, fsync, rename; nothing is left behind on failure (InputError naming
/// the path).
void writeFileAtomically(const std::string &path, std::string_view head,
                         std::string_view body = {});

/// A fresh directory of this process under $TMPDIR (or /tmp), named
/// `prefix`-XXXXXX (RuntimeError when it cannot be made).
std::string temporaryDirectory(const std::string &prefix);

} // namespace moert

#endif // MOERT_SRC_INPUTFILE_H
