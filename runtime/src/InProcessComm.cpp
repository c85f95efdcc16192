// Every rank of a plan in one process (`moert run|train --in-process`): one
// thread per rank, each with a communicator of the plan's world whose
// collectives move data between the threads' buffers (runtime/include/
// moert/Comm.h). The arithmetic is the MPI communicator's: an all_reduce
// adds the members' values in member order, ((v0 + v1) + v2) + ..., as
// MpiComm does for groups of more than two (two values add the same either
// way), so a plan gives the same bits in one process as under mpirun.
//
// A collective is an exchange of pieces over its group (an all_reduce
// gathers every member's values and adds them in member order). Its members
// meet: each posts its pieces and the operation it calls, waits for the
// others (a barrier), checks that they all call the same operation with the
// same sizes, copies the pieces for it from the others' buffers, and waits
// again before it returns, so that no member changes a buffer another still
// reads. Sends are buffered (a copy in the pair's mailbox); a receive waits
// for the next message from its peer. A wait longer than
// --collective-timeout ends the process as MpiComm does:
//   moert: error: rank R: <what> did not complete within S s (group: ranks a,b)
// MOERT_FAULT (Comm.cpp) counts each rank's calls here too: kill ends the
// whole process (every rank), stall leaves the others to time out.
//
// Under mpirun -np P (P dividing the plan's N ranks), process p runs ranks
// [p k, (p + 1) k), k = N / P, as its threads: a collective's members in
// this process meet as above, and its pieces from and to members in other
// processes travel as MPI point-to-point messages on MPI_COMM_WORLD, tagged
// by sender and receiver (MPI_THREAD_MULTIPLE: every rank thread calls
// MPI): the same bits in any number of processes.
#include "moert/Comm.h"
#include "moert/Error.h"

#include "CommShared.h"
#include "InProcessComm.h"

#include <mpi.h>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <functional>
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

/// The ranks of one process: the world's ranks [base, base + local) of
/// `ranks`, in `processes` processes of `local` ranks each.
class Hub {
public:
  Hub(int ranks, int processes, int process)
      : ranks(ranks), processes(processes), local(ranks / processes), base(process * local),
        mailboxes(static_cast<size_t>(local) * local) {
    for (auto &m : mailboxes)
      m = std::make_unique<Mailbox>();
  }

  const int ranks, processes, local, base;

  bool isLocal(int rank) const { return rank >= base && rank < base + local; }
  int processOf(int rank) const { return rank / local; }

  /// The meeting of `group`'s `members` members in this process.
  Meeting &meeting(const std::vector<int> &group, size_t members) {
    std::lock_guard<std::mutex> lock(mutex);
    std::unique_ptr<Meeting> &m = meetings[group];
    if (!m) {
      m = std::make_unique<Meeting>();
      m->posts.resize(members);
      m->calls.resize(members);
    }
    return *m;
  }

