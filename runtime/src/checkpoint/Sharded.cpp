// Sharded checkpoints: validating (open) and reading boxes of any layout
// (readBox). Writing is in ShardedConvert.cpp, exporting back to Hugging Face
// layout in ShardedExport.cpp. Format: docs/checkpoint-format.md.
#include "../InputFile.h"
#include "moert/ShardedCheckpoint.h"
#include "ExpertLayout.h"

#include "moert/Comm.h"
#include "moert/Error.h"
#include "moert/PlanLayout.h"
#include "moert/SafetensorsWriter.h"

#include "../JsonFields.h"
#include "Progress.h"
#include "ShardedFiles.h"

#include <fmt/ranges.h>

#include <cctype>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <system_error>

namespace moert {

namespace fs = std::filesystem;
using sharded::hex32;
using sharded::readText;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

//===----------------------------------------------------------------------===//
// CRC32C, slicing by 8 (about 1-2 GB/s per core)
//===----------------------------------------------------------------------===//

namespace {

struct Crc32cTables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int k = 1; k < 8; ++k)
        t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
};

const Crc32cTables &tables() {
  static const Crc32cTables instance;
  return instance;
}

} // namespace

uint32_t crc32c(const void *bytes, size_t size, uint32_t crc) {
  const auto &t = tables().t;
  const unsigned char *p = static_cast<const unsigned char *>(bytes);
  crc = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8); // little-endian hosts only (as the safetensors reader)
    word ^= crc;
    crc = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^
          t[4][(word >> 24) & 0xff] ^ t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^
          t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
    p += 8;
    size -= 8;
  }
  while (size--)
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

uint32_t crc32cOfFile(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    inputError("{}: cannot open: {}", path, std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  // A bounded buffer (not zeroed: only the pages reads fill are resident).
  constexpr size_t kChunk = 4u << 20;
  std::unique_ptr<char[]> buffer(new char[kChunk]);
  uint32_t crc = 0;
  for (;;) {
    ssize_t n = ::read(fd, buffer.get(), kChunk);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      int error = errno;
      ::close(fd);
      inputError("{}: cannot read: {}", path, std::strerror(error));
    }
    if (n == 0)
      break;
    crc = crc32c(buffer.get(), static_cast<size_t>(n), crc);
  }
  ::close(fd);
  return crc;
}

//===----------------------------------------------------------------------===//
// Boxes
//===----------------------------------------------------------------------===//

namespace {

int64_t volume(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

template <bool Out>
void copyBoxImpl(const char *src, char *dst, const std::vector<int64_t> &globalShape,
                 const std::vector<int64_t> &offset, const std::vector<int64_t> &shape,
                 size_t elementBytes) {
  const size_t nd = shape.size();
  if (nd == 0) {
    std::memcpy(dst, src, elementBytes);
    return;
  }
  if (volume(shape) == 0)
    return;
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d-- > 0;)
    stride[d] = stride[d + 1] * globalShape[d + 1];
  const size_t rowBytes = static_cast<size_t>(shape[nd - 1]) * elementBytes;
  const int64_t rows = volume(shape) / shape[nd - 1];
  std::vector<int64_t> index(nd, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t g = offset[nd - 1];
    for (size_t d = 0; d + 1 < nd; ++d)
      g += (offset[d] + index[d]) * stride[d];
    const size_t globalAt = static_cast<size_t>(g) * elementBytes;
    const size_t boxAt = static_cast<size_t>(r) * rowBytes;
    if (Out)
      std::memcpy(dst + boxAt, src + globalAt, rowBytes);
    else
      std::memcpy(dst + globalAt, src + boxAt, rowBytes);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++index[d] < shape[d])
        break;
      index[d] = 0;
    }
  }
}

} // namespace

void copyBoxOut(const char *global, const std::vector<int64_t> &globalShape,
                const std::vector<int64_t> &offset, const std::vector<int64_t> &shape,
                size_t elementBytes, char *box) {
  copyBoxImpl<true>(global, box, globalShape, offset, shape, elementBytes);
}

void copyBoxIn(const char *box, const std::vector<int64_t> &globalShape,
               const std::vector<int64_t> &offset, const std::vector<int64_t> &shape,
               size_t elementBytes, char *global) {
  copyBoxImpl<false>(box, global, globalShape, offset, shape, elementBytes);
}

