// What the host communicators share (Comm.cpp: MPI's; InProcessComm.cpp:
// threads'): their checks of a call's ranks, the messages that end a job,
// and MOERT_FAULT (tests only; Comm.cpp's header comment), which counts
// each of a rank's communication calls and, at the chosen one, kills or
// stalls that rank.
#pragma once

#include "moert/Comm.h"
#include "moert/Error.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

/// Member index of `me` in `group` (world ranks); RuntimeError naming
/// `what` when the group repeats a rank, leaves the world of `size` or
/// lacks `me`.
inline int memberIndex(const std::vector<int> &group, int me, int size, const std::string &what) {
  std::vector<int> sorted = group;
  std::sort(sorted.begin(), sorted.end());
  auto at = std::find(group.begin(), group.end(), me);
  if (group.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      sorted.front() < 0 || sorted.back() >= size || at == group.end())
    runtimeError("{}: rank {} of {} is asked for a collective over ranks {}", what, me, size,
                 fmt::join(group, ","));
  return static_cast<int>(at - group.begin());
}

/// RuntimeError naming `what` unless `peer` is another rank of the world.
/// The all_gather that needs no peer, every communicator's: nothing to
/// move, or a group of one (its own block copied to `out`; `in` may be
/// `out`). True when that was all.
inline bool allGatherWithoutPeers(const void *in, int64_t bytes, void *out, size_t members) {
  if (bytes > 0 && members == 1 && in != out)
    std::memmove(out, in, static_cast<size_t>(bytes));
  return bytes <= 0 || members == 1;
}

/// An exchange's pieces, every communicator's check: each with a member of
/// the group of `members` and a size >= 0 (RuntimeError naming `what`).
inline void checkPieces(const std::vector<Comm::Piece> &sends,
                        const std::vector<Comm::Piece> &recvs, int members,
                        const std::string &what) {
  for (const std::vector<Comm::Piece> *list : {&sends, &recvs})
    for (const Comm::Piece &p : *list)
      if (p.member < 0 || p.member >= members || p.bytes < 0)
        runtimeError("{}: exchange piece of {} bytes with member {} of a group of {}", what,
                     p.bytes, p.member, members);
}

inline void checkPeer(int peer, int me, int size, const std::string &what) {
  if (peer < 0 || peer >= size || peer == me)
    runtimeError("{}: point-to-point with rank {} from rank {} of {}", what, peer, me, size);
}

/// `moert: error: rank R: <message>` on stderr, after what stdout holds.
inline void printRankError(int rank, const std::string &message) {
  std::fflush(stdout);
  fmt::print(stderr, "moert: error: rank {}: {}\n", rank, message);
  std::fflush(stderr);
}

/// A collective that waited past the timeout: `<what> did not complete
/// within S s (group: ranks a,b)`.
inline void printTimedOut(int rank, const std::string &what, double seconds,
                          const std::vector<int> &group) {
  printRankError(rank, fmt::format("{} did not complete within {} s (group: ranks {})", what,
                                   seconds, fmt::join(group, ",")));
}

} // namespace moert
