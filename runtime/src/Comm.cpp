// The communicators of moert::Comm (runtime/include/moert/Comm.h): the
// single-process one (a world of one) and the MPI one, used under mpirun.
//
// MPI: groups arrive as lists of world ranks (Plan::groupOf); member q of a
// group is its q-th rank. Their communicators are made on first use (or in
// prepare) with MPI_Comm_create_group, which is collective over the members
// only, and kept per rank list. Every operation is nonblocking MPI polled
// with MPI_Test until it completes or the timeout (setTimeout, default 300 s)
// passes; then the rank prints
//   moert: error: rank R: <what> did not complete within S s (group: ranks a,b)
// and ends the job with MPI_Abort, so no rank waits forever. Before a group's
// communicator is made its members exchange a message (under the same
// timeout), so a member that never arrives ends the job there too.
//
// Fault injection (tests only): the environment variable
//   MOERT_FAULT=kill:R:N   world rank R raises SIGKILL on itself,
//   MOERT_FAULT=stall:R:N  world rank R sleeps forever,
// at its N-th (from 1) communication call, counting every call of
// allReduceSum, allGather, exchange, send, recv, broadcast and allReduceMax
// (also in a world of one). It lets tests check that a dead or stuck rank
// ends the whole job with a message instead of a hang.
#include "moert/Comm.h"
#include "moert/Error.h"

#include "CommShared.h"

#include <mpi.h>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <unistd.h>

namespace moert {

bool underMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

namespace {

/// An exchange within a group of one: each send is the next receive.
void matchOwnPieces(const std::vector<Comm::Piece> &sends, const std::vector<Comm::Piece> &recvs,
                    const std::string &what) {
  std::vector<const Comm::Piece *> out, in;
  for (const Comm::Piece &p : sends)
    if (p.bytes != 0)
      out.push_back(&p);
  for (const Comm::Piece &p : recvs)
    if (p.bytes != 0)
      in.push_back(&p);
  if (out.size() != in.size())
    runtimeError("{}: exchange within one rank sends {} pieces but receives {}", what,
                 out.size(), in.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i]->member != 0 || in[i]->member != 0)
      runtimeError("{}: exchange with member {} of a group of 1", what,
                   std::max(out[i]->member, in[i]->member));
    if (out[i]->bytes != in[i]->bytes)
      runtimeError("{}: exchange sends {} bytes to itself but expects {}", what, out[i]->bytes,
                   in[i]->bytes);
    if (out[i]->bytes > 0 && out[i]->data != in[i]->data)
      std::memmove(in[i]->data, out[i]->data, static_cast<size_t>(out[i]->bytes));
  }
}

/// The world of one process: every group is {0}.
class LocalComm final : public Comm {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void prepare(const Plan &) override {}
  void setTimeout(double) override {}

  void allReduceSum(float *, int64_t, const std::vector<int> &group,
                    const std::string &what) override {
    begin(group, what);
  }
  void allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &group,
                 const std::string &what) override {
    begin(group, what);
    allGatherWithoutPeers(in, bytes, out, group.size());
  }
  void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                const std::vector<int> &group, const std::string &what) override {
    begin(group, what);
    matchOwnPieces(sends, recvs, what);
  }
  void send(const void *, int64_t, int peer, const std::string &what) override {
    fault.tick(0, what);
    runtimeError("{}: send to rank {} in a world of one process", what, peer);
  }
  void recv(void *, int64_t, int peer, const std::string &what) override {
    fault.tick(0, what);
    runtimeError("{}: receive from rank {} in a world of one process", what, peer);
  }
  void broadcast(void *, int64_t, int root, const std::vector<int> &group,
                 const std::string &what) override {
    begin(group, what);
    if (root != 0)
      runtimeError("{}: broadcast from member {} of a group of 1", what, root);
  }
  int64_t allReduceMax(int64_t value, const std::string &what) override {
    fault.tick(0, what);
    return value;
  }
  [[noreturn]] void abort(const std::string &message, int status = 1) override {
    std::fflush(stdout);
    fmt::print(stderr, "moert: error: {}\n", message);
    std::fflush(stderr);
    std::exit(status);
  }

