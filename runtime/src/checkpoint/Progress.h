// Progress of long operations (convert, export, load: bytes; moert train:
// updates) done, rate and time left, on stderr.
//
// - stderr is a terminal: a bar redrawn in place (at most every 0.2 s) and
//   a final line, for operations that take more than 0.5 s;
// - otherwise (pipes, files, test runs) nothing, unless MOERT_PROGRESS=1
//   asks for plain lines: at most one per second and a final one.
// MOERT_PROGRESS=0 turns both off. Only the process that constructs a
// Progress with `show` prints (moert passes rank 0).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace moert {

class Progress {
public:
  /// `unit` empty: the amounts are bytes; else they count `unit`s
  /// ("updates").
  Progress(std::string label, uint64_t totalBytes, bool show = true, std::string unit = {});
  ~Progress();
  void add(uint64_t bytes);
  /// Prints the final line (once; the destructor calls it too).
  void finish();

private:
  enum class Mode { Off, Bar, Lines };
  void print(bool final);
  std::string label, unit;
  uint64_t total, done = 0;
  Mode mode = Mode::Off;
  bool printed = false, finished = false;
  std::chrono::steady_clock::time_point start, last;
};

} // namespace moert
