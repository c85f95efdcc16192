// Every rank of a plan in one process (`moert run|train --in-process`): one
// thread per rank, each with a communicator of the plan's world whose
// collectives move data between the threads' buffers (runtime/include/
// moert/Comm.h). The arithmetic is the MPI communicator's: an all_reduce
// adds the members' values in member order, ((v0 + v1) + v2) + ..., as
// MpiComm does for groups of more than two (two values add the same either
// way), so a plan gives the same bits in one process as under mpirun.
//
// A collective is a meeting of its group: each member posts its operand and
// the operation it calls, waits for the others (a barrier), checks that they
// all call the same operation with the same sizes, reads the others'
// operands, and waits again before it returns, so that no member changes a
// buffer another still reads. Sends are buffered (a copy in the pair's
// mailbox); a receive waits for the next message from its peer. A wait
// longer than --collective-timeout ends the process as MpiComm does:
//   moert: error: rank R: <what> did not complete within S s (group: ranks a,b)
// MOERT_FAULT (Comm.cpp) counts each rank's calls here too: kill ends the
// whole process (every rank), stall leaves the others to time out.
#include "moert/Comm.h"
#include "moert/Error.h"

#include "CommShared.h"
#include "InProcessComm.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace moert {
namespace {

/// What the members of one group share.
struct Meeting {
  std::mutex mutex;
  std::condition_variable changed;
  int64_t generation = 0;
  int arrived = 0;
  std::vector<const void *> posts;  ///< per member: its operand
  std::vector<std::string> calls;   ///< per member: the operation and its sizes
};

/// Messages from one rank to another, in order.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::vector<char>> messages;
};

class Hub {
public:
  explicit Hub(int ranks) : ranks(ranks), mailboxes(static_cast<size_t>(ranks) * ranks) {
    for (auto &m : mailboxes)
      m = std::make_unique<Mailbox>();
  }

  const int ranks;

  Meeting &meeting(const std::vector<int> &group) {
    std::lock_guard<std::mutex> lock(mutex);
    std::unique_ptr<Meeting> &m = meetings[group];
    if (!m) {
      m = std::make_unique<Meeting>();
      m->posts.resize(group.size());
      m->calls.resize(group.size());
    }
    return *m;
  }

  Mailbox &mailbox(int from, int to) { return *mailboxes[static_cast<size_t>(from) * ranks + to]; }

private:
  std::mutex mutex;
  std::map<std::vector<int>, std::unique_ptr<Meeting>> meetings;
  std::vector<std::unique_ptr<Mailbox>> mailboxes;
};

class ThreadComm final : public Comm {
public:
  ThreadComm(Hub &hub, int rank) : hub(hub), me(rank) {}

  int rank() const override { return me; }
  int size() const override { return hub.ranks; }
  void prepare(const Plan &) override {}
  void setTimeout(double seconds) override { timeout = seconds; }

  void allReduceSum(float *data, int64_t n, const std::vector<int> &group,
                    const std::string &what) override {
    fault.tick(me, what);
    const int member = memberOf(group, what);
    if (group.size() == 1 || n <= 0)
      return;
    Meeting &m = hub.meeting(group);
    meet(m, member, data, fmt::format("all_reduce of {} values", n), group, what);
    sum.assign(static_cast<const float *>(m.posts[0]),
               static_cast<const float *>(m.posts[0]) + n);
    for (size_t q = 1; q < group.size(); ++q) {
      const float *v = static_cast<const float *>(m.posts[q]);
      for (int64_t i = 0; i < n; ++i)
        sum[i] += v[i];
    }
    barrier(m, group, what); // every member has read every operand
    std::memcpy(data, sum.data(), static_cast<size_t>(n) * 4);
  }