private:
  FaultInjector fault;

  void begin(const std::vector<int> &group, const std::string &what) {
    fault.tick(0, what);
    if (group.size() != 1 || group[0] != 0)
      runtimeError("{}: group of ranks {} in a world of one process", what, fmt::join(group, ","));
  }
};

// Tags on MPI_COMM_WORLD: point-to-point data, and the exchange before a
// group's communicator is made.
constexpr int kDataTag = 1;
constexpr int kGroupTag = 2;
/// Send, receive and broadcast move at most this many bytes per MPI message.
constexpr int64_t kChunkBytes = int64_t(1) << 30;

class MpiComm final : public Comm {
public:
  MpiComm(int *argc, char ***argv, bool rankThreads) {
    // --in-process under mpirun, or a plan of several ranks a process: each
    // process's ranks are threads that all call MPI (InProcessComm.cpp).
    bool threads = rankThreads;
    for (int i = 1; i < *argc; ++i)
      threads = threads || !std::strcmp((*argv)[i], "--in-process");
    int provided = 0;
    MPI_Init_thread(argc, argv, threads ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
    threadsMayCall = provided >= MPI_THREAD_MULTIPLE;
    MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
    MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
    MPI_Comm_group(MPI_COMM_WORLD, &worldGroup);
    world.resize(worldSize);
    for (int r = 0; r < worldSize; ++r)
      world[r] = r;
  }

  ~MpiComm() override {
    for (auto &entry : comms)
      if (entry.second != MPI_COMM_WORLD && entry.second != MPI_COMM_NULL)
        MPI_Comm_free(&entry.second);
    for (auto &entry : units)
      MPI_Type_free(&entry.second);
    MPI_Group_free(&worldGroup);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MPI_Finalize();
  }

  int rank() const override { return worldRank; }
  int size() const override { return worldSize; }
  void setTimeout(double seconds) override { timeout = seconds; }
  bool threadsMayCall = false;

  /// Makes the communicators of every group the plan's collectives use, in
  /// one order that every rank follows (ranks 0..N-1, each one's steps in
  /// program order): members meet each group at the same point of the
  /// order, so the blocking creations cannot wait on each other in a cycle.
  void prepare(const Plan &plan) override {
    for (int64_t r = 0; r < static_cast<int64_t>(plan.ranks.size()); ++r) {
      for (const PlanProgram *program : plan.entriesOf(r))
        for (size_t s = 0; s < program->steps.size(); ++s) {
          const PlanStep &step = program->steps[s];
          if (!step.op->has(OpDef::InGroup))
            continue;
          std::vector<int> group = plan.groupOf(r, step.group);
          if (std::find(group.begin(), group.end(), worldRank) != group.end())
            commOf(group, fmt::format("preparing the group of rank {}'s step {} ({}, entry {})",
                                      r, s, step.op->name, program->entry));
        }
    }
  }

  void allReduceSum(float *data, int64_t n, const std::vector<int> &group,
                    const std::string &what) override {
    fault.tick(worldRank, what);
    MPI_Comm comm = commOf(group, what);
    if (group.size() == 1 || n <= 0)
      return;
    if (group.size() == 2) { // v0 + v1 == v1 + v0: MPI's sum is the fixed-order one
      std::vector<MPI_Request> requests;
      for (int64_t at = 0; at < n; at += kChunkBytes / 4) {
        int count = static_cast<int>(std::min(n - at, kChunkBytes / 4));
        requests.emplace_back();
        MPI_Iallreduce(MPI_IN_PLACE, data + at, count, MPI_FLOAT, MPI_SUM, comm,
                       &requests.back());
      }
      wait(requests, what, group);
      return;
    }
    // More members: MPI's reduction order is its algorithm's. Gather every
    // member's values (a chunk at a time) and add them in member order,
    // ((v0 + v1) + v2) + ..., on every member: the same bits on every rank,
    // in every run, and in one process (InProcessComm.cpp).
    const int64_t members = static_cast<int64_t>(group.size());
    const int64_t chunk = std::min<int64_t>(n, std::max<int64_t>(1, (int64_t(1) << 24) / members));
    std::vector<float> all(static_cast<size_t>(chunk * members));
    for (int64_t at = 0; at < n; at += chunk) {
      const int64_t m = std::min(chunk, n - at);
      std::vector<MPI_Request> requests(1);
      MPI_Iallgather(data + at, static_cast<int>(m), MPI_FLOAT, all.data(), static_cast<int>(m),
                     MPI_FLOAT, comm, &requests[0]);
      wait(requests, what, group);
      for (int64_t i = 0; i < m; ++i) {
        float sum = all[i];
        for (int64_t q = 1; q < members; ++q)
          sum += all[q * m + i];
        data[at + i] = sum;
      }
    }
  }

  void allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &group,
                 const std::string &what) override {
    fault.tick(worldRank, what);
    MPI_Comm comm = commOf(group, what);
    if (allGatherWithoutPeers(in, bytes, out, group.size()))
      return;
    int64_t n = static_cast<int64_t>(group.size());
    const char *inBytes = static_cast<const char *>(in);
    char *outBytes = static_cast<char *>(out);
    // MPI forbids aliasing other than MPI_IN_PLACE (own block in place).
    std::vector<char> copy;
    const void *source = in;
    int64_t own = memberIndex(group) * bytes;
    if (inBytes == outBytes + own) {
      source = MPI_IN_PLACE;
    } else if (inBytes < outBytes + n * bytes && outBytes < inBytes + bytes) {
      copy.assign(inBytes, inBytes + bytes);
      source = copy.data();
    }
    auto [type, unit] = unitFor({bytes}, what, "all_gather");
    int count = static_cast<int>(bytes / unit);
    std::vector<MPI_Request> requests(1);
    MPI_Iallgather(source, count, type, out, count, type, comm, &requests[0]);
    wait(requests, what, group);
  }

