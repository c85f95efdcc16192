// Communication between ranks: what the executor and the devices ask for
// collectives. `createComm` returns the single-process communicator (world
// of one; every group is {0}) unless the process runs under mpirun, where it
// returns the MPI one (Open MPI, host memory); `moert run|train
// --in-process` runs a plan's ranks as threads of one process with a third
// (runtime/src/InProcessComm.h). The CUDA device's NCCL
// communicator (runtime/src/cuda/NcclComm.h) implements the same interface
// for device memory, bootstrapped through the MPI one. The plan's collective
// protocols over it: runtime/src/Collectives.h.
//
// Every call names what it is for (`what`, e.g. "step 37 (all_reduce over
// tp)") so that a failure or a timeout can say which step of which rank did
// not complete. A collective that does not complete within the timeout
// prints `moert: error: rank R: <what> did not complete within S s (group:
// ranks a,b,...)` to stderr and ends the whole job (MPI_Abort), never hangs.
#pragma once

#include "moert/Plan.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moert {

class Comm {
public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Readies the groups the plan's collectives use (every rank calls it, in
  /// the same order, before any collective). `group` arguments below are
  /// lists of world ranks as Plan::groupOf returns them; the caller is a
  /// member.
  virtual void prepare(const Plan &plan) = 0;
  /// Seconds a collective may take before the job is ended (default 300).
  virtual void setTimeout(double seconds) = 0;

  /// Elementwise sum of n floats over the group, in place. The host
  /// communicators (MPI, in-process) add in member order, ((v0 + v1) + v2)
  /// + ..., the same bits on every member and in every run; NCCL adds in
  /// its own order.
  virtual void allReduceSum(float *data, int64_t n, const std::vector<int> &group,
                            const std::string &what) = 0;
  /// out = the members' `bytes` bytes each, concatenated in group order.
  virtual void allGather(const void *in, int64_t bytes, void *out,
                         const std::vector<int> &group, const std::string &what) = 0;
  /// One piece of an exchange: `bytes` bytes to or from group member
  /// `member` (an index into the group).
  struct Piece {
    int member = 0;
    void *data = nullptr;
    int64_t bytes = 0;
  };
  /// Every send and receive of a grouped exchange at once (all_to_all's
  /// counts, then its rows): the pieces this rank sends to member q arrive,
  /// in order, in the pieces member q receives from this rank, which have
  /// the same sizes (a receive of another size is an error). Pieces of zero
  /// bytes may be left out, on both sides alike.
  virtual void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                        const std::vector<int> &group, const std::string &what) = 0;
  /// Point to point (pipeline stages); messages between two ranks arrive in
  /// order.
  virtual void send(const void *data, int64_t bytes, int peer, const std::string &what) = 0;
  virtual void recv(void *data, int64_t bytes, int peer, const std::string &what) = 0;
  /// Sends `sends` to `peer` while receiving `recvs` from it (a pipeline
  /// schedule's fused step: each side sends before the other receives, so
  /// blocking sends would wait for each other); Piece::member is unused.
  virtual void sendRecv(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                        int peer, const std::string &what);
  /// `bytes` bytes from group member `root` (an index into group) to all.
  virtual void broadcast(void *data, int64_t bytes, int root, const std::vector<int> &group,
                         const std::string &what) = 0;
  /// Max of one value over the whole world (e.g. "does any rank have work").
  virtual int64_t allReduceMax(int64_t value, const std::string &what) = 0;
  /// Ends every rank of the job with `message` and exit status `status`
  /// (under mpirun: MPI_Abort's error code, which mpirun exits with; 2 for
  /// bad input, 1 for an internal failure).
  [[noreturn]] virtual void abort(const std::string &message, int status = 1) = 0;
};

/// True when `comm` is the MPI communicator and MPI lets every thread call
/// it (MPI_THREAD_MULTIPLE: requested when the command line has
/// --in-process).
bool mpiAllowsThreads(const Comm &comm);
/// True when this process was started by mpirun (OMPI_COMM_WORLD_SIZE set).
bool underMpirun();
/// The MPI communicator under mpirun, else the single-process one.
/// `rankThreads` (or --in-process in argv): MPI is asked to let every
/// thread call it (MPI_THREAD_MULTIPLE), for rank threads (moert run and
/// train, whose plan may run several ranks a process).
std::unique_ptr<Comm> createComm(int *argc, char ***argv, bool rankThreads = false);

} // namespace moert
