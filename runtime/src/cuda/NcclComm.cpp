#include "NcclComm.h"

#include "moert/Error.h"

#include <algorithm>

namespace moert::cuda {

NcclComm::NcclComm(const Api &api, Comm &host, CUstream stream)
    : api(api), host(host), stream(stream) {}

NcclComm::~NcclComm() {
  for (ncclComm_t c : splits)
    api.ncclCommDestroy(c);
  if (world)
    api.ncclCommDestroy(world);
}

/// One world communicator (its id broadcast through the host communicator),
/// then one per (mesh, axis) split from it, in the same order everywhere.
void NcclComm::prepare(const Plan &plan) {
  const int me = host.rank();
  ncclUniqueId id;
  if (me == 0)
    check(api.ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<int> all(static_cast<size_t>(plan.worldSize));
  for (int r = 0; r < plan.worldSize; ++r)
    all[r] = r;
  host.broadcast(&id, sizeof id, 0, all, "NCCL bootstrap (unique id)");
  check(api.ncclCommInitRank(&world, static_cast<int>(plan.worldSize), id, me),
        "ncclCommInitRank");
  groups[all] = world;
  using M = CollectiveGroup::Mesh;
  using A = CollectiveGroup::Axis;
  const std::pair<M, A> kinds[] = {{M::Attention, A::PP}, {M::Attention, A::DP},
                                   {M::Attention, A::TP}, {M::Experts, A::EDP},
                                   {M::Experts, A::EP},    {M::Experts, A::ETP}};
  for (auto [mesh, axis] : kinds) {
    std::vector<int> members = plan.groupOf(me, CollectiveGroup{mesh, axis});
    int color = *std::min_element(members.begin(), members.end());
    int key = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
    ncclComm_t split;
    check(api.ncclCommSplit(world, color, key, &split, nullptr), "ncclCommSplit");
    splits.push_back(split);
    groups.emplace(members, split); // the first of equal groups serves them all
  }
}

ncclComm_t NcclComm::commOf(const std::vector<int> &group, const std::string &what) const {
  auto found = groups.find(group);
  if (found == groups.end())
    runtimeError("{}: no NCCL communicator for the group of ranks {}", what,
                 fmt::join(group, ","));
  return found->second;
}

void NcclComm::allReduceSum(float *data, int64_t n, const std::vector<int> &group,
                            const std::string &what) {
  check(api.ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum,
                          commOf(group, what), cudaStream()),
        what.c_str());
}

void NcclComm::allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &group,
                         const std::string &what) {
  check(api.ncclAllGather(in, out, static_cast<size_t>(bytes), ncclInt8, commOf(group, what),
                          cudaStream()),
        what.c_str());
}

void NcclComm::exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                        const std::vector<int> &group, const std::string &what) {
  ncclComm_t c = commOf(group, what);
  const int n = static_cast<int>(group.size());
  check(api.ncclGroupStart(), what.c_str());
  for (const std::vector<Piece> *list : {&sends, &recvs})
    for (const Piece &p : *list) {
      if (p.member < 0 || p.member >= n || p.bytes < 0)
        runtimeError("{}: exchange piece of {} bytes with member {} of a group of {}", what,
                     p.bytes, p.member, n);
      if (p.bytes == 0)
        continue;
      check(list == &sends ? api.ncclSend(p.data, static_cast<size_t>(p.bytes), ncclInt8,
                                          p.member, c, cudaStream())
                           : api.ncclRecv(p.data, static_cast<size_t>(p.bytes), ncclInt8,
                                          p.member, c, cudaStream()),
            what.c_str());
    }
  check(api.ncclGroupEnd(), what.c_str());
}

void NcclComm::send(const void *data, int64_t bytes, int peer, const std::string &what) {
  check(api.ncclSend(data, static_cast<size_t>(bytes), ncclInt8, peer, world, cudaStream()),
        what.c_str());
}

void NcclComm::recv(void *data, int64_t bytes, int peer, const std::string &what) {
  check(api.ncclRecv(data, static_cast<size_t>(bytes), ncclInt8, peer, world, cudaStream()),
        what.c_str());
}

void NcclComm::broadcast(void *data, int64_t bytes, int root, const std::vector<int> &group,
                         const std::string &what) {
  check(api.ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclInt8, root,
                          commOf(group, what), cudaStream()),
        what.c_str());
}

} // namespace moert::cuda