  void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                const std::vector<int> &group, const std::string &what) override {
    fault.tick(worldRank, what);
    MPI_Comm comm = commOf(group, what);
    checkPieces(sends, recvs, static_cast<int>(group.size()), what);
    // Receives first, then sends; pieces between two ranks match in order
    // (MPI's messages on one communicator and tag do not overtake).
    std::vector<MPI_Request> requests;
    std::vector<std::pair<const Piece *, int>> expected; // per receive request
    for (const Piece &p : recvs) {
      char *at = static_cast<char *>(p.data);
      forChunks(p.bytes, [&](int64_t offset, int count) {
        requests.emplace_back();
        expected.emplace_back(&p, count);
        MPI_Irecv(at + offset, count, MPI_BYTE, p.member, kDataTag, comm, &requests.back());
      });
    }
    const size_t receives = requests.size();
    for (const Piece &p : sends) {
      const char *at = static_cast<const char *>(p.data);
      forChunks(p.bytes, [&](int64_t offset, int count) {
        requests.emplace_back();
        MPI_Isend(at + offset, count, MPI_BYTE, p.member, kDataTag, comm, &requests.back());
      });
    }
    std::vector<MPI_Status> statuses = wait(requests, what, group);
    for (size_t i = 0; i < receives; ++i) {
      int got = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (got != expected[i].second)
        abort(fmt::format("{}: expected {} bytes from rank {} but got {}", what,
                          expected[i].first->bytes, group[expected[i].first->member],
                          expected[i].first->bytes - (expected[i].second - got)));
    }
  }

  void send(const void *data, int64_t bytes, int peer, const std::string &what) override {
    fault.tick(worldRank, what);
    checkPeer(peer, what);
    std::vector<MPI_Request> requests;
    const char *at = static_cast<const char *>(data);
    forChunks(bytes, [&](int64_t offset, int count) {
      requests.emplace_back();
      MPI_Isend(at + offset, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, &requests.back());
    });
    wait(requests, what, pair(peer));
  }

  void sendRecv(const std::vector<Piece> &sends, const std::vector<Piece> &recvs, int peer,
                const std::string &what) override {
    fault.tick(worldRank, what);
    checkPeer(peer, what);
    // Receives first, then sends, then all of them waited for: messages
    // between two ranks arrive in order.
    std::vector<MPI_Request> requests;
    std::vector<int> expected;
    for (const Piece &p : recvs) {
      char *at = static_cast<char *>(p.data);
      forChunks(p.bytes, [&](int64_t offset, int count) {
        requests.emplace_back();
        expected.push_back(count);
        MPI_Irecv(at + offset, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, &requests.back());
      });
    }
    const size_t receives = requests.size();
    for (const Piece &p : sends) {
      const char *at = static_cast<const char *>(p.data);
      forChunks(p.bytes, [&](int64_t offset, int count) {
        requests.emplace_back();
        MPI_Isend(at + offset, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, &requests.back());
      });
    }
    std::vector<MPI_Status> statuses = wait(requests, what, pair(peer));
    for (size_t i = 0; i < receives; ++i) {
      int got = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (got != expected[i])
        abort(fmt::format("{}: expected {} bytes in a piece from rank {} but got {}", what,
                          expected[i], peer, got));
    }
  }

  void recv(void *data, int64_t bytes, int peer, const std::string &what) override {
    fault.tick(worldRank, what);
    checkPeer(peer, what);
    std::vector<MPI_Request> requests;
    std::vector<int> expected;
    char *at = static_cast<char *>(data);
    forChunks(bytes, [&](int64_t offset, int count) {
      requests.emplace_back();
      expected.push_back(count);
      MPI_Irecv(at + offset, count, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, &requests.back());
    });
    std::vector<MPI_Status> statuses = wait(requests, what, pair(peer));
    for (size_t i = 0; i < statuses.size(); ++i) {
      int got = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (got != expected[i])
        abort(fmt::format("{}: expected {} bytes from rank {} but got {}", what, bytes, peer,
                          bytes - (expected[i] - got)));
    }
  }

  void broadcast(void *data, int64_t bytes, int root, const std::vector<int> &group,
                 const std::string &what) override {
    fault.tick(worldRank, what);
    MPI_Comm comm = commOf(group, what);
    if (root < 0 || root >= static_cast<int>(group.size()))
      runtimeError("{}: broadcast from member {} of a group of {}", what, root, group.size());
    if (group.size() == 1)
      return;
    std::vector<MPI_Request> requests;
    char *at = static_cast<char *>(data);
    forChunks(bytes, [&](int64_t offset, int count) {
      requests.emplace_back();
      MPI_Ibcast(at + offset, count, MPI_BYTE, root, comm, &requests.back());
    });
    wait(requests, what, group);
  }

  int64_t allReduceMax(int64_t value, const std::string &what) override {
    fault.tick(worldRank, what);
    int64_t result = value;
    if (worldSize == 1)
      return result;
    std::vector<MPI_Request> requests(1);
    MPI_Iallreduce(&value, &result, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD, &requests[0]);
    wait(requests, what, world);
    return result;
  }

  [[noreturn]] void abort(const std::string &message, int status = 1) override {
    printRankError(worldRank, message);
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);
  }

