// A fake NCCL over MPI on host memory (test infrastructure only; README.md).
// It exports every NCCL entry point moert's CUDA device loads (runtime/src/
// cuda/CudaApi.cpp) with the signatures of the toolkit's nccl.h, and runs
// them with MPI in a process that moert's communicator (moert::Comm) has
// already initialised under mpirun: it links the same libmpi.
//
// - A communicator is an MPI communicator of its own: ncclCommInitRank dups
//   MPI_COMM_WORLD (nranks and rank must be the world's; every rank must
//   pass the same unique id), ncclCommSplit is MPI_Comm_split(color, key).
//   Peers and roots are ranks of the given communicator, as in NCCL.
// - Buffers are host pointers (the fake CUDA driver's device memory).
// - Streams: the fake driver's streams are synchronous, so an operation runs
//   at the call, unless its stream is capturing a graph: then it is recorded
//   into the graph (moe_fake_cuda_record) and runs at each replay, as NCCL
//   kernels captured into a CUDA graph do.
// - Groups: between ncclGroupStart and the outermost ncclGroupEnd the
//   operations are only queued; ncclGroupEnd posts them all (MPI_Isend,
//   MPI_Irecv, MPI_Iallreduce, ...) and waits for all, so sends and receives
//   of one group may come in any order. Outside a group an operation
//   completes by itself; a send is synchronous (MPI_Ssend: it returns once
//   the peer's receive has started), as NCCL's send does not complete before
//   the peer's receive runs, so an unmatched send order deadlocks here too.
// - Stricter than NCCL: the ranks of a collective must pass the same count
//   (checked with an extra MPI_Allreduce; NCCL would hang or corrupt
//   memory), every send needs its matching receive, zero-sized ones
//   included; a reduction supports sum/prod/max/min on float, double,
//   int32, uint32, int64 and uint64 (ncclInvalidArgument otherwise: f16,
//   bf16, fp8 and avg are not implemented). Errors are printed on stderr
//   ("fake-nccl: ...") and returned; an error in a replayed graph aborts.
// - MOE_FAKE_CUDA_STATS=1 prints at exit what ran (communicators,
//   all_reduce, all_gather, broadcast, send, recv calls; operations
//   captured into graphs and run by replays).
#include <cuda.h>
// The C API only (Open MPI's mpi.h would pull in its C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

// The fake CUDA driver (fake_cuda.cpp): whether a stream is capturing, and
// recording an operation into its graph.
extern "C" int moe_fake_cuda_capturing(CUstream stream);
extern "C" CUresult moe_fake_cuda_record(CUstream stream, void (*run)(void *), void *arg,
                                         void (*release)(void *));

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 0;
};

namespace {

struct Stats {
  long comms = 0, allReduces = 0, allGathers = 0, broadcasts = 0, sends = 0, recvs = 0,
       captured = 0, replayed = 0;
  ~Stats() {
    if (std::getenv("MOE_FAKE_CUDA_STATS") && comms)
      std::fprintf(stderr,
                   "fake-nccl: %ld communicator(s), %ld all_reduce, %ld all_gather, %ld "
                   "broadcast, %ld send, %ld recv, %ld captured into graphs, %ld run by "
                   "replays\n",
                   comms, allReduces, allGathers, broadcasts, sends, recvs, captured, replayed);
  }
} stats;

ncclResult_t fail(ncclResult_t r, const char *format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fprintf(stderr, "fake-nccl: ");
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  return r;
}

/// The MPI datatype of an NCCL type (MPI_DATATYPE_NULL: not supported).
MPI_Datatype mpiType(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: return MPI_INT8_T;
  case ncclUint8: return MPI_UINT8_T;
  case ncclInt32: return MPI_INT32_T;
  case ncclUint32: return MPI_UINT32_T;
  case ncclInt64: return MPI_INT64_T;
  case ncclUint64: return MPI_UINT64_T;
  case ncclFloat32: return MPI_FLOAT;
  case ncclFloat64: return MPI_DOUBLE;
  case ncclFloat16:
  case ncclBfloat16: return MPI_UINT16_T; // moved, never reduced
  case ncclFloat8e4m3:
  case ncclFloat8e5m2: return MPI_UINT8_T;
  default: return MPI_DATATYPE_NULL;
  }
}