  void allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &group,
                 const std::string &what) override {
    fault.tick(me, what);
    const int member = memberOf(group, what);
    if (bytes <= 0)
      return;
    if (group.size() == 1) {
      if (in != out)
        std::memmove(out, in, static_cast<size_t>(bytes));
      return;
    }
    // `in` may lie in `out` (this member's block, or anywhere): a copy.
    staged.assign(static_cast<const char *>(in), static_cast<const char *>(in) + bytes);
    Meeting &m = hub.meeting(group);
    meet(m, member, staged.data(), fmt::format("all_gather of {} bytes", bytes), group, what);
    for (size_t q = 0; q < group.size(); ++q)
      std::memcpy(static_cast<char *>(out) + q * bytes, m.posts[q], static_cast<size_t>(bytes));
    barrier(m, group, what);
  }

  void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                const std::vector<int> &group, const std::string &what) override {
    fault.tick(me, what);
    const int member = memberOf(group, what);
    const int n = static_cast<int>(group.size());
    for (const std::vector<Piece> *list : {&sends, &recvs})
      for (const Piece &p : *list)
        if (p.member < 0 || p.member >= n || p.bytes < 0)
          runtimeError("{}: exchange piece of {} bytes with member {} of a group of {}", what,
                       p.bytes, p.member, n);
    Meeting &m = hub.meeting(group);
    meet(m, member, &sends, "exchange", group, what);
    // From each member in turn: its nonempty pieces for this member, in
    // order, into this member's nonempty receives from it, in order.
    for (int q = 0; q < n; ++q) {
      const auto &theirs = *static_cast<const std::vector<Piece> *>(m.posts[q]);
      std::vector<const Piece *> in, out;
      for (const Piece &p : theirs)
        if (p.member == member && p.bytes > 0)
          in.push_back(&p);
      for (const Piece &p : recvs)
        if (p.member == q && p.bytes > 0)
          out.push_back(&p);
      for (size_t i = 0; i < std::max(in.size(), out.size()); ++i) {
        const int64_t got = i < in.size() ? in[i]->bytes : 0,
                      expected = i < out.size() ? out[i]->bytes : 0;
        if (got != expected)
          abort(fmt::format("{}: expected {} bytes from rank {} but got {}", what, expected,
                            group[q], got));
        if (in[i]->data != out[i]->data)
          std::memmove(out[i]->data, in[i]->data, static_cast<size_t>(got));
      }
    }
    barrier(m, group, what);
  }

  void send(const void *data, int64_t bytes, int peer, const std::string &what) override {
    fault.tick(me, what);
    checkPeer(peer, what);
    post(peer, data, bytes);
  }

  void recv(void *data, int64_t bytes, int peer, const std::string &what) override {
    fault.tick(me, what);
    checkPeer(peer, what);
    take(peer, data, bytes, what);
  }

  void sendRecv(const std::vector<Piece> &sends, const std::vector<Piece> &recvs, int peer,
                const std::string &what) override {
    fault.tick(me, what);
    checkPeer(peer, what);
    for (const Piece &p : sends)
      post(peer, p.data, p.bytes);
    for (const Piece &p : recvs)
      take(peer, p.data, p.bytes, what);
  }

  void broadcast(void *data, int64_t bytes, int root, const std::vector<int> &group,
                 const std::string &what) override {
    fault.tick(me, what);
    const int member = memberOf(group, what);
    if (root < 0 || root >= static_cast<int>(group.size()))
      runtimeError("{}: broadcast from member {} of a group of {}", what, root, group.size());
    if (group.size() == 1 || bytes <= 0)
      return;
    Meeting &m = hub.meeting(group);
    meet(m, member, data, fmt::format("broadcast of {} bytes from member {}", bytes, root), group,
         what);
    if (member != root)
      std::memcpy(data, m.posts[root], static_cast<size_t>(bytes));
    barrier(m, group, what);
  }

  int64_t allReduceMax(int64_t value, const std::string &what) override {
    fault.tick(me, what);
    if (hub.ranks == 1)
      return value;
    std::vector<int> world(hub.ranks);
    for (int r = 0; r < hub.ranks; ++r)
      world[r] = r;
    Meeting &m = hub.meeting(world);
    meet(m, me, &value, "all_reduce (max) of 1 value", world, what);
    int64_t result = value;
    for (const void *p : m.posts)
      result = std::max(result, *static_cast<const int64_t *>(p));
    barrier(m, world, what);
    return result;
  }

  [[noreturn]] void abort(const std::string &message, int status = 1) override {
    printRankError(me, message);
    std::_Exit(status); // every rank: they are this process's threads
  }