  /// (Ranks of this process.)
  Mailbox &mailbox(int from, int to) {
    return *mailboxes[static_cast<size_t>(from - base) * local + (to - base)];
  }

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
    // Every member's values, then added in member order.
    const int64_t members = static_cast<int64_t>(group.size());
    sum.resize(static_cast<size_t>(n * members));
    std::vector<Piece> sends, recvs;
    for (int q = 0; q < members; ++q)
      if (q != member) {
        sends.push_back({q, data, n * 4});
        recvs.push_back({q, sum.data() + q * n, n * 4});
      }
    move(sends, recvs, group, member, fmt::format("all_reduce of {} values", n), what);
    std::memcpy(sum.data() + member * n, data, static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      float total = sum[i];
      for (int64_t q = 1; q < members; ++q)
        total += sum[q * n + i];
      data[i] = total;
    }
  }

  void allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &group,
                 const std::string &what) override {
    fault.tick(me, what);
    const int member = memberOf(group, what);
    if (allGatherWithoutPeers(in, bytes, out, group.size()))
      return;
    // `in` may lie in `out` (this member's block, or anywhere): a copy.
    staged.assign(static_cast<const char *>(in), static_cast<const char *>(in) + bytes);
    std::vector<Piece> sends, recvs;
    for (int q = 0; q < static_cast<int>(group.size()); ++q) {
      sends.push_back({q, staged.data(), bytes});
      recvs.push_back({q, static_cast<char *>(out) + q * bytes, bytes});
    }
    move(sends, recvs, group, member, fmt::format("all_gather of {} bytes", bytes), what);
  }

  void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                const std::vector<int> &group, const std::string &what) override {
    fault.tick(me, what);
    const int member = memberOf(group, what);
    checkPieces(sends, recvs, static_cast<int>(group.size()), what);
    move(sends, recvs, group, member, "exchange", what);
  }

  void send(const void *data, int64_t bytes, int peer, const std::string &what) override {
    fault.tick(me, what);
    checkPeer(peer, what);
    if (hub.isLocal(peer))
      post(peer, data, bytes);
    else
      remote({{0, const_cast<void *>(data), bytes}}, {}, peer, what);
  }

  void recv(void *data, int64_t bytes, int peer, const std::string &what) override {
    fault.tick(me, what);
    checkPeer(peer, what);
    if (hub.isLocal(peer))
      take(peer, data, bytes, what);
    else
      remote({}, {{0, data, bytes}}, peer, what);
  }

  void sendRecv(const std::vector<Piece> &sends, const std::vector<Piece> &recvs, int peer,
                const std::string &what) override {
    fault.tick(me, what);
    checkPeer(peer, what);
    if (!hub.isLocal(peer)) {
      remote(sends, recvs, peer, what);
      return;
    }
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
    std::vector<Piece> sends, recvs;
    for (int q = 0; q < static_cast<int>(group.size()) && member == root; ++q)
      if (q != root)
        sends.push_back({q, data, bytes});
    if (member != root)
      recvs.push_back({root, data, bytes});
    move(sends, recvs, group, member,
         fmt::format("broadcast of {} bytes from member {}", bytes, root), what);
  }

  int64_t allReduceMax(int64_t value, const std::string &what) override {
    fault.tick(me, what);
    if (hub.ranks == 1)
      return value;
    std::vector<int> world(hub.ranks);
    for (int r = 0; r < hub.ranks; ++r)
      world[r] = r;
    std::vector<int64_t> values(world.size(), value);
    std::vector<Piece> sends, recvs;
    for (int q = 0; q < hub.ranks; ++q)
      if (q != me) {
        sends.push_back({q, &value, 8});
        recvs.push_back({q, &values[q], 8});
      }
    move(sends, recvs, world, me, "all_reduce (max) of 1 value", what);
    return *std::max_element(values.begin(), values.end());
  }

  [[noreturn]] void abort(const std::string &message, int status = 1) override {
    printRankError(me, message);
    endJob(status);
  }

