// moert::Comm: the single-process communicator (run plainly), the MPI one
// (run under `mpirun -np 4`; the MPI tests skip in a world of one, the
// single-process ones skip under mpirun) and the in-process one (run
// plainly: each CommRanks test again as CommInProcess, on 4 ranks that are
// threads of this process, runtime/src/InProcessComm.h). CommFault.* runs
// only with MOERT_FAULT set (tests/runtime/check-comm-fault.py).
#include "moert/Comm.h"
#include "moert/Error.h"

#include "../../runtime/src/InProcessComm.h"

#include <gtest/gtest.h>

#include <fmt/core.h>

#include <cstdlib>
#include <numeric>

using namespace moert;

namespace {

/// This rank's communicator: the process's, or an in-process rank's (its
/// thread's).
thread_local Comm *comm = nullptr;

std::vector<int> worldGroup() {
  std::vector<int> group(comm->size());
  std::iota(group.begin(), group.end(), 0);
  return group;
}

/// Ranks with the same parity as this one, ascending.
std::vector<int> parityGroup() {
  std::vector<int> group;
  for (int r = comm->rank() % 2; r < comm->size(); r += 2)
    group.push_back(r);
  return group;
}

int memberOf(const std::vector<int> &group) {
  return static_cast<int>(std::find(group.begin(), group.end(), comm->rank()) - group.begin());
}

#define REQUIRE_MPI()                                                                              \
  if (comm->size() < 2)                                                                            \
  GTEST_SKIP() << "needs mpirun -np >= 2"

/// A test of a world of several ranks: CommMpi.NAME under mpirun (this
/// process is one rank), and CommInProcess.NAME: run plainly, 4 ranks, each
/// a thread running the body with its own communicator; under mpirun -np P
/// with --in-process, 2 P ranks, 2 in each process (ranks 2p and 2p + 1),
/// so that groups span processes.
#define COMM_RANKS_TEST(name)                                                                      \
  void name##Body();                                                                               \
  TEST(CommMpi, name) {                                                                            \
    REQUIRE_MPI();                                                                                 \
    name##Body();                                                                                  \
  }                                                                                                \
  TEST(CommInProcess, name) {                                                                      \
    const int processes = comm->size();                                                            \
    if (processes > 1 && !mpiAllowsThreads(*comm))                                                 \
      GTEST_SKIP() << "under mpirun: needs --in-process (MPI_THREAD_MULTIPLE)";                    \
    runRanksInProcess(                                                                             \
        processes > 1 ? 2 * processes : 4,                                                         \
        [](Comm &rank) {                                                                           \
          comm = &rank;                                                                            \
          rank.setTimeout(60);                                                                     \
          name##Body();                                                                            \
          return 0;                                                                                \
        },                                                                                         \
        processes, comm->rank());                                                                  \
  }                                                                                                \
  void name##Body()

#define REQUIRE_LOCAL()                                                                            \
  if (comm->size() != 1)                                                                           \
  GTEST_SKIP() << "the single-process communicator (run without mpirun)"

COMM_RANKS_TEST(AllReduceSumWorld) {
  int n = comm->size();
  std::vector<float> data(100003);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(comm->rank() + (i % 7));
  comm->allReduceSum(data.data(), static_cast<int64_t>(data.size()), worldGroup(), "sum world");
  for (size_t i = 0; i < data.size(); ++i)
    ASSERT_EQ(data[i], static_cast<float>(n * (n - 1) / 2 + n * (i % 7))) << i;
}

COMM_RANKS_TEST(AllReduceSumSubsetGroups) {
  std::vector<int> group = parityGroup();
  std::vector<float> data{1.0f, static_cast<float>(comm->rank())};
  comm->allReduceSum(data.data(), 2, group, "sum parity");
  float expected = 0;
  for (int r : group)
    expected += static_cast<float>(r);
  EXPECT_EQ(data[0], static_cast<float>(group.size()));
  EXPECT_EQ(data[1], expected);
}

COMM_RANKS_TEST(AllGatherInGroupOrder) {
  // The world in descending order: member q is rank n-1-q.
  std::vector<int> group = worldGroup();
  std::reverse(group.begin(), group.end());
  int32_t mine[3] = {comm->rank(), comm->rank() * 10, comm->rank() * 100};
  std::vector<int32_t> out(3 * group.size(), -1);
  comm->allGather(mine, sizeof mine, out.data(), group, "gather reversed");
  for (size_t q = 0; q < group.size(); ++q) {
    EXPECT_EQ(out[3 * q], group[q]);
    EXPECT_EQ(out[3 * q + 1], group[q] * 10);
    EXPECT_EQ(out[3 * q + 2], group[q] * 100);
  }
  // In place: this member's block already sits in `out`.
  std::vector<int32_t> inPlace(group.size(), -1);
  int q = memberOf(group);
  inPlace[q] = comm->rank() + 1000;
  comm->allGather(&inPlace[q], 4, inPlace.data(), group, "gather in place");
  for (size_t m = 0; m < group.size(); ++m)
    EXPECT_EQ(inPlace[m], group[m] + 1000);
}

COMM_RANKS_TEST(ExchangeUnevenPiecesInOrder) {
  std::vector<int> group = worldGroup();
  int n = static_cast<int>(group.size()), me = comm->rank();
  // Member me sends member q two pieces: me + q + 1 values, then 2 values;
  // the receiver lists them in that order at places of its own choosing
  // (one value of gap before each; the second piece first in memory).
  std::vector<std::vector<int32_t>> out(n);
  std::vector<Comm::Piece> sends, recvs;
  for (int q = 0; q < n; ++q) {
    for (int k = 0; k < me + q + 1 + 2; ++k)
      out[q].push_back(me * 1000 + q * 10 + k);
    sends.push_back({q, out[q].data(), (me + q + 1) * 4});
    sends.push_back({q, out[q].data() + me + q + 1, 8});
  }
  std::vector<std::vector<int32_t>> in(n);
  for (int q = 0; q < n; ++q) {
    in[q].assign(1 + 2 + 1 + q + me + 1, -1);
    recvs.push_back({q, in[q].data() + 4, (q + me + 1) * 4});
    recvs.push_back({q, in[q].data() + 1, 8});
  }
  comm->exchange(sends, recvs, group, "exchange uneven");
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(in[q][0], -1) << "gap before member " << q;
    EXPECT_EQ(in[q][3], -1) << "gap between member " << q << "'s pieces";
    for (int k = 0; k < q + me + 1; ++k)
      EXPECT_EQ(in[q][4 + k], q * 1000 + me * 10 + k) << "from member " << q << " value " << k;
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(in[q][1 + k], q * 1000 + me * 10 + q + me + 1 + k) << "second piece of " << q;
  }
}

