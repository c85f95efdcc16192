//===- Cluster.cpp - built-in machines, --cluster files ---------*- C++ -*-===//
//
// Datasheet figures (dense, i.e. without 2:4 sparsity; per GPU):
//
// h100  NVIDIA H100 SXM5 80GB, in a DGX/HGX H100 (8 GPUs, NVSwitch):
//       https://www.nvidia.com/en-us/data-center/h100/ (H100 datasheet):
//       FP32 67 TFLOPS, BF16 1,979 TFLOPS and FP8 3,958 TFLOPS *with
//       sparsity* (989.4 / 1,978.9 dense), HBM3 80 GB at 3.35 TB/s, NVLink
//       900 GB/s (bidirectional). DGX H100 user guide / datasheet
//       (https://www.nvidia.com/en-us/data-center/dgx-h100/): 8x ConnectX-7
//       400 Gb/s InfiniBand NDR, one per GPU (50 GB/s).
// h200  NVIDIA H200 SXM 141GB (https://www.nvidia.com/en-us/data-center/h200/):
//       same compute as H100 SXM, HBM3e 141 GB at 4.8 TB/s, NVLink 900 GB/s;
//       DGX/HGX H200: 8x ConnectX-7 400 Gb/s (50 GB/s per GPU).
// a100  NVIDIA A100 SXM4 80GB (https://www.nvidia.com/en-us/data-center/a100/):
//       FP32 19.5 TFLOPS, BF16 312 TFLOPS dense, no FP8 tensor cores (fp8
//       runs at the BF16 rate here), HBM2e 80 GB at 2,039 GB/s, NVLink 3
//       600 GB/s; DGX A100: 8x ConnectX-6 200 Gb/s HDR (25 GB/s per GPU).
// b200  NVIDIA HGX/DGX B200 (https://www.nvidia.com/en-us/data-center/hgx/,
//       https://www.nvidia.com/en-us/data-center/dgx-b200/): per GPU (the
//       8-GPU figures / 8) FP8 9 PFLOPS and BF16 4.5 PFLOPS with sparsity
//       (4.5 / 2.25 dense), FP32 75 TFLOPS, HBM3e 180 GB (1,440 GB per
//       system) at 8 TB/s, NVLink 5 1.8 TB/s (bidirectional); DGX B200:
//       8x ConnectX-7 400 Gb/s (50 GB/s per GPU).
// cpu   this development box: 2 AMD EPYC cores, 228 GFLOP/s fp32 (AVX-512
//       FMA, measured by `moe-bench machine`), 33 GB/s STREAM triad
//       (measured), 24 GiB; a rank
//       is a process and ranks talk through shared memory (~10 GB/s copies),
//       so the intra- and inter-node links are the same.
//
// Memory capacities are the datasheet "GB" read as GiB (HBM stacks come in
// binary sizes: nvidia-smi shows 81,559 MiB on an H100 80GB). Latencies are
// not datasheet figures: typical NCCL small-message latencies (NVLink ~3 us,
// InfiniBand ~10 us) used as the fixed cost of one collective.
//
//===----------------------------------------------------------------------===//
#include "moe/Analysis/Cluster.h"
#include "moe/Support/JsonFields.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>

using namespace llvm;
using namespace moe::sharding;
using moe::json_fields::Fields;

int64_t moe::sharding::dtypeBytes(DType t) {
  switch (t) {
  case DType::F32:
    return 4;
  case DType::F16:
  case DType::BF16:
    return 2;
  case DType::FP8:
    return 1;
  }
  return 4;
}

StringRef moe::sharding::dtypeName(DType t) {
  switch (t) {
  case DType::F32:
    return "F32";
  case DType::F16:
    return "F16";
  case DType::BF16:
    return "BF16";
  case DType::FP8:
    return "FP8";
  }
  return "F32";
}

std::optional<DType> moe::sharding::parseDType(StringRef s) {
  std::string l = s.lower();
  if (l == "float32" || l == "f32" || l == "fp32" || l == "float")
    return DType::F32;
  if (l == "bfloat16" || l == "bf16")
    return DType::BF16;
  if (l == "float16" || l == "f16" || l == "fp16" || l == "half")
    return DType::F16;
  if (l == "fp8" || l == "f8" || l == "float8_e4m3fn" || l == "e4m3")
    return DType::FP8;
  return std::nullopt;
}