private:
  Hub &hub;
  const int me;
  double timeout = 300;
  FaultInjector fault;
  std::vector<float> sum;  ///< an all_reduce's result (or every member's values)
  std::vector<char> staged; ///< an all_gather's own block

  int memberOf(const std::vector<int> &group, const std::string &what) const {
    return memberIndex(group, me, hub.ranks, what);
  }

  void checkPeer(int peer, const std::string &what) const {
    moert::checkPeer(peer, me, hub.ranks, what);
  }

  [[noreturn]] void timedOut(const std::string &what, const std::vector<int> &group) {
    printTimedOut(me, what, timeout, group);
    endJob(1);
  }

  /// From group member q (this process's) its nonempty `pieces` for this
  /// member (`member`), in order, into this member's nonempty receives from
  /// q, in order.
  void matchPieces(const std::vector<Piece> &pieces, int q, const std::vector<Piece> &recvs,
                   int member, const std::vector<int> &group, const std::string &what) {
    std::vector<const Piece *> in, out;
    for (const Piece &p : pieces)
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

  /// MPI's tag of the messages from world rank `from` to `to` (above the
  /// tags MpiComm uses).
  int tag(int from, int to) const { return 16 + from * hub.ranks + to; }

  static int messageBytes(int64_t bytes, const std::string &what) {
    if (bytes > INT_MAX)
      runtimeError("{}: a message of {} bytes between processes (at most {})", what, bytes,
                   INT_MAX);
    return static_cast<int>(bytes);
  }

  /// Posts MPI's receives of the nonempty `recvs` from `ranks[member]` in
  /// other processes, then its sends, into `requests` (`from`: each
  /// receive's sender and piece).
  void postRemote(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                  const std::function<int(int)> &rankOf, std::vector<MPI_Request> &requests,
                  std::vector<std::pair<int, const Piece *>> &from, const std::string &what) {
    for (const Piece &p : recvs) {
      const int r = rankOf(p.member);
      if (p.bytes <= 0 || hub.isLocal(r))
        continue;
      requests.emplace_back();
      from.emplace_back(r, &p);
      MPI_Irecv(p.data, messageBytes(p.bytes, what), MPI_BYTE, hub.processOf(r), tag(r, me),
                MPI_COMM_WORLD, &requests.back());
    }
    for (const Piece &p : sends) {
      const int r = rankOf(p.member);
      if (p.bytes <= 0 || hub.isLocal(r))
        continue;
      requests.emplace_back();
      MPI_Isend(p.data, messageBytes(p.bytes, what), MPI_BYTE, hub.processOf(r), tag(me, r),
                MPI_COMM_WORLD, &requests.back());
    }
  }

  /// Waits for the requests (the job ends past the timeout), then checks
  /// the receives' sizes.
  void waitRemote(std::vector<MPI_Request> &requests,
                  const std::vector<std::pair<int, const Piece *>> &from,
                  const std::vector<int> &group, const std::string &what) {
    if (requests.empty()) // (one process: MPI need not be running)
      return;
    std::vector<MPI_Status> statuses(requests.size());
    const auto start = std::chrono::steady_clock::now();
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, statuses.data());
      if (done)
        break;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
          timeout)
        timedOut(what, group);
      if (polls < 2000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(polls < 20000 ? 20 : 200));
    }
    for (size_t i = 0; i < from.size(); ++i) {
      int got = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (got != from[i].second->bytes)
        abort(fmt::format("{}: expected {} bytes from rank {} but got {}", what,
                          from[i].second->bytes, from[i].first, got));
    }
  }

  /// Every collective: an exchange of pieces over the group. Those to and
  /// from members in other processes travel as MPI messages; the members
  /// in this process meet (posting their sends and the operation they call,
  /// checked equal) and copy theirs from each other's buffers, then meet
  /// again once all have read them.
  void move(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
            const std::vector<int> &group, int member, const std::string &call,
            const std::string &what) {
    std::vector<MPI_Request> requests;
    std::vector<std::pair<int, const Piece *>> from;
    postRemote(sends, recvs, [&](int q) { return group[q]; }, requests, from, what);
    std::vector<int> here; // the members in this process (indices into group)
    int mine = 0;
    for (int q = 0; q < static_cast<int>(group.size()); ++q)
      if (hub.isLocal(group[q])) {
        if (q == member)
          mine = static_cast<int>(here.size());
        here.push_back(q);
      }
    std::vector<int> ranksHere;
    for (int q : here)
      ranksHere.push_back(group[q]);
    Meeting *m = here.size() > 1 ? &hub.meeting(group, here.size()) : nullptr;
    if (m)
      meet(*m, mine, &sends, call, ranksHere, what);
    for (size_t j = 0; j < here.size(); ++j)
      matchPieces(m ? *static_cast<const std::vector<Piece> *>(m->posts[j]) : sends, here[j],
                  recvs, member, group, what);
    waitRemote(requests, from, group, what);
    if (m)
      barrier(*m, ranksHere, what); // every member here has read every piece
  }

  /// Point-to-point with a rank in another process: `sends` to it, `recvs`
  /// from it, each a message in order.
  void remote(const std::vector<Piece> &sends, const std::vector<Piece> &recvs, int peer,
              const std::string &what) {
    std::vector<MPI_Request> requests;
    std::vector<std::pair<int, const Piece *>> from;
    // (Empty pieces are messages too: a pipeline's sends and receives pair
    // by count.)
    for (const Piece &p : recvs) {
      requests.emplace_back();
      from.emplace_back(peer, &p);
      MPI_Irecv(p.data, messageBytes(p.bytes, what), MPI_BYTE, hub.processOf(peer),
                tag(peer, me), MPI_COMM_WORLD, &requests.back());
    }
    for (const Piece &p : sends) {
      requests.emplace_back();
      MPI_Isend(p.data, messageBytes(p.bytes, what), MPI_BYTE, hub.processOf(peer),
                tag(me, peer), MPI_COMM_WORLD, &requests.back());
    }
    waitRemote(requests, from, {std::min(me, peer), std::max(me, peer)}, what);
  }

  [[noreturn]] void endJob(int status) {
    if (hub.processes > 1)
      MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status); // every rank: they are this process's threads
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

int runRanksInProcess(int ranks, const std::function<int(Comm &)> &rankMain, int processes,
                      int process) {
  if (processes < 1 || ranks % processes || process < 0 || process >= processes)
    runtimeError("{} ranks in {} processes (this one {})", ranks, processes, process);
  if (processes > 1) {
    int *upper = nullptr, found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found);
    if (found && int64_t(16) + int64_t(ranks) * ranks > *upper)
      inputError("--in-process over {} processes: {} ranks need MPI tags up to {}, this MPI's "
                 "end at {}",
                 processes, ranks, int64_t(16) + int64_t(ranks) * ranks, *upper);
  }
  Hub hub(ranks, processes, process);
  std::vector<int> status(static_cast<size_t>(hub.local), 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < hub.local; ++i)
    threads.emplace_back([&, i] {
      ThreadComm comm(hub, hub.base + i);
      try {
        status[i] = rankMain(comm);
      } catch (const std::exception &e) {
        comm.abort(fmt::format("internal error: {}", e.what()));
      }
      if (status[i] != 0) { // the others may wait for it: end them all
        std::fflush(stdout);
        std::fflush(stderr);
        if (processes > 1)
          MPI_Abort(MPI_COMM_WORLD, status[i]);
        std::_Exit(status[i]);
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