void checkBoxCover(const std::string &where, const std::string &tensor,
                   const std::vector<int64_t> &globalShape, const std::vector<BoxRef> &boxes) {
  int64_t covered = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const BoxRef &b = boxes[i];
    bool inside = b.offset.size() == globalShape.size() && b.shape.size() == globalShape.size();
    for (size_t d = 0; inside && d < globalShape.size(); ++d)
      inside = b.offset[d] >= 0 && b.shape[d] >= 0 && b.offset[d] + b.shape[d] <= globalShape[d];
    if (!inside)
      inputError("{}: tensor '{}': box at offset {} of shape {} in {} lies outside its shape {}",
                 where, tensor, shapeString(b.offset), shapeString(b.shape), b.file,
                 shapeString(globalShape));
    covered += volume(b.shape);
    for (size_t j = 0; j < i; ++j) {
      const BoxRef &a = boxes[j];
      bool overlap = volume(a.shape) > 0 && volume(b.shape) > 0;
      for (size_t d = 0; overlap && d < globalShape.size(); ++d)
        overlap = a.offset[d] < b.offset[d] + b.shape[d] && b.offset[d] < a.offset[d] + a.shape[d];
      if (overlap)
        inputError("{}: tensor '{}': box at offset {} of shape {} in {} overlaps the box at "
                   "offset {} of shape {} in {}",
                   where, tensor, shapeString(b.offset), shapeString(b.shape), b.file,
                   shapeString(a.offset), shapeString(a.shape), a.file);
    }
  }
  // Disjoint boxes inside the shape: they cover it iff their volumes add up.
  if (covered != volume(globalShape))
    inputError("{}: tensor '{}': its {} boxes cover {} of its {} elements (shape {})", where,
               tensor, boxes.size(), covered, volume(globalShape), shapeString(globalShape));
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

namespace {

bool plainFileName(const std::string &name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

} // namespace

size_t ShardedCheckpoint::Tensor::bytes() const {
  return static_cast<size_t>(volume(shape)) * dtypeSize(dtype);
}

bool ShardedCheckpoint::isSharded(const std::string &dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::path(dir) / "manifest.json", ec);
}

