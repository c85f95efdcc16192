//===- Cluster.h - the machine a plan is made for ---------------*- C++ -*-===//
//
// A cluster is `nodes` nodes of `devicesPerNode` identical devices; a rank is
// one device (a process on the `cpu` machine). Ranks are numbered node-major:
// rank r lives on node r / devicesPerNode. Figures are per device, in SI units
// (bytes, FLOP/s, bytes/s, seconds). Link bandwidths are what one device can
// send in one direction at the same time as it receives (NVLink "900 GB/s" is
// 450 GB/s each way; InfiniBand is the NIC rate of one device's NIC).
//
// Built-in machines: h100, h200, a100, b200 (8 GPUs per node, datasheet
// figures; sources in Cluster.cpp and compiler/machines/README.md) and cpu
// (this development box). compiler/machines/*.json hold the same figures in
// the `--cluster FILE` format documented in compiler/machines/README.md.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_ANALYSIS_CLUSTER_H
#define MOE_ANALYSIS_CLUSTER_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <cstdint>
#include <optional>
#include <string>

namespace moe::sharding {

/// Element types the cost model distinguishes.
enum class DType { F32, F16, BF16, FP8 };
/// Bytes per element: 4, 2, 2, 1.
int64_t dtypeBytes(DType t);
/// The plan format's spelling: "F32", "F16", "BF16", "FP8".
llvm::StringRef dtypeName(DType t);
/// Accepts config.json's `torch_dtype` spellings (float32, bfloat16, float16)
/// and the short ones (f32, fp32, bf16, f16, fp16, fp8, float8_e4m3fn).
std::optional<DType> parseDType(llvm::StringRef s);

/// A point-to-point link as one device sees it.
struct Link {
  double bandwidth = 0; ///< bytes/s per direction per device
  double latency = 0;   ///< seconds per collective or message
};

struct Cluster {
  std::string name;        ///< "h100", or the file's `name` (else its path)
  std::string description; ///< one line, with the figures' origin
  int64_t nodes = 1;
  int64_t devicesPerNode = 1;
  /// Ranks in use: at most nodes x devicesPerNode (the last node may be
  /// partly used). makeCluster and withWorldSize set it.
  int64_t worldSize = 1;

  int64_t memoryBytes = 0; ///< per device
  double peakBF16 = 0;     ///< dense tensor-core FLOP/s (also used for F16)
  double peakFP8 = 0;      ///< dense FLOP/s; = peakBF16 where fp8 has no units
  double peakFP32 = 0;     ///< FLOP/s (non-tensor-core FP32)
  double memoryBandwidth = 0; ///< HBM / DRAM bytes/s
  Link intraNode;             ///< NVLink / NVSwitch (cpu: shared memory)
  Link interNode;             ///< InfiniBand per device (cpu: shared memory)

  double peakFlops(DType t) const;
  int64_t nodeOf(int64_t rank) const { return rank / devicesPerNode; }
};

/// "h100, h200, a100, b200, cpu".
llvm::ArrayRef<llvm::StringRef> builtinClusterNames();

/// One node of a built-in machine (worldSize = devicesPerNode). Fails with
/// `--gpu NAME: unknown machine; expected one of h100, h200, a100, b200, cpu`.
llvm::Expected<Cluster> builtinCluster(llvm::StringRef gpu);

/// `worldSize` ranks of a built-in machine: nodes = ceil(worldSize /
/// devicesPerNode) (for cpu, one rank per node). Fails on an unknown name or
/// `--world-size N: expected a positive integer`.
llvm::Expected<Cluster> makeCluster(llvm::StringRef gpu, int64_t worldSize);

/// The same cluster using `worldSize` of its devices. Fails with
/// `--world-size N: expected at most D (nodes x devices_per_node of NAME)`.
llvm::Expected<Cluster> withWorldSize(const Cluster &c, int64_t worldSize);

/// Reads a `--cluster FILE` description (format: compiler/machines/README.md);
/// worldSize = nodes x devices_per_node. Errors name the file and the field:
/// `my.json: field 'device.memory_bytes': expected a positive number`.
llvm::Expected<Cluster> loadClusterFile(llvm::StringRef path);
/// The same from text already read (`path` only names it in messages).
llvm::Expected<Cluster> parseClusterJSON(llvm::StringRef text,
                                         llvm::StringRef path);
/// The file format (round-trips through parseClusterJSON).
llvm::json::Value clusterToJSON(const Cluster &c);

} // namespace moe::sharding

#endif // MOE_ANALYSIS_CLUSTER_H