COMM_RANKS_TEST(ExchangeWithZeroPiecesLeftOutInSubset) {
  std::vector<int> group = parityGroup();
  int n = static_cast<int>(group.size()), me = memberOf(group);
  // Only member 0 sends anything: one double to each member.
  std::vector<double> send(n);
  std::vector<Comm::Piece> sends, recvs;
  for (int q = 0; q < n; ++q) {
    send[q] = 0.5 + q;
    if (me == 0)
      sends.push_back({q, &send[q], 8});
  }
  double got = -1;
  recvs.push_back({0, &got, 8});
  comm->exchange(sends, recvs, group, "exchange zeros");
  EXPECT_EQ(got, 0.5 + me);
}

COMM_RANKS_TEST(SendRecvInOrder) {
  // Rank 0 sends messages of several sizes to rank 1; they arrive in order.
  std::vector<size_t> sizes{1, 1000, 0, 300000, 17};
  if (comm->rank() == 0) {
    for (size_t m = 0; m < sizes.size(); ++m) {
      std::vector<uint8_t> data(sizes[m]);
      for (size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<uint8_t>(m * 31 + i);
      comm->send(data.data(), static_cast<int64_t>(data.size()), 1, fmt::format("send {}", m));
    }
  } else if (comm->rank() == 1) {
    for (size_t m = 0; m < sizes.size(); ++m) {
      std::vector<uint8_t> data(sizes[m], 0xEE);
      comm->recv(data.data(), static_cast<int64_t>(data.size()), 0, fmt::format("recv {}", m));
      for (size_t i = 0; i < data.size(); ++i)
        ASSERT_EQ(data[i], static_cast<uint8_t>(m * 31 + i)) << "message " << m << " byte " << i;
    }
  }
}

COMM_RANKS_TEST(SendRecvPipelineChain) {
  // Stage r receives from r - 1, adds its rank and passes it on.
  int me = comm->rank(), n = comm->size();
  std::vector<float> value(1000, 0.0f);
  if (me > 0)
    comm->recv(value.data(), 4000, me - 1, "chain recv");
  for (float &v : value)
    v += static_cast<float>(me);
  if (me + 1 < n)
    comm->send(value.data(), 4000, me + 1, "chain send");
  if (me + 1 == n) {
    for (float v : value)
      ASSERT_EQ(v, static_cast<float>(n * (n - 1) / 2));
  }
}

COMM_RANKS_TEST(BroadcastFromRoot) {
  std::vector<int> group = worldGroup();
  int root = comm->size() - 1;
  std::vector<float> data(5000, -1.0f);
  if (comm->rank() == group[root])
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<float>(i) * 0.25f;
  comm->broadcast(data.data(), static_cast<int64_t>(data.size() * 4), root, group, "bcast world");
  for (size_t i = 0; i < data.size(); ++i)
    ASSERT_EQ(data[i], static_cast<float>(i) * 0.25f);

  // Within each parity group, from its last member.
  std::vector<int> sub = parityGroup();
  int subRoot = static_cast<int>(sub.size()) - 1;
  int64_t value = comm->rank() == sub[subRoot] ? 4242 + comm->rank() : -1;
  comm->broadcast(&value, 8, subRoot, sub, "bcast parity");
  EXPECT_EQ(value, 4242 + sub[subRoot]);
}

COMM_RANKS_TEST(AllReduceMaxOverWorld) {
  int n = comm->size();
  EXPECT_EQ(comm->allReduceMax(comm->rank() * 3 - 100, "max"), (n - 1) * 3 - 100);
  EXPECT_EQ(comm->allReduceMax(comm->rank() == 2 % n ? 1 : 0, "any"), 1);
  EXPECT_EQ(comm->allReduceMax(-5, "all negative"), -5);
}

COMM_RANKS_TEST(GroupOfOneIsACopy) {
  std::vector<int> self{comm->rank()};
  float data[2] = {1.5f, 2.5f};
  comm->allReduceSum(data, 2, self, "self sum");
  EXPECT_EQ(data[1], 2.5f);
  float out[2] = {0, 0};
  comm->allGather(data, 8, out, self, "self gather");
  EXPECT_EQ(out[0], 1.5f);
  comm->broadcast(data, 8, 0, self, "self bcast");
  EXPECT_EQ(data[0], 1.5f);
}

COMM_RANKS_TEST(InterleavedGroupsReuseCommunicators) {
  // The same groups again, mixed with others: cached communicators.
  for (int round = 0; round < 3; ++round) {
    float a = 1.0f;
    comm->allReduceSum(&a, 1, parityGroup(), fmt::format("round {} parity", round));
    EXPECT_EQ(a, static_cast<float>(parityGroup().size()));
    float b = 1.0f;
    comm->allReduceSum(&b, 1, worldGroup(), fmt::format("round {} world", round));
    EXPECT_EQ(b, static_cast<float>(comm->size()));
  }
}

COMM_RANKS_TEST(BadArgumentsThrow) {
  float x = 0;
  EXPECT_THROW(comm->send(&x, 4, comm->rank(), "send to self"), RuntimeError);
  EXPECT_THROW(comm->recv(&x, 4, comm->size(), "recv out of range"), RuntimeError);
  // A group without the caller.
  std::vector<int> others;
  for (int r = 0; r < comm->size(); ++r)
    if (r != comm->rank())
      others.push_back(r);
  EXPECT_THROW(comm->allReduceSum(&x, 1, others, "not a member"), RuntimeError);
}

COMM_RANKS_TEST(AllReduceSumAddsInMemberOrder) {
  // Values whose float sum depends on the order: member order,
  // ((v0 + v1) + v2) + v3, on every member (MPI's own algorithm would add
  // (v0 + v1) + (v2 + v3) over 4 ranks: 0 here). Also over the world in
  // descending order, where member order is not rank order.
  const float values[4] = {1.0f, 1e8f, -1e8f, 1.0f};
  for (bool reversed : {false, true}) {
    std::vector<int> group = worldGroup();
    if (reversed)
      std::reverse(group.begin(), group.end());
    std::vector<float> data(3);
    for (int i = 0; i < 3; ++i)
      data[i] = values[(comm->rank() + i) % 4] * static_cast<float>(i + 1);
    comm->allReduceSum(data.data(), 3, group, reversed ? "sum descending" : "sum ascending");
    for (int i = 0; i < 3; ++i) {
      float expected = 0;
      for (size_t q = 0; q < group.size(); ++q) {
        const float v = values[(group[q] + i) % 4] * static_cast<float>(i + 1);
        expected = q == 0 ? v : expected + v;
      }
      EXPECT_EQ(data[i], expected) << "value " << i << (reversed ? " (descending)" : "");
    }
  }
}

COMM_RANKS_TEST(FusedSendRecvBothWays) {
  // Ranks 2k and 2k + 1 swap two pieces each at once (a pipeline's fused
  // step): each sends before the other receives.
  const int me = comm->rank(), peer = me ^ 1;
  if (peer >= comm->size())
    return;
  std::vector<int32_t> a(100, me), b(7, me * 10), gotA(100, -1), gotB(7, -1);
  comm->sendRecv({{0, a.data(), 400}, {0, b.data(), 28}}, {{0, gotA.data(), 400}, {0, gotB.data(), 28}},
                 peer, "fused swap");
  EXPECT_EQ(gotA[99], peer);
  EXPECT_EQ(gotB[0], peer * 10);
}

// In-process ranks that call different collectives, or never arrive, end
// the process with a message naming the rank, the step and the group.
TEST(CommInProcessDeath, MismatchedCollectivesEndTheProcess) {
  REQUIRE_LOCAL();
  EXPECT_EXIT(runRanksInProcess(2,
                                [](Comm &rank) {
                                  float x[2] = {1, 2};
                                  if (rank.rank() == 0)
                                    rank.allReduceSum(x, 2, {0, 1}, "step 7 (all_reduce over tp)");
                                  else
                                    rank.broadcast(x, 8, 0, {0, 1}, "step 7 (broadcast over tp)");
                                  return 0;
                                }),
              ::testing::ExitedWithCode(1),
              "rank [01]: step 7 \\((all_reduce|broadcast) over tp\\): this rank calls "
              "(all_reduce of 2 values|broadcast of 8 bytes from member 0) but rank [01] calls");
}

TEST(CommInProcessDeath, AMissingRankTimesOut) {
  REQUIRE_LOCAL();
  EXPECT_EXIT(runRanksInProcess(3,
                                [](Comm &rank) {
                                  rank.setTimeout(0.5);
                                  float x = 1;
                                  if (rank.rank() != 2)
                                    rank.allReduceSum(&x, 1, {0, 1, 2}, "step 3 (all_reduce over dp)");
                                  return 0;
                                }),
              ::testing::ExitedWithCode(1),
              "rank [01]: step 3 \\(all_reduce over dp\\) did not complete within 0.5 s \\(group: "
              "ranks 0,1,2\\)");
}

TEST(CommInProcessDeath, AFailingRankEndsTheOthers) {
  REQUIRE_LOCAL();
  // Rank 1 returns status 2 while rank 0 waits for it in a collective.
  EXPECT_EXIT(runRanksInProcess(2,
                                [](Comm &rank) {
                                  if (rank.rank() == 1)
                                    return 2;
                                  float x = 1;
                                  rank.allReduceSum(&x, 1, {0, 1}, "step 1");
                                  return 0;
                                }),
              ::testing::ExitedWithCode(2), "");
}

TEST(CommLocal, CollectivesAreCopies) {
  REQUIRE_LOCAL();
  EXPECT_EQ(comm->rank(), 0);
  std::vector<int> group{0};
  float data[3] = {1, 2, 3};
  comm->allReduceSum(data, 3, group, "sum");
  EXPECT_EQ(data[2], 3.0f);
  float out[3] = {};
  comm->allGather(data, 12, out, group, "gather");
  EXPECT_EQ(out[1], 2.0f);
  int32_t send[4] = {9, 8, 7, 6}, recv[4] = {};
  comm->exchange({{0, send + 1, 8}, {0, send, 0}, {0, send + 3, 4}},
                 {{0, recv + 2, 8}, {0, recv, 4}}, group, "exchange");
  EXPECT_EQ(recv[2], 8);
  EXPECT_EQ(recv[3], 7);
  EXPECT_EQ(recv[0], 6);
  EXPECT_EQ(recv[1], 0);
  comm->broadcast(data, 12, 0, group, "bcast");
  EXPECT_EQ(data[0], 1.0f);
  EXPECT_EQ(comm->allReduceMax(42, "max"), 42);
}

TEST(CommLocal, PointToPointAndOtherGroupsFail) {
  REQUIRE_LOCAL();
  float x = 0;
  EXPECT_THROW(comm->send(&x, 4, 0, "send to self"), RuntimeError);
  EXPECT_THROW(comm->recv(&x, 4, 0, "recv from self"), RuntimeError);
  EXPECT_THROW(comm->allReduceSum(&x, 1, {0, 1}, "two ranks"), RuntimeError);
  EXPECT_THROW(comm->broadcast(&x, 4, 1, {0}, "bad root"), RuntimeError);
  EXPECT_THROW(comm->exchange({{0, &x, 4}}, {{0, &x, 8}}, {0}, "size mismatch"), RuntimeError);
  EXPECT_THROW(comm->exchange({{0, &x, 4}}, {}, {0}, "piece count mismatch"), RuntimeError);
  EXPECT_THROW(comm->exchange({{1, &x, 4}}, {{1, &x, 4}}, {0}, "member outside"), RuntimeError);
}

// Driven by check-comm-fault.py: MOERT_FAULT=stall:1:2 or kill:1:2 under
// mpirun; rank 1 stalls or dies at its second call, "fault step 2".
TEST(CommFault, StepsUntilTheFault) {
  if (!std::getenv("MOERT_FAULT"))
    GTEST_SKIP() << "needs MOERT_FAULT";
  comm->setTimeout(3);
  for (int step = 1; step <= 5; ++step) {
    float x = 1;
    std::vector<int> group = worldGroup();
    comm->allReduceSum(&x, 1, group, fmt::format("fault step {} (all_reduce over world)", step));
  }
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<Comm> owned = createComm(&argc, &argv);
  comm = owned.get();
  // A failed assertion on one rank must not leave the others waiting long.
  comm->setTimeout(60);
  int status = RUN_ALL_TESTS();
  // The job fails when any rank failed.
  status = static_cast<int>(comm->allReduceMax(status, "test status"));
  return status;
}