size_t typeSize(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  default: return 8;
  }
}

bool reducible(ncclDataType_t t) {
  return t == ncclInt32 || t == ncclUint32 || t == ncclInt64 || t == ncclUint64 ||
         t == ncclFloat32 || t == ncclFloat64;
}

MPI_Op mpiOp(ncclRedOp_t op) {
  switch (op) {
  case ncclSum: return MPI_SUM;
  case ncclProd: return MPI_PROD;
  case ncclMax: return MPI_MAX;
  case ncclMin: return MPI_MIN;
  default: return MPI_OP_NULL;
  }
}

/// One queued operation: `post` starts it (appending its requests), then the
/// group waits for all of them. `check` runs first, blocking, on every rank
/// in the same order (the count checks of collectives).
struct Work {
  std::function<ncclResult_t()> check;
  std::function<ncclResult_t(std::vector<MPI_Request> &)> post;
  std::function<ncclResult_t()> blocking; // outside a group
  std::function<ncclResult_t(const MPI_Status &)> verify; // of its (one) request
  cudaStream_t stream = nullptr;
};

/// Runs a list of operations: checks, posts, waits.
ncclResult_t execute(const std::vector<Work> &works) {
  for (const Work &w : works)
    if (w.check)
      if (ncclResult_t r = w.check(); r != ncclSuccess)
        return r;
  if (works.size() == 1 && works[0].blocking)
    return works[0].blocking();
  std::vector<MPI_Request> requests;
  std::vector<const Work *> owners;
  for (const Work &w : works) {
    if (ncclResult_t r = w.post(requests); r != ncclSuccess)
      return r;
    owners.resize(requests.size(), &w);
  }
  std::vector<MPI_Status> statuses(requests.size());
  if (!requests.empty() &&
      MPI_Waitall(static_cast<int>(requests.size()), requests.data(), statuses.data()) !=
          MPI_SUCCESS)
    return fail(ncclSystemError, "MPI_Waitall failed (a send longer than its receive?)");
  for (size_t i = 0; i < requests.size(); ++i)
    if (owners[i]->verify)
      if (ncclResult_t r = owners[i]->verify(statuses[i]); r != ncclSuccess)
        return r;
  return ncclSuccess;
}

struct Recorded {
  std::vector<Work> works;
};

void replay(void *arg) {
  ++stats.replayed;
  if (ncclResult_t r = execute(static_cast<Recorded *>(arg)->works); r != ncclSuccess) {
    std::fprintf(stderr, "fake-nccl: an operation replayed by a CUDA graph failed (%d)\n", r);
    std::abort();
  }
}

void release(void *arg) { delete static_cast<Recorded *>(arg); }

/// Runs `works` on `stream` now, or records them into its graph.
ncclResult_t submit(std::vector<Work> works, cudaStream_t stream) {
  if (works.empty())
    return ncclSuccess;
  auto cu = reinterpret_cast<CUstream>(stream);
  if (cu && moe_fake_cuda_capturing(cu)) {
    for (const Work &w : works)
      if (w.stream != stream)
        return fail(ncclInvalidUsage, "a group spans several streams while one captures a "
                                      "graph (not supported by the fake)");
    auto *rec = new Recorded{std::move(works)};
    stats.captured += static_cast<long>(rec->works.size());
    if (moe_fake_cuda_record(cu, replay, rec, release) != CUDA_SUCCESS)
      return fail(ncclUnhandledCudaError, "cannot record into the capturing stream's graph");
    return ncclSuccess;
  }
  return execute(works);
}

thread_local int groupDepth = 0;
thread_local std::vector<Work> groupWorks;
thread_local ncclResult_t groupError = ncclSuccess;

