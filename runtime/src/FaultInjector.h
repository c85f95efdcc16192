// MOERT_FAULT (tests only; runtime/src/Comm.cpp's header comment): a
// communicator counts each of its rank's communication calls and, at the
// chosen one, kills or stalls that rank.
#pragma once

#include "moert/Error.h"

#include <fmt/core.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace moert {

class FaultInjector {
public:
  /// Parses MOERT_FAULT; InputError when it is set but malformed.
  FaultInjector() {
    const char *env = std::getenv("MOERT_FAULT");
    if (!env || !*env)
      return;
    std::string text(env);
    auto bad = [&]() {
      inputError("MOERT_FAULT: expected kill:RANK:CALL or stall:RANK:CALL (CALL >= 1) but got '{}'",
                 text);
    };
    size_t a = text.find(':');
    size_t b = a == std::string::npos ? a : text.find(':', a + 1);
    if (b == std::string::npos)
      bad();
    std::string kind = text.substr(0, a);
    if (kind == "kill")
      action = Action::Kill;
    else if (kind == "stall")
      action = Action::Stall;
    else
      bad();
    char *end;
    std::string r = text.substr(a + 1, b - a - 1), n = text.substr(b + 1);
    rank = std::strtol(r.c_str(), &end, 10);
    if (r.empty() || *end || rank < 0)
      bad();
    call = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end || call < 1)
      bad();
  }

  /// Counts one communication call of world rank `me`.
  void tick(int me, const std::string &what) {
    if (action == Action::None || me != rank || ++calls != call)
      return;
    fmt::print(stderr, "moert: fault injection: rank {} {} at communication call {} ({})\n", me,
               action == Action::Kill ? "raises SIGKILL" : "stalls", call, what);
    std::fflush(stderr);
    if (action == Action::Kill)
      std::raise(SIGKILL);
    for (;;)
      ::sleep(3600);
  }

private:
  enum class Action { None, Kill, Stall } action = Action::None;
  long rank = -1, call = 0, calls = 0;
};

} // namespace moert