std::unique_ptr<ShardedCheckpoint> ShardedCheckpoint::open(const std::string &dir) {
  std::unique_ptr<ShardedCheckpoint> ckpt(new ShardedCheckpoint());
  ckpt->dir = dir;
  ckpt->manifest = (fs::path(dir) / "manifest.json").string();
  const std::string &path = ckpt->manifest;
  json root;
  try {
    const std::string text = readText(path);
    root = parseJsonNoDuplicateKeys(text.data(), text.data() + text.size(), path, "manifest");
  } catch (const json::exception &e) { // parse_error, and out_of_range for a number like 1e512
    inputError("{}: malformed JSON: {}", path, e.what());
  }
  if (!root.is_object())
    inputError("{}: expected a JSON object", path);
  JsonFields top(root, path, "");
  if (top.string("format") != "moe-sharded-checkpoint")
    top.fail("format", fmt::format("expected \"moe-sharded-checkpoint\" but got \"{}\"",
                                   top.string("format")));
  if (top.unsignedInteger("version") != kShardedCheckpointVersion)
    top.fail("version", fmt::format("this moert reads checkpoint format {} but this is format {}",
                                    kShardedCheckpointVersion, top.unsignedInteger("version")));
  if (top.string("checksum") != "crc32c")
    top.fail("checksum", "expected \"crc32c\"");
  JsonFields model = top.child(top.get("model"), "model");
  ckpt->modelType_ = model.string("model_type");
  ckpt->config = model.string("config_json");
  if (model.has("expert_layout")) {
    ckpt->expertLayout_ = model.string("expert_layout");
    if (ckpt->expertLayout_ != "per-expert" && ckpt->expertLayout_ != "fused")
      model.fail("expert_layout", fmt::format("expected \"per-expert\" or \"fused\" but got "
                                              "\"{}\"",
                                              ckpt->expertLayout_));
  }

  // Files: present, of the recorded size and checksum, valid safetensors.
  const json &files = top.array("files");
  const json &tensors = top.array("tensors");
  std::map<std::string, size_t> fileIndex;
  std::vector<std::string> filePaths;
  std::vector<std::string> exampleTensor(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    JsonFields f = top.child(files[i], fmt::format("files[{}]", i));
    std::string name = f.string("name");
    if (!plainFileName(name) || fileIndex.count(name))
      f.fail("name", fmt::format("'{}' is not a new file name in the checkpoint directory", name));
    fileIndex[name] = i;
    filePaths.push_back((fs::path(dir) / name).string());
  }
  // The first tensor of each file, so that file-level errors name a tensor.
  for (const json &t : tensors)
    if (t.is_object() && t.contains("name") && t["name"].is_string() && t.contains("boxes") &&
        t["boxes"].is_array())
      for (const json &b : t["boxes"])
        if (b.is_object() && b.contains("file") && b["file"].is_string()) {
          auto it = fileIndex.find(b["file"].get<std::string>());
          if (it != fileIndex.end() && exampleTensor[it->second].empty())
            exampleTensor[it->second] = t["name"].get<std::string>();
        }
  for (size_t i = 0; i < files.size(); ++i) {
    JsonFields f = top.child(files[i], fmt::format("files[{}]", i));
    const std::string &file = filePaths[i];
    std::string holds = exampleTensor[i].empty()
                            ? std::string("no tensor")
                            : fmt::format("tensor '{}' and others", exampleTensor[i]);
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      inputError("{}: missing shard file {} (holds {})", path, file, holds);
    uint64_t size = fs::file_size(file, ec);
    if (size != f.unsignedInteger("bytes"))
      inputError("{}: {} bytes but the manifest records {} (truncated or replaced file; holds {})",
                 file, size, f.unsignedInteger("bytes"), holds);
    // Hex digits in either case (other tools write upper case).
    std::string recorded = f.string("crc32c");
    for (char &c : recorded)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (recorded.size() != 8 || recorded.find_first_not_of("0123456789abcdef") != std::string::npos)
      f.fail("crc32c", fmt::format("expected 8 hex digits but got \"{}\"", f.string("crc32c")));
    ckpt->recordedCrc.push_back(recorded);
    ckpt->holds.push_back(holds);
    ckpt->verified.push_back(false);
    // Only the header is read here (pread); the checksum is verified when a
    // box is first read from the file. A header that does not parse is
    // reported as the corruption the checksum shows, when it shows one.
    try {
      ckpt->files.push_back(SafetensorsFile::open(file, /*map=*/false));
    } catch (const InputError &) {
      uint32_t crc = crc32cOfFile(file);
      if (hex32(crc) != ckpt->recordedCrc.back())
        inputError("{}: CRC32C {} but the manifest records {} (corrupted file; holds {})", file,
                   hex32(crc), ckpt->recordedCrc.back(), holds);
      throw;
    }
  }

  // Tensors: every box in its file as recorded, every element covered once.
  // A training checkpoint's state tensors (training.state) likewise.
  std::map<std::string, bool> seen;
  std::vector<std::map<std::string, bool>> used(files.size());
  auto readTensors = [&](const JsonFields &owner, const std::string &field,
                         const std::string &where, std::vector<Tensor> &out) {
    const json &list = owner.array(field);
    for (size_t i = 0; i < list.size(); ++i) {
      JsonFields t = owner.child(list[i], fmt::format("{}[{}]", where, i));
      Tensor tensor;
      tensor.name = t.string("name");
      if (seen.count(tensor.name))
        t.fail("name", fmt::format("tensor '{}' is listed twice", tensor.name));
      seen[tensor.name] = true;
      std::string dtype = t.string("dtype");
      if (!parseDType(dtype, tensor.dtype) || dtype != dtypeName(tensor.dtype))
        t.fail("dtype", fmt::format("tensor '{}': unsupported dtype '{}'", tensor.name, dtype));
      tensor.shape = t.shape("shape");
      const json &boxes = t.array("boxes");
      std::vector<BoxRef> refs;
      for (size_t j = 0; j < boxes.size(); ++j) {
        JsonFields b = t.child(boxes[j], fmt::format("boxes[{}]", j));
        Box box;
        std::string fileName = b.string("file");
        auto it = fileIndex.find(fileName);
        if (it == fileIndex.end())
          b.fail("file", fmt::format("tensor '{}': '{}' is not among the manifest's files",
                                     tensor.name, fileName));
        box.file = it->second;
        box.offset = b.shape("offset");
        box.shape = b.shape("shape");
        refs.push_back({box.offset, box.shape, filePaths[box.file]});
        const SafetensorsFile &file = *ckpt->files[box.file];
        if (used[box.file].count(tensor.name))
          b.fail("file", fmt::format("tensor '{}' has two boxes in {}", tensor.name, file.path()));
        used[box.file][tensor.name] = true;
        if (!file.has(tensor.name))
          inputError("{}: tensor '{}': missing (the manifest puts its box at offset {} here)",
                     file.path(), tensor.name, shapeString(box.offset));
        const SafetensorsFile::Entry &view = file.entry(tensor.name);
        if (view.shape != box.shape || view.dtype != tensor.dtype)
          inputError("{}: tensor '{}': {} {} but the manifest records {} {}", file.path(),
                     tensor.name, dtypeName(view.dtype), shapeString(view.shape),
                     dtypeName(tensor.dtype), shapeString(box.shape));
        std::vector<int64_t> range = b.shape("data_offsets");
        auto [begin, end] = file.dataOffsets(tensor.name);
        if (range.size() != 2 || static_cast<size_t>(range[0]) != begin ||
            static_cast<size_t>(range[1]) != end)
          inputError("{}: tensor '{}': data_offsets [{}, {}] but the manifest records {}",
                     file.path(), tensor.name, begin, end, shapeString(range));
        tensor.boxes.push_back(std::move(box));
      }
      checkBoxCover(path, tensor.name, tensor.shape, refs);
      out.push_back(std::move(tensor));
    }
  };
  readTensors(top, "tensors", "tensors", ckpt->tensors_);
  if (top.has("training")) {
    JsonFields t = top.child(top.get("training"), "training");
    TrainingProgress &p = ckpt->training_.emplace();
    p.step = t.integer("step", 0);
    p.microBatchesDone = t.integer("micro_batches_done", 0);
    p.microBatches = t.integer("micro_batches", 1);
    p.seqLen = t.integer("seq_len", 1);
    p.microBatchSize = t.integer("micro_batch_size", 1);
    p.shuffleSeed = t.has("shuffle_seed") ? t.integer("shuffle_seed", -1) : -1;
    readTensors(t, "state", "training.state", ckpt->state_);
  }
  // Every stored tensor is some logical tensor's box.
  for (size_t i = 0; i < ckpt->files.size(); ++i)
    for (const std::string &name : ckpt->files[i]->names())
      if (!used[i].count(name))
        inputError("{}: tensor '{}' is not in the manifest", filePaths[i], name);
  return ckpt;
}