ncclResult_t enqueue(Work w) {
  if (groupDepth > 0) {
    w.blocking = nullptr;
    groupWorks.push_back(std::move(w));
    return ncclSuccess;
  }
  cudaStream_t s = w.stream;
  std::vector<Work> one;
  one.push_back(std::move(w));
  return submit(std::move(one), s);
}

/// Inside enqueue calls: an error is remembered for the group's end.
ncclResult_t argumentError(ncclResult_t r) {
  if (groupDepth > 0 && groupError == ncclSuccess)
    groupError = r;
  return r;
}

bool mpiReady() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

/// All ranks of `c` pass the same count (stricter than NCCL, which trusts it).
std::function<ncclResult_t()> sameCount(ncclComm_t c, size_t count, const char *what) {
  return [c, count, what]() {
    long long mine[2] = {static_cast<long long>(count), -static_cast<long long>(count)}, all[2];
    if (MPI_Allreduce(mine, all, 2, MPI_LONG_LONG, MPI_MAX, c->comm) != MPI_SUCCESS)
      return fail(ncclSystemError, "%s: MPI_Allreduce of the counts failed", what);
    if (all[0] != -all[1])
      return fail(ncclInvalidUsage,
                  "%s: the ranks of the communicator pass different counts (%lld to %lld; "
                  "rank %d of %d passes %zu)",
                  what, -all[1], all[0], c->rank, c->size, count);
    return ncclSuccess;
  };
}

