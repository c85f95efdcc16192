#include "Progress.h"

#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>

namespace moert {
namespace {

std::string bytesText(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string secondsText(double s) {
  if (s < 60)
    return fmt::format("{:.0f}s", s);
  if (s < 3600)
    return fmt::format("{:.0f}m{:02.0f}s", s / 60 - 0.5, std::fmod(s, 60.0));
  return fmt::format("{:.0f}h{:02.0f}m", s / 3600 - 0.5, std::fmod(s / 60, 60.0));
}

} // namespace

Progress::Progress(std::string label, uint64_t totalBytes, bool show, std::string unit)
    : label(std::move(label)), unit(std::move(unit)), total(totalBytes) {
  start = last = std::chrono::steady_clock::now();
  const char *env = std::getenv("MOERT_PROGRESS");
  if (!show || (env && !std::strcmp(env, "0")))
    mode = Mode::Off;
  else if (env && !std::strcmp(env, "1"))
    mode = Mode::Lines;
  else if (::isatty(STDERR_FILENO))
    mode = Mode::Bar;
}

Progress::~Progress() {
  try {
    finish();
  } catch (...) {
  }
}

void Progress::add(uint64_t bytes) {
  done += bytes;
  if (mode == Mode::Off)
    return;
  auto now = std::chrono::steady_clock::now();
  double sinceLast = std::chrono::duration<double>(now - last).count();
  double sinceStart = std::chrono::duration<double>(now - start).count();
  if (mode == Mode::Bar ? (sinceLast >= 0.2 && sinceStart >= 0.5) : sinceLast >= 1.0) {
    last = now;
    print(false);
  }
}

void Progress::finish() {
  if (finished)
    return;
  finished = true;
  // A bar appears only for operations long enough to show one.
  if (mode == Mode::Lines || (mode == Mode::Bar && printed))
    print(true);
}

void Progress::print(bool final) {
  double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  double fraction = total ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1;
  std::string left = final ? fmt::format("in {}", secondsText(elapsed))
                     : rate > 0 ? fmt::format("{} left",
                                              secondsText(static_cast<double>(total - std::min(done, total)) / rate))
                                : std::string("? left");
  std::string figures =
      unit.empty()
          ? fmt::format("{} / {} ({:.0f}%), {}/s, {}", bytesText(static_cast<double>(done)),
                        bytesText(static_cast<double>(total)), 100 * fraction, bytesText(rate),
                        left)
          : fmt::format("{} / {} {} ({:.0f}%), {:.2f} {}/s, {}", done, total, unit,
                        100 * fraction, rate, unit, left);
  if (mode == Mode::Bar) {
    constexpr int kWidth = 30;
    int filled = static_cast<int>(fraction * kWidth);
    fmt::print(stderr, "\r\033[Kmoert: {} [{}{}] {}{}", label, std::string(filled, '#'),
               std::string(kWidth - filled, '.'), figures, final ? "\n" : "");
  } else {
    fmt::print(stderr, "moert: {}: {}\n", label, figures);
  }
  std::fflush(stderr);
  printed = true;
}

} // namespace moert