ShardedCheckpoint::~ShardedCheckpoint() = default;

void ShardedCheckpoint::verify(size_t i) const {
  if (verified.at(i))
    return;
  const std::string &file = files.at(i)->path();
  uint32_t crc = crc32cOfFile(file);
  if (hex32(crc) != recordedCrc[i])
    inputError("{}: CRC32C {} but the manifest records {} (corrupted file; holds {})", file,
               hex32(crc), recordedCrc[i], holds[i]);
  verified[i] = true;
}

void ShardedCheckpoint::verifyAll() const {
  for (size_t i = 0; i < files.size(); ++i)
    verify(i);
}

void ShardedCheckpoint::readBox(const Tensor &tensor, const std::vector<int64_t> &offset,
                                const std::vector<int64_t> &shape, char *dst,
                                const std::vector<int64_t> &dstShape) const {
  const size_t nd = shape.size();
  for (const Box &box : tensor.boxes) {
    std::vector<int64_t> from(nd), size(nd), at(nd);
    bool empty = false;
    for (size_t d = 0; d < nd; ++d) {
      int64_t lo = std::max(offset[d], box.offset[d]);
      int64_t hi = std::min(offset[d] + shape[d], box.offset[d] + box.shape[d]);
      empty |= hi <= lo;
      from[d] = lo - box.offset[d]; // in the stored box
      size[d] = hi - lo;
      at[d] = lo - offset[d]; // in the requested box, at dst's origin
    }
    if (empty)
      continue;
    verify(box.file);
    files[box.file]->readBox(tensor.name, from, size, dst, dstShape, at);
  }
}

void ShardedCheckpoint::assemble(const Tensor &tensor, char *out) const {
  readBox(tensor, std::vector<int64_t>(tensor.shape.size(), 0), tensor.shape, out, tensor.shape);
}

//===----------------------------------------------------------------------===//
// Files (ShardedFiles.h)
//===----------------------------------------------------------------------===//

namespace sharded {

std::string readText(const std::string &path) {
  std::string text = readInputFile(path, uint64_t(1) << 30, "a checkpoint manifest");
  checkJsonDepth(text, path);
  return text;
}

void fsyncPath(const std::string &path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0)
    return;
  ::fsync(fd);
  ::close(fd);
}

void writeTextAtomically(const std::string &path, const std::string &text) {
  std::string temp = path + ".tmp-XXXXXX";
  int fd = mkstemp(temp.data());
  if (fd < 0)
    inputError("{}: cannot create a temporary file beside it: {}", path, std::strerror(errno));
  ::fchmod(fd, 0644); // mkstemp's 0600 would hide a checkpoint from other users
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int error = errno;
      ::close(fd);
      std::remove(temp.c_str());
      inputError("{}: cannot write: {}", path, std::strerror(error));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::remove(temp.c_str());
    inputError("{}: cannot flush: {}", path, std::strerror(errno));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    inputError("{}: cannot rename into place: {}", path, std::strerror(errno));
  }
}

void makeDirectory(const std::string &dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec))
    inputError("{}: cannot create the directory", dir);
}

} // namespace sharded

} // namespace moert
