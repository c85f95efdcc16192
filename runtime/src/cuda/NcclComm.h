// NCCL as a moert::Comm over CUDA device memory: the communicator the CUDA
// device hands to the collective protocols (runtime/src/Collectives.h).
// Bootstrapped through the host communicator (the unique id broadcast over
// MPI); one NCCL communicator for the world and one per (mesh, axis) group,
// split from it in the same order on every rank. Collectives are enqueued on
// the device's stream; what only the host knows (allReduceMax, abort, the
// timeout) goes to the host communicator.
#pragma once

#include "CudaApi.h"
#include "moert/Comm.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

namespace moert::cuda {

class NcclComm final : public Comm {
public:
  NcclComm(const Api &api, Comm &host, CUstream stream);
  ~NcclComm() override;

  int rank() const override { return host.rank(); }
  int size() const override { return host.size(); }
  void prepare(const Plan &plan) override;
  void setTimeout(double seconds) override { host.setTimeout(seconds); }
  void allReduceSum(float *data, int64_t n, const std::vector<int> &group,
                    const std::string &what) override;
  void allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &group,
                 const std::string &what) override;
  void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                const std::vector<int> &group, const std::string &what) override;
  void send(const void *data, int64_t bytes, int peer, const std::string &what) override;
  void recv(void *data, int64_t bytes, int peer, const std::string &what) override;
  void broadcast(void *data, int64_t bytes, int root, const std::vector<int> &group,
                 const std::string &what) override;
  int64_t allReduceMax(int64_t value, const std::string &what) override {
    return host.allReduceMax(value, what);
  }
  [[noreturn]] void abort(const std::string &message, int status = 1) override {
    host.abort(message, status);
    std::abort(); // not reached: the host communicator ends the process
  }

private:
  ncclComm_t commOf(const std::vector<int> &group, const std::string &what) const;
  cudaStream_t cudaStream() const { return reinterpret_cast<cudaStream_t>(stream); }

  const Api &api;
  Comm &host;
  CUstream stream;
  ncclComm_t world = nullptr;
  std::vector<ncclComm_t> splits;                 ///< to destroy
  std::map<std::vector<int>, ncclComm_t> groups;  ///< world ranks -> communicator
};

} // namespace moert::cuda
