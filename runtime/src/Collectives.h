// The plan's collective steps, once for every device: all_reduce,
// all_gather (with its relayout), all_to_all (counts, then the counted rows
// of each expert) and the pipeline's send / recv. A device supplies its
// memory (Memory: device-to-host reads and 2-D copies) and a communicator
// that moves its memory (moert::Comm: MPI or the local one for host memory,
// NCCL for CUDA memory); the protocols, the peers and the checks of what
// arrives live here.
#pragma once

#include "moert/Comm.h"
#include "moert/Plan.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moert::collectives {

/// What the protocols need of the memory a device's buffers are in.
class Memory {
public:
  virtual ~Memory() = default;
  /// `bytes` bytes of device memory to the host, complete on return.
  virtual void read(void *host, const void *device, int64_t bytes) = 0;
  /// `height` rows of `width` bytes, `srcPitch` / `dstPitch` bytes apart.
  virtual void copy2d(void *dst, int64_t dstPitch, const void *src, int64_t srcPitch,
                      int64_t width, int64_t height) = 0;
};

/// What a step is for, in messages: "step 12 (all_reduce over tp)".
std::string describe(size_t index, const PlanStep &step);

/// A piece of a weight in host memory: `elements` values of its dtype, the
/// next ones of the weight's elements in order (an expert stack's experts
/// one after another).
struct WeightPart {
  char *data = nullptr;
  int64_t elements = 0;
};

/// One rank's view of its program's collectives.
struct Context {
  const Plan *plan = nullptr;
  const PlanProgram *program = nullptr;
  int64_t rank = 0;
  Comm *comm = nullptr;
  Memory *memory = nullptr;
  /// Per step: the world ranks of a collective's group, in the group's
  /// order (groupsOf).
  std::vector<std::vector<int>> groups;
  /// Where buffer `id` of the program lives (device memory).
  std::function<void *(int64_t id)> address;
  /// Device memory for all_gather's [n, rows, width] block: at least
  /// `bytes` bytes (the device keeps it).
  std::function<void *(int64_t bytes)> gatherStage;
  /// Program weight `id`'s pieces (the all_gather of a weight, ZeRO): none
  /// from a device that does not own writable host weights.
  std::function<std::vector<WeightPart>(int64_t id)> weightParts;
  /// What the rank is doing, for messages ("update 3, micro-batch 2"; may
  /// be null or empty).
  const std::string *phase = nullptr;
};

/// Runs collective step `index` (is_collective) over `rows` rows. Every member
/// of the group calls it, with any row count (0 included). Returns, for an
/// all_to_all, the most rows any expert received (the rows the expert steps
/// after it need), else -1.
int64_t run(const Context &c, size_t index, const PlanStep &step, int64_t rows);

/// Per step of `program`, one of rank `rank`'s entries: the world ranks of a
/// collective's group (the rank is a member), empty for other steps.
std::vector<std::vector<int>> groupsOf(const Plan &plan, int64_t rank,
                                       const PlanProgram &program);

/// The world rank a send or recv step of the context's program talks to.
int peerOf(const Context &c, const PlanStep &s);
/// The bytes a send or recv of buffer `id` moves over a batch of `rows`.
int64_t transferBytes(const Context &c, int64_t id, int64_t rows);

} // namespace moert::collectives