double Cluster::peakFlops(DType t) const {
  switch (t) {
  case DType::F32:
    return peakFP32;
  case DType::F16:
  case DType::BF16:
    return peakBF16;
  case DType::FP8:
    return peakFP8;
  }
  return peakFP32;
}

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

Cluster gpuNode(StringRef name, StringRef description, int64_t memGiB,
                double bf16, double fp8, double fp32, double hbm, double nvlink,
                double ib) {
  Cluster c;
  c.name = name.str();
  c.description = description.str();
  c.nodes = 1;
  c.devicesPerNode = 8;
  c.worldSize = 8;
  c.memoryBytes = memGiB * kGiB;
  c.peakBF16 = bf16;
  c.peakFP8 = fp8;
  c.peakFP32 = fp32;
  c.memoryBandwidth = hbm;
  c.intraNode = {nvlink, 3e-6};
  c.interNode = {ib, 10e-6};
  return c;
}

std::optional<Cluster> builtin(StringRef name) {
  if (name == "h100")
    return gpuNode("h100",
                   "8x NVIDIA H100 SXM5 80GB per node, NVSwitch (NVLink 4), "
                   "8x400 Gb/s InfiniBand NDR (NVIDIA H100 and DGX H100 "
                   "datasheets)",
                   80, 989.4e12, 1978.9e12, 66.9e12, 3.35e12, 450e9, 50e9);
  if (name == "h200")
    return gpuNode("h200",
                   "8x NVIDIA H200 SXM 141GB per node, NVSwitch (NVLink 4), "
                   "8x400 Gb/s InfiniBand NDR (NVIDIA H200 datasheet)",
                   141, 989.4e12, 1978.9e12, 66.9e12, 4.8e12, 450e9, 50e9);
  if (name == "a100")
    return gpuNode("a100",
                   "8x NVIDIA A100 SXM4 80GB per node, NVSwitch (NVLink 3), "
                   "8x200 Gb/s InfiniBand HDR (NVIDIA A100 and DGX A100 "
                   "datasheets); no FP8 units",
                   80, 312e12, 312e12, 19.5e12, 2.039e12, 300e9, 25e9);
  if (name == "b200")
    return gpuNode("b200",
                   "8x NVIDIA B200 180GB per node, NVSwitch (NVLink 5), "
                   "8x400 Gb/s InfiniBand NDR (NVIDIA HGX and DGX B200 "
                   "datasheets)",
                   180, 2.25e15, 4.5e15, 75e12, 8e12, 900e9, 50e9);
  if (name == "cpu") {
    Cluster c;
    c.name = "cpu";
    c.description = "this development box: 2 cores, 228 GFLOP/s fp32, "
                    "33 GB/s DRAM (measured by moe-bench machine); one rank per "
                    "process, shared-memory links";
    c.nodes = 1;
    c.devicesPerNode = 1;
    c.worldSize = 1;
    c.memoryBytes = 24 * kGiB;
    c.peakBF16 = c.peakFP8 = c.peakFP32 = 228e9; // computed in f32
    c.memoryBandwidth = 33e9;
    c.intraNode = c.interNode = {10e9, 2e-6};
    return c;
  }
  return std::nullopt;
}

Expected<Link> readLink(const Fields &parent, StringRef key) {
  Expected<Fields> r = parent.object(key);
  if (!r)
    return r.takeError();
  if (Error e = r->checkKnown({"bandwidth_bytes_per_s", "latency_s"}))
    return std::move(e);
  Link l;
  MOE_ASSIGN(l.bandwidth, r->finitePositive("bandwidth_bytes_per_s"));
  MOE_ASSIGN(l.latency, r->finiteNonNegative("latency_s"));
  return l;
}

} // namespace

ArrayRef<StringRef> moe::sharding::builtinClusterNames() {
  static const StringRef names[] = {"h100", "h200", "a100", "b200", "cpu"};
  return names;
}

Expected<Cluster> moe::sharding::builtinCluster(StringRef gpu) {
  if (std::optional<Cluster> c = builtin(gpu))
    return *c;
  return createStringError(
      inconvertibleErrorCode(), "--gpu %s: unknown machine; expected one of %s",
      gpu.str().c_str(), join(builtinClusterNames(), ", ").c_str());
}

Expected<Cluster> moe::sharding::makeCluster(StringRef gpu, int64_t worldSize) {
  Expected<Cluster> c = builtinCluster(gpu);
  if (!c)
    return c.takeError();
  if (worldSize <= 0)
    return createStringError(inconvertibleErrorCode(),
                             "--world-size %lld: expected a positive integer",
                             (long long)worldSize);
  c->nodes = (worldSize + c->devicesPerNode - 1) / c->devicesPerNode;
  c->worldSize = worldSize;
  return c;
}