ncclResult_t checkComm(ncclComm_t c, const char *what) {
  if (!c || c->comm == MPI_COMM_NULL)
    return fail(ncclInvalidArgument, "%s: null communicator", what);
  return ncclSuccess;
}

} // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id)
    return fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
  std::random_device device;
  std::mt19937_64 random((static_cast<uint64_t>(device()) << 32) ^ device() ^
                         static_cast<uint64_t>(getpid()));
  for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; i += 8) {
    uint64_t v = random();
    std::memcpy(id->internal + i, &v, 8);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm)
    return fail(ncclInvalidArgument, "ncclCommInitRank: null comm");
  *comm = nullptr;
  if (!mpiReady())
    return fail(ncclSystemError, "ncclCommInitRank: MPI is not initialised (the fake NCCL "
                                 "runs in a process that mpirun started and moert's "
                                 "communicator initialised)");
  int worldSize = 0, worldRank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
  if (nranks != worldSize || rank != worldRank)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: rank %d of %d, but this process is MPI rank %d of %d (the "
                "fake's world communicator is MPI_COMM_WORLD)",
                rank, nranks, worldRank, worldSize);
  auto c = std::make_unique<ncclComm>();
  if (MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS)
    return fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  c->rank = rank;
  c->size = nranks;
  // Every rank must have been given rank 0's id (as NCCL, which connects
  // to the id's address, requires).
  ncclUniqueId root = id;
  MPI_Bcast(root.internal, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, 0, c->comm);
  int same = std::memcmp(root.internal, id.internal, NCCL_UNIQUE_ID_BYTES) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, c->comm);
  if (!all) {
    MPI_Comm_free(&c->comm);
    return fail(ncclInvalidUsage, "ncclCommInitRank: the ranks were given different unique ids%s",
                same ? "" : " (this one differs from rank 0's)");
  }
  ++stats.comms;
  *comm = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *) {
  if (ncclResult_t r = checkComm(comm, "ncclCommSplit"); r != ncclSuccess)
    return r;
  if (!newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR))
    return fail(ncclInvalidArgument, "ncclCommSplit: color %d", color);
  *newcomm = nullptr;
  MPI_Comm split = MPI_COMM_NULL;
  if (MPI_Comm_split(comm->comm, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key,
                     &split) != MPI_SUCCESS)
    return fail(ncclSystemError, "ncclCommSplit: MPI_Comm_split failed");
  if (split == MPI_COMM_NULL)
    return ncclSuccess; // NCCL_SPLIT_NOCOLOR: no communicator
  auto *c = new ncclComm;
  c->comm = split;
  MPI_Comm_set_errhandler(split, MPI_ERRORS_RETURN);
  MPI_Comm_rank(split, &c->rank);
  MPI_Comm_size(split, &c->size);
  ++stats.comms;
  *newcomm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm)
    return ncclSuccess;
  // moert's communicator may have finalised MPI already (at exit).
  if (comm->comm != MPI_COMM_NULL && mpiReady())
    MPI_Comm_free(&comm->comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm || !asyncError)
    return ncclInvalidArgument;
  *asyncError = ncclSuccess; // operations complete (or fail) synchronously
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = checkComm(comm, "ncclAllReduce"); r != ncclSuccess)
    return argumentError(r);
  if (!reducible(datatype) || mpiOp(op) == MPI_OP_NULL)
    return argumentError(fail(ncclInvalidArgument,
                              "ncclAllReduce: type %d / op %d not supported by the fake",
                              static_cast<int>(datatype), static_cast<int>(op)));
  if (count > static_cast<size_t>(INT32_MAX))
    return argumentError(fail(ncclInvalidArgument, "ncclAllReduce: count %zu", count));
  ++stats.allReduces;
  MPI_Datatype t = mpiType(datatype);
  MPI_Op o = mpiOp(op);
  const int n = static_cast<int>(count);
  const void *src = sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
  Work w;
  w.stream = stream;
  w.check = sameCount(comm, count, "ncclAllReduce");
  w.post = [=](std::vector<MPI_Request> &req) {
    req.emplace_back();
    return MPI_Iallreduce(src, recvbuff, n, t, o, comm->comm, &req.back()) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Iallreduce failed");
  };
  w.blocking = [=]() {
    return MPI_Allreduce(src, recvbuff, n, t, o, comm->comm) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Allreduce failed");
  };
  return enqueue(std::move(w));
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = checkComm(comm, "ncclAllGather"); r != ncclSuccess)
    return argumentError(r);
  MPI_Datatype t = mpiType(datatype);
  if (t == MPI_DATATYPE_NULL || sendcount > static_cast<size_t>(INT32_MAX))
    return argumentError(fail(ncclInvalidArgument, "ncclAllGather: type %d, count %zu",
                              static_cast<int>(datatype), sendcount));
  ++stats.allGathers;
  const int n = static_cast<int>(sendcount);
  // In place: the send buffer is this rank's block of the receive buffer.
  const bool inPlace = static_cast<const char *>(sendbuff) ==
                       static_cast<char *>(recvbuff) + comm->rank * sendcount * typeSize(datatype);
  const void *src = inPlace ? MPI_IN_PLACE : sendbuff;
  Work w;
  w.stream = stream;
  w.check = sameCount(comm, sendcount, "ncclAllGather");
  w.post = [=](std::vector<MPI_Request> &req) {
    req.emplace_back();
    return MPI_Iallgather(src, n, t, recvbuff, n, t, comm->comm, &req.back()) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Iallgather failed");
  };
  w.blocking = [=]() {
    return MPI_Allgather(src, n, t, recvbuff, n, t, comm->comm) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Allgather failed");
  };
  return enqueue(std::move(w));
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (ncclResult_t r = checkComm(comm, "ncclBroadcast"); r != ncclSuccess)
    return argumentError(r);
  MPI_Datatype t = mpiType(datatype);
  if (t == MPI_DATATYPE_NULL || count > static_cast<size_t>(INT32_MAX) || root < 0 ||
      root >= comm->size)
    return argumentError(fail(ncclInvalidArgument, "ncclBroadcast: type %d, count %zu, root %d",
                              static_cast<int>(datatype), count, root));
  ++stats.broadcasts;
  const int n = static_cast<int>(count);
  const size_t bytes = count * typeSize(datatype);
  const bool isRoot = comm->rank == root;
  auto copyRoot = [=]() {
    if (isRoot && sendbuff != recvbuff && bytes)
      std::memmove(recvbuff, sendbuff, bytes);
  };
  Work w;
  w.stream = stream;
  w.check = sameCount(comm, count, "ncclBroadcast");
  w.post = [=](std::vector<MPI_Request> &req) {
    copyRoot();
    req.emplace_back();
    return MPI_Ibcast(recvbuff, n, t, root, comm->comm, &req.back()) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Ibcast failed");
  };
  w.blocking = [=]() {
    copyRoot();
    return MPI_Bcast(recvbuff, n, t, root, comm->comm) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Bcast failed");
  };
  return enqueue(std::move(w));
}