private:
  Hub &hub;
  const int me;
  double timeout = 300;
  FaultInjector fault;
  std::vector<float> sum;  ///< an all_reduce's result, before it is written back
  std::vector<char> staged; ///< an all_gather's own block

  int memberOf(const std::vector<int> &group, const std::string &what) const {
    return memberIndex(group, me, hub.ranks, what);
  }

  void checkPeer(int peer, const std::string &what) const {
    moert::checkPeer(peer, me, hub.ranks, what);
  }

  [[noreturn]] void timedOut(const std::string &what, const std::vector<int> &group) {
    printTimedOut(me, what, timeout, group);
    std::_Exit(1);
  }

  /// Waits until every member of `group` has arrived at this meeting.
  void barrier(Meeting &m, const std::vector<int> &group, const std::string &what,
               int member = -1, const void *operand = nullptr, const std::string *call = nullptr) {
    std::unique_lock<std::mutex> lock(m.mutex);
    if (member >= 0) {
      m.posts[member] = operand;
      m.calls[member] = *call;
    }
    const int64_t generation = m.generation;
    if (++m.arrived == static_cast<int>(group.size())) {
      m.arrived = 0;
      ++m.generation;
      m.changed.notify_all();
      return;
    }
    if (!m.changed.wait_for(lock, std::chrono::duration<double>(timeout),
                            [&] { return m.generation != generation; }))
      timedOut(what, group);
  }

  /// Posts this member's operand and operation, waits for the others, and
  /// checks that they all call the same operation.
  void meet(Meeting &m, int member, const void *operand, const std::string &call,
            const std::vector<int> &group, const std::string &what) {
    barrier(m, group, what, member, operand, &call);
    for (size_t q = 0; q < group.size(); ++q)
      if (m.calls[q] != call)
        abort(fmt::format("{}: this rank calls {} but rank {} calls {} (group: ranks {})", what,
                          call, group[q], m.calls[q], fmt::join(group, ",")));
  }

  void post(int peer, const void *data, int64_t bytes) {
    Mailbox &box = hub.mailbox(me, peer);
    std::vector<char> message(static_cast<const char *>(data),
                              static_cast<const char *>(data) + std::max<int64_t>(bytes, 0));
    std::lock_guard<std::mutex> lock(box.mutex);
    box.messages.push_back(std::move(message));
    box.changed.notify_all();
  }

  void take(int peer, void *data, int64_t bytes, const std::string &what) {
    Mailbox &box = hub.mailbox(peer, me);
    std::unique_lock<std::mutex> lock(box.mutex);
    if (!box.changed.wait_for(lock, std::chrono::duration<double>(timeout),
                              [&] { return !box.messages.empty(); }))
      timedOut(what, {std::min(me, peer), std::max(me, peer)});
    std::vector<char> message = std::move(box.messages.front());
    box.messages.pop_front();
    lock.unlock();
    if (static_cast<int64_t>(message.size()) != bytes)
      abort(fmt::format("{}: expected {} bytes from rank {} but got {}", what, bytes, peer,
                        message.size()));
    if (bytes > 0)
      std::memcpy(data, message.data(), static_cast<size_t>(bytes));
  }
};

} // namespace

int runRanksInProcess(int ranks, const std::function<int(Comm &)> &rankMain) {
  Hub hub(ranks);
  std::vector<int> status(static_cast<size_t>(ranks), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(hub, r);
      try {
        status[r] = rankMain(comm);
      } catch (const std::exception &e) {
        comm.abort(fmt::format("internal error: {}", e.what()));
      }
      if (status[r] != 0) { // the others may wait for it: end them all
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(status[r]);
      }
    });
  for (std::thread &t : threads)
    t.join();
  for (int s : status)
    if (s != 0)
      return s;
  return 0;
}

} // namespace moert
