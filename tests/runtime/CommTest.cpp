// moert::Comm: the single-process communicator (run plainly) and the MPI one
// (run under `mpirun -np 4`; the MPI tests skip in a world of one, the
// single-process ones skip under mpirun). CommFault.* runs only with
// MOERT_FAULT set (tests/runtime/check-comm-fault.py).
#include "moert/Comm.h"
#include "moert/Error.h"

#include <gtest/gtest.h>

#include <fmt/core.h>

#include <cstdlib>
#include <numeric>

using namespace moert;

namespace {

Comm *comm = nullptr;

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

#define REQUIRE_LOCAL()                                                                            \
  if (comm->size() != 1)                                                                           \
  GTEST_SKIP() << "the single-process communicator (run without mpirun)"

TEST(CommMpi, AllReduceSumWorld) {
  REQUIRE_MPI();
  int n = comm->size();
  std::vector<float> data(100003);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(comm->rank() + (i % 7));
  comm->allReduceSum(data.data(), static_cast<int64_t>(data.size()), worldGroup(), "sum world");
  for (size_t i = 0; i < data.size(); ++i)
    ASSERT_EQ(data[i], static_cast<float>(n * (n - 1) / 2 + n * (i % 7))) << i;
}

TEST(CommMpi, AllReduceSumSubsetGroups) {
  REQUIRE_MPI();
  std::vector<int> group = parityGroup();
  std::vector<float> data{1.0f, static_cast<float>(comm->rank())};
  comm->allReduceSum(data.data(), 2, group, "sum parity");
  float expected = 0;
  for (int r : group)
    expected += static_cast<float>(r);
  EXPECT_EQ(data[0], static_cast<float>(group.size()));
  EXPECT_EQ(data[1], expected);
}

TEST(CommMpi, AllGatherInGroupOrder) {
  REQUIRE_MPI();
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

TEST(CommMpi, ExchangeUnevenPiecesInOrder) {
  REQUIRE_MPI();
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

TEST(CommMpi, ExchangeWithZeroPiecesLeftOutInSubset) {
  REQUIRE_MPI();
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

TEST(CommMpi, SendRecvInOrder) {
  REQUIRE_MPI();
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

TEST(CommMpi, SendRecvPipelineChain) {
  REQUIRE_MPI();
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

TEST(CommMpi, BroadcastFromRoot) {
  REQUIRE_MPI();
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

TEST(CommMpi, AllReduceMaxOverWorld) {
  REQUIRE_MPI();
  int n = comm->size();
  EXPECT_EQ(comm->allReduceMax(comm->rank() * 3 - 100, "max"), (n - 1) * 3 - 100);
  EXPECT_EQ(comm->allReduceMax(comm->rank() == 2 % n ? 1 : 0, "any"), 1);
  EXPECT_EQ(comm->allReduceMax(-5, "all negative"), -5);
}

TEST(CommMpi, GroupOfOneIsACopy) {
  REQUIRE_MPI();
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

TEST(CommMpi, InterleavedGroupsReuseCommunicators) {
  REQUIRE_MPI();
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

TEST(CommMpi, BadArgumentsThrow) {
  REQUIRE_MPI();
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