// Point to point: one MPI tag; MPI keeps the order of messages between a
// pair of ranks on one communicator, as NCCL matches its sends and receives.
constexpr int kTag = 7;

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = checkComm(comm, "ncclSend"); r != ncclSuccess)
    return argumentError(r);
  MPI_Datatype t = mpiType(datatype);
  if (t == MPI_DATATYPE_NULL || count > static_cast<size_t>(INT32_MAX) || peer < 0 ||
      peer >= comm->size)
    return argumentError(fail(ncclInvalidArgument,
                              "ncclSend: type %d, count %zu, peer %d of a communicator of %d",
                              static_cast<int>(datatype), count, peer, comm->size));
  ++stats.sends;
  const int n = static_cast<int>(count);
  Work w;
  w.stream = stream;
  w.post = [=](std::vector<MPI_Request> &req) {
    req.emplace_back();
    return MPI_Isend(sendbuff, n, t, peer, kTag, comm->comm, &req.back()) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Isend failed");
  };
  w.blocking = [=]() {
    return MPI_Ssend(sendbuff, n, t, peer, kTag, comm->comm) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Ssend failed");
  };
  return enqueue(std::move(w));
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = checkComm(comm, "ncclRecv"); r != ncclSuccess)
    return argumentError(r);
  MPI_Datatype t = mpiType(datatype);
  if (t == MPI_DATATYPE_NULL || count > static_cast<size_t>(INT32_MAX) || peer < 0 ||
      peer >= comm->size)
    return argumentError(fail(ncclInvalidArgument,
                              "ncclRecv: type %d, count %zu, peer %d of a communicator of %d",
                              static_cast<int>(datatype), count, peer, comm->size));
  ++stats.recvs;
  const int n = static_cast<int>(count);
  const int self = comm->rank;
  Work w;
  w.stream = stream;
  // A receive must get exactly `count` elements (NCCL's sizes must match).
  auto checkSize = [=](const MPI_Status &status) {
    int got = 0;
    MPI_Get_count(&status, t, &got);
    return got == n ? ncclSuccess
                    : fail(ncclInvalidUsage, "ncclRecv: rank %d expected %d elements from peer "
                                             "%d, which sent %d",
                           self, n, peer, got);
  };
  w.verify = checkSize;
  w.post = [=](std::vector<MPI_Request> &req) {
    req.emplace_back();
    return MPI_Irecv(recvbuff, n, t, peer, kTag, comm->comm, &req.back()) == MPI_SUCCESS
               ? ncclSuccess
               : fail(ncclSystemError, "MPI_Irecv failed");
  };
  w.blocking = [=]() {
    MPI_Status status;
    if (MPI_Recv(recvbuff, n, t, peer, kTag, comm->comm, &status) != MPI_SUCCESS)
      return fail(ncclSystemError, "MPI_Recv failed");
    return checkSize(status);
  };
  return enqueue(std::move(w));
}

ncclResult_t ncclGroupStart() {
  if (groupDepth++ == 0) {
    groupWorks.clear();
    groupError = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (groupDepth == 0)
    return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--groupDepth > 0)
    return ncclSuccess;
  std::vector<Work> works;
  works.swap(groupWorks);
  if (groupError != ncclSuccess)
    return groupError;
  if (works.empty())
    return ncclSuccess;
  cudaStream_t stream = works[0].stream;
  return submit(std::move(works), stream);
}

} // extern "C"