private:
  int worldRank = 0, worldSize = 1;
  MPI_Group worldGroup = MPI_GROUP_NULL;
  std::vector<int> world; ///< 0..N-1
  double timeout = 300;
  FaultInjector fault;
  std::map<std::vector<int>, MPI_Comm> comms;
  std::map<int64_t, MPI_Datatype> units; ///< contiguous byte types by size

  void checkPeer(int peer, const std::string &what) const {
    moert::checkPeer(peer, worldRank, worldSize, what);
  }

  std::vector<int> pair(int peer) const {
    return {std::min(worldRank, peer), std::max(worldRank, peer)};
  }

  int64_t memberIndex(const std::vector<int> &group) const {
    return std::find(group.begin(), group.end(), worldRank) - group.begin();
  }

  /// Splits `bytes` into messages of at most kChunkBytes.
  template <typename F> static void forChunks(int64_t bytes, F &&post) {
    if (bytes <= 0) {
      post(0, 0);
      return;
    }
    for (int64_t offset = 0; offset < bytes; offset += kChunkBytes)
      post(offset, static_cast<int>(std::min(bytes - offset, kChunkBytes)));
  }

  /// The largest contiguous byte type (a power of two up to 64 KiB) that
  /// divides every value, so that MPI's int counts and displacements reach
  /// past 2 GiB; fails clearly when a value still does not fit.
  std::pair<MPI_Datatype, int64_t> unitFor(const std::vector<int64_t> &values,
                                           const std::string &what, const char *op) {
    int64_t unit = int64_t(1) << 16;
    for (int64_t value : values)
      while (unit > 1 && value % unit)
        unit /= 2;
    for (int64_t value : values)
      if (value / unit > INT_MAX)
        runtimeError("{}: {} of {} bytes exceeds what one MPI call can move ({} units of {} "
                     "bytes)",
                     what, op, value, INT_MAX, unit);
    if (unit == 1)
      return {MPI_BYTE, 1};
    auto found = units.find(unit);
    if (found == units.end()) {
      MPI_Datatype type;
      MPI_Type_contiguous(static_cast<int>(unit), MPI_BYTE, &type);
      MPI_Type_commit(&type);
      found = units.emplace(unit, type).first;
    }
    return {found->second, unit};
  }

  /// Polls until every request completes; past the timeout, ends the job.
  std::vector<MPI_Status> wait(std::vector<MPI_Request> &requests, const std::string &what,
                               const std::vector<int> &group) {
    std::vector<MPI_Status> statuses(requests.size());
    auto start = std::chrono::steady_clock::now();
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, statuses.data());
      if (done)
        return statuses;
      double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed > timeout) {
        printTimedOut(worldRank, what, timeout, group);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);
      }
      // Spin briefly (a fast collective), then give the core away.
      if (polls < 2000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(polls < 20000 ? 20 : 200));
    }
  }

  /// The communicator of `group` (member q = rank group[q]); made on first
  /// use. MPI_COMM_NULL for a group of one (the callers copy).
  MPI_Comm commOf(const std::vector<int> &group, const std::string &what) {
    auto found = comms.find(group);
    if (found != comms.end())
      return found->second;
    moert::memberIndex(group, worldRank, worldSize, what); // (a valid group with this rank)
    if (group.size() == 1)
      return comms[group] = MPI_COMM_NULL;
    if (group == world)
      return comms[group] = MPI_COMM_WORLD;
    // A tag from the list (MPI_TAG_UB is at least 32767).
    uint64_t hash = 1469598103934665603ull;
    for (int r : group)
      hash = (hash ^ static_cast<uint64_t>(r)) * 1099511628211ull;
    int tag = static_cast<int>(hash % 32000) + 100;
    // Meet every other member first (under the timeout): the creation below
    // blocks without one. Each sends the group's tag, so members that
    // disagree on the group are caught here.
    std::vector<MPI_Request> requests;
    std::vector<int> theirs(group.size(), -1);
    for (size_t q = 0; q < group.size(); ++q) {
      if (group[q] == worldRank)
        continue;
      requests.emplace_back();
      MPI_Isend(&tag, 1, MPI_INT, group[q], kGroupTag, MPI_COMM_WORLD, &requests.back());
      requests.emplace_back();
      MPI_Irecv(&theirs[q], 1, MPI_INT, group[q], kGroupTag, MPI_COMM_WORLD, &requests.back());
    }
    wait(requests, what + " (making the group's communicator)", group);
    for (size_t q = 0; q < group.size(); ++q)
      if (group[q] != worldRank && theirs[q] != tag)
        abort(fmt::format("{}: rank {} is making a different group than ranks {}", what, group[q],
                          fmt::join(group, ",")));
    MPI_Group members;
    MPI_Group_incl(worldGroup, static_cast<int>(group.size()), group.data(), &members);
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &comm);
    MPI_Group_free(&members);
    return comms[group] = comm;
  }
};

} // namespace

bool mpiAllowsThreads(const Comm &comm) {
  auto *mpi = dynamic_cast<const MpiComm *>(&comm);
  return mpi && mpi->threadsMayCall;
}

std::unique_ptr<Comm> createComm(int *argc, char ***argv, bool rankThreads) {
  // Checks MOERT_FAULT before MPI starts (InputError when malformed).
  FaultInjector check;
  (void)check;
  if (underMpirun())
    return std::make_unique<MpiComm>(argc, argv, rankThreads);
  return std::make_unique<LocalComm>();
}

void Comm::sendRecv(const std::vector<Piece> &, const std::vector<Piece> &, int peer,
                    const std::string &what) {
  runtimeError("{}: a fused send and receive with rank {}: not supported by this communicator",
               what, peer);
}

} // namespace moert