Expected<Cluster> moe::sharding::withWorldSize(const Cluster &c,
                                               int64_t worldSize) {
  int64_t most = c.nodes * c.devicesPerNode;
  if (worldSize <= 0)
    return createStringError(inconvertibleErrorCode(),
                             "--world-size %lld: expected a positive integer",
                             (long long)worldSize);
  if (worldSize > most)
    return createStringError(
        inconvertibleErrorCode(),
        "--world-size %lld: expected at most %lld (nodes x devices_per_node "
        "of %s)",
        (long long)worldSize, (long long)most, c.name.c_str());
  Cluster out = c;
  out.worldSize = worldSize;
  return out;
}

Expected<Cluster> moe::sharding::parseClusterJSON(StringRef text,
                                                  StringRef path) {
  Expected<json::Object> top = moe::json_fields::parseObject(text, path);
  if (!top)
    return top.takeError();
  Fields r(*top, path, "", moe::json_fields::Nulls::AreValues);
  if (Error e = r.checkKnown({"format", "name", "description", "sources",
                              "nodes", "devices_per_node", "device",
                              "intra_node", "inter_node"}))
    return std::move(e);
  Cluster c;
  std::string format;
  MOE_ASSIGN(format, r.string("format", "moe-cluster"));
  if (format != "moe-cluster")
    return r.fail("format",
                "expected \"moe-cluster\" but got \"" + format + "\"");
  MOE_ASSIGN(c.name, r.string("name", path));
  MOE_ASSIGN(c.description, r.string("description", ""));
  MOE_ASSIGN(c.nodes, r.positiveInteger("nodes"));
  MOE_ASSIGN(c.devicesPerNode, r.positiveInteger("devices_per_node"));
  c.worldSize = c.nodes * c.devicesPerNode;

  Expected<Fields> dev = r.object("device");
  if (!dev)
    return dev.takeError();
  const Fields &d = *dev;
  if (Error e = d.checkKnown(
          {"memory_bytes", "memory_bandwidth_bytes_per_s", "peak_flops"}))
    return std::move(e);
  MOE_ASSIGN(c.memoryBytes, d.positiveInteger("memory_bytes"));
  MOE_ASSIGN(c.memoryBandwidth,
             d.finitePositive("memory_bandwidth_bytes_per_s"));
  Expected<Fields> peaks = d.object("peak_flops");
  if (!peaks)
    return peaks.takeError();
  const Fields &p = *peaks;
  if (Error e = p.checkKnown({"bf16", "fp8", "fp32"}))
    return std::move(e);
  MOE_ASSIGN(c.peakBF16, p.finitePositive("bf16"));
  MOE_ASSIGN(c.peakFP32, p.finitePositive("fp32"));
  c.peakFP8 = c.peakBF16;
  if (p.has("fp8"))
    MOE_ASSIGN(c.peakFP8, p.finitePositive("fp8"));
  MOE_ASSIGN(c.intraNode, readLink(r, "intra_node"));
  MOE_ASSIGN(c.interNode, readLink(r, "inter_node"));
  return c;
}

Expected<Cluster> moe::sharding::loadClusterFile(StringRef path) {
  Expected<std::unique_ptr<MemoryBuffer>> buffer =
      moe::json_fields::readInputFile(path, 16 << 20);
  if (!buffer)
    return buffer.takeError();
  return parseClusterJSON((*buffer)->getBuffer(), path);
}

json::Value moe::sharding::clusterToJSON(const Cluster &c) {
  auto link = [](const Link &l) {
    return json::Object{{"bandwidth_bytes_per_s", l.bandwidth},
                        {"latency_s", l.latency}};
  };
  return json::Object{
      {"format", "moe-cluster"},
      {"name", c.name},
      {"description", c.description},
      {"nodes", c.nodes},
      {"devices_per_node", c.devicesPerNode},
      {"device",
       json::Object{{"memory_bytes", c.memoryBytes},
                    {"memory_bandwidth_bytes_per_s", c.memoryBandwidth},
                    {"peak_flops", json::Object{{"bf16", c.peakBF16},
                                                {"fp8", c.peakFP8},
                                                {"fp32", c.peakFP32}}}}},
      {"intra_node", link(c.intraNode)},
      {"inter_node", link(c.interNode)}};
}
