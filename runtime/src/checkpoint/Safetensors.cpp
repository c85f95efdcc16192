// Safetensors checkpoints through mmap. The file is never read as a whole:
// only the JSON header is parsed (straight out of the mapping), and tensor
// views point into the mapping, so only the pages of tensors that are used
// become resident. Every field of the header is checked up front, because a
// bad offset found later would be a crash (or silent garbage) inside a kernel
// rather than a message naming the file and the tensor.
#include "../InputFile.h"
#include "../JsonFields.h"
#include "moert/Checkpoint.h"
#include "ExpertLayout.h"

#include "moert/Error.h"
#include "moert/ShardedCheckpoint.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <system_error>

namespace moert {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

/// The reference implementation's cap: a larger header is not a checkpoint
/// but an attempt to make the JSON parser allocate without bound.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string errnoText(int error) { return std::generic_category().message(error); }

/// Opens `path` read-only into `fd` (the caller owns it: SafetensorsFile's
/// destructor closes it, also when validation throws later), checks that it
/// is a regular file long enough for a header length, and sets `bytes`.
void openFile(const std::string &path, int &fd, size_t &bytes) {
  checkRegularFile(path); // before open(): a FIFO would block it forever
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    inputError("{}: cannot open: {}", path, errnoText(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0)
    inputError("{}: cannot stat: {}", path, errnoText(errno));
  if (!S_ISREG(st.st_mode))
    inputError("{}: not a regular file", path);
  // Checked before mmap, which rejects an empty file with a cryptic EINVAL.
  if (st.st_size < 8)
    inputError("{}: {} bytes is too short for a safetensors file (the header length "
               "alone takes 8)",
               path, st.st_size);
  bytes = static_cast<size_t>(st.st_size);
}

/// Reads exactly `size` bytes at `at` (pread, retried on EINTR and short
/// reads); InputError naming the file otherwise.
void preadAll(int fd, const std::string &path, uint64_t at, char *dst, size_t size) {
  while (size > 0) {
    ssize_t n = ::pread(fd, dst, size, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      inputError("{}: cannot read: {}", path, errnoText(errno));
    if (n == 0)
      inputError("{}: cannot read {} bytes at offset {}: unexpected end of file", path, size, at);
    dst += n;
    at += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

/// The 8-byte little-endian header length, assembled bytewise so that the
/// host's byte order does not matter.
uint64_t readHeaderLength(const unsigned char *bytes) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return n;
}

/// nlohmann's messages start with "[json.exception.parse_error.101] "; the
/// user needs only the part after it.
std::string jsonMessage(const json::exception &e) {
  std::string text = e.what();
  size_t end = text.find("] ");
  return end == std::string::npos ? text : text.substr(end + 2);
}

json parseJsonObject(const std::string &path, const char *begin, const char *end,
                     const char *what) {
  json value;
  try {
    value = parseJsonNoDuplicateKeys(begin, end, path, what);
  } catch (const json::exception &e) { // parse_error, and out_of_range for a number like 1e512
    inputError("{}: {} is not valid JSON: {}", path, what, jsonMessage(e));
  }
  if (!value.is_object())
    inputError("{}: {} is a JSON {}, expected an object", path, what, value.type_name());
  return value;
}

/// A header entry as parsed; SafetensorsFile::Entry is private, so open()
/// copies these into it.
struct EntryInfo {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

const json &field(const std::string &path, const std::string &name, const json &entry,
                  const char *key) {
  auto it = entry.find(key);
  if (it == entry.end())
    inputError("{}: tensor '{}': entry has no \"{}\"", path, name, key);
  return *it;
}

/// Only the five safetensors spellings the runtime supports; parseDType's
/// lowercase plan spellings are not valid in a safetensors header.
DType parseEntryDType(const std::string &path, const std::string &name, const json &value) {
  if (!value.is_string())
    inputError("{}: tensor '{}': \"dtype\" is a JSON {}, expected a string", path, name,
               value.type_name());
  const std::string &text = value.get_ref<const std::string &>();
  DType dtype;
  if (!parseDType(text, dtype) || text != dtypeName(dtype))
    inputError("{}: tensor '{}': unsupported dtype '{}' (expected F32, BF16, F16, I32 or I64)",
               path, name, text);
  return dtype;
}

std::vector<int64_t> parseShape(const std::string &path, const std::string &name,
                                const json &value) {
  if (!value.is_array())
    inputError("{}: tensor '{}': \"shape\" is a JSON {}, expected an array of integers", path,
               name, value.type_name());
  std::vector<int64_t> shape;
  for (const json &dim : value) {
    // nlohmann stores non-negative integers as unsigned, negative ones as
    // signed: a signed integer here is always negative.
    if (dim.is_number_unsigned() &&
        dim.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
      continue;
    }
    if (dim.is_number_integer() && !dim.is_number_unsigned())
      inputError("{}: tensor '{}': negative dimension {} in \"shape\" {}", path, name,
                 dim.get<int64_t>(), value.dump());
    inputError("{}: tensor '{}': \"shape\" {} holds {}, expected non-negative integers", path,
               name, value.dump(), dim.dump());
  }
  return shape;
}

void parseOffsets(const std::string &path, const std::string &name, const json &value,
                  EntryInfo &entry) {
  bool ok = value.is_array() && value.size() == 2 && value[0].is_number_unsigned() &&
            value[1].is_number_unsigned();
  if (!ok)
    inputError("{}: tensor '{}': \"data_offsets\" is {}, expected [begin, end] with "
               "non-negative integers",
               path, name, value.dump());
  entry.begin = value[0].get<uint64_t>();
  entry.end = value[1].get<uint64_t>();
  if (entry.begin > entry.end)
    inputError("{}: tensor '{}': data_offsets [{}, {}] end before they begin", path, name,
               entry.begin, entry.end);
}

/// Checks that the entry's bytes lie inside the data section, that their
/// count is what dtype and shape need, and that the elements are aligned in
/// memory (kernels read them through typed pointers).
void checkExtent(const std::string &path, const std::string &name, const EntryInfo &entry,
                 uint64_t dataBytes, uint64_t dataFileOffset) {
  if (entry.end > dataBytes)
    inputError("{}: tensor '{}': data_offsets [{}, {}] run past the end of the {} data bytes "
               "(truncated file?)",
               path, name, entry.begin, entry.end, dataBytes);
  const size_t elementBytes = dtypeSize(entry.dtype);
  uint64_t needed = elementBytes;
  bool overflow = false;
  for (int64_t dim : entry.shape)
    overflow |= __builtin_mul_overflow(needed, static_cast<uint64_t>(dim), &needed);
  const uint64_t held = entry.end - entry.begin;
  if (overflow || held != needed)
    inputError("{}: tensor '{}': data_offsets [{}, {}] hold {} bytes but {} {} needs {}", path,
               name, entry.begin, entry.end, held, dtypeName(entry.dtype),
               shapeString(entry.shape),
               overflow ? std::string("more than 2^64") : std::to_string(needed));
  if ((dataFileOffset + entry.begin) % elementBytes != 0)
    inputError("{}: tensor '{}': data at file offset {} is not aligned to its {}-byte {} "
               "elements",
               path, name, dataFileOffset + entry.begin, elementBytes, dtypeName(entry.dtype));
}

EntryInfo parseEntry(const std::string &path, const std::string &name, const json &value,
                     uint64_t dataBytes, uint64_t dataFileOffset) {
  if (!value.is_object())
    inputError("{}: tensor '{}': entry is a JSON {}, expected an object with dtype, shape "
               "and data_offsets",
               path, name, value.type_name());
  EntryInfo entry;
  entry.dtype = parseEntryDType(path, name, field(path, name, value, "dtype"));
  entry.shape = parseShape(path, name, field(path, name, value, "shape"));
  parseOffsets(path, name, field(path, name, value, "data_offsets"), entry);
  checkExtent(path, name, entry, dataBytes, dataFileOffset);
  return entry;
}

/// The spec makes __metadata__ a string-to-string map.
void checkMetadata(const std::string &path, const json &value) {
  if (!value.is_object())
    inputError("{}: \"__metadata__\" is a JSON {}, expected an object", path, value.type_name());
  for (auto it = value.begin(); it != value.end(); ++it)
    if (!it.value().is_string())
      inputError("{}: \"__metadata__\" key '{}' is a JSON {}, expected a string", path, it.key(),
                 it.value().type_name());
}

/// The tensors tile the data bytes exactly, as the safetensors format (and
/// its reference reader) requires: two tensors sharing bytes would alias
/// each other's weights, and bytes no tensor owns (a gap, or bytes after the
/// last tensor) mean a damaged or partly overwritten file.
void checkTiling(const std::string &path, const std::map<std::string, EntryInfo> &entries,
                 uint64_t dataBytes) {
  struct Span { uint64_t begin, end; const std::string *name; };
  std::vector<Span> spans;
  for (const auto &[name, entry] : entries)
    spans.push_back({entry.begin, entry.end, &name});
  std::sort(spans.begin(), spans.end(), [](const Span &a, const Span &b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const std::string *previous = nullptr;
  for (const Span &span : spans) {
    if (span.begin < covered)
      inputError("{}: tensors '{}' and '{}' (data_offsets [{}, {}]) overlap", path, *previous,
                 *span.name, span.begin, span.end);
    if (span.begin > covered)
      inputError("{}: data bytes [{}, {}) belong to no tensor (before '{}'): the format has no "
                 "gaps (a damaged file?)",
                 path, covered, span.begin, *span.name);
    covered = span.end;
    previous = span.name;
  }
  if (covered != dataBytes)
    inputError("{}: {} bytes after the last tensor's data: the format has none (a damaged or "
               "partly overwritten file?)",
               path, dataBytes - covered);
}

template <typename Map> std::vector<std::string> sortedKeys(const Map &map) {
  std::vector<std::string> keys;
  keys.reserve(map.size());
  for (const auto &item : map)
    keys.push_back(item.first);
  std::sort(keys.begin(), keys.end());
  return keys;
}

} // namespace

//===----------------------------------------------------------------------===//
// SafetensorsFile
//===----------------------------------------------------------------------===//

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string &path, bool map) {
  // Owned from the start so that descriptor and mapping are released when a
  // check throws.
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  openFile(path, file->fd, file->fileBytes_);
  const size_t fileBytes = file->fileBytes_;
  if (map) {
    void *p = ::mmap(nullptr, fileBytes, PROT_READ, MAP_PRIVATE, file->fd, 0);
    if (p == MAP_FAILED)
      inputError("{}: cannot mmap: {}", path, errnoText(errno));
    file->mapping = p;
  }
  unsigned char lengthBytes[8];
  preadAll(file->fd, path, 0, reinterpret_cast<char *>(lengthBytes), 8);
  const uint64_t headerBytes = readHeaderLength(lengthBytes);
  if (headerBytes > fileBytes - 8)
    inputError("{}: header length {} exceeds the {} bytes after it (truncated file?)", path,
               headerBytes, fileBytes - 8);
  if (headerBytes > kMaxHeaderBytes)
    inputError("{}: header length {} exceeds the limit of {} bytes", path, headerBytes,
               kMaxHeaderBytes);
  std::string headerText(static_cast<size_t>(headerBytes), '\0');
  preadAll(file->fd, path, 8, headerText.data(), headerText.size());
  json header =
      parseJsonObject(path, headerText.data(), headerText.data() + headerText.size(), "header");

  const uint64_t dataFileOffset = 8 + headerBytes;
  const uint64_t dataBytes = fileBytes - dataFileOffset;
  std::map<std::string, EntryInfo> parsed;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      checkMetadata(path, it.value());
    else
      parsed.emplace(it.key(), parseEntry(path, it.key(), it.value(), dataBytes, dataFileOffset));
  }
  checkTiling(path, parsed, dataBytes);

  file->dataOffset = dataFileOffset;
  if (file->mapping)
    file->dataStart = static_cast<const char *>(file->mapping) + dataFileOffset;
  for (auto &[name, e] : parsed)
    file->entries.emplace(name, Entry{e.dtype, std::move(e.shape), static_cast<size_t>(e.begin),
                                      static_cast<size_t>(e.end)});
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping)
    ::munmap(mapping, fileBytes_);
  if (fd >= 0)
    ::close(fd);
}

const SafetensorsFile::Entry &SafetensorsFile::entry(const std::string &name) const {
  auto it = entries.find(name);
  if (it == entries.end())
    inputError("{}: missing tensor '{}'", path_, name);
  return it->second;
}

TensorView SafetensorsFile::tensor(const std::string &name) const {
  const Entry &e = entry(name);
  if (!dataStart)
    runtimeError("{}: tensor '{}': the file is not mapped (read boxes instead)", path_, name);
  TensorView view;
  view.dtype = e.dtype;
  view.shape = e.shape;
  view.data = dataStart + e.begin;
  return view;
}

void SafetensorsFile::readBox(const std::string &name, const std::vector<int64_t> &offset,
                              const std::vector<int64_t> &shape, char *dst,
                              const std::vector<int64_t> &dstShape,
                              const std::vector<int64_t> &dstOffset) const {
  const Entry &e = entry(name);
  const size_t elem = dtypeSize(e.dtype);
  const size_t nd = shape.size();
  const uint64_t base = dataOffset + e.begin;
  if (nd == 0) {
    preadAll(fd, path_, base, dst, elem);
    return;
  }
  for (int64_t d : shape)
    if (d <= 0)
      return;
  std::vector<int64_t> srcStride(nd, 1), dstStride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) {
    srcStride[d - 1] = srcStride[d] * e.shape[d];
    dstStride[d - 1] = dstStride[d] * dstShape[d];
  }
  const size_t rowBytes = static_cast<size_t>(shape[nd - 1]) * elem;
  // Rows come in increasing file order. Rows that lie close together are
  // read with one pread of the span that holds them into `buffer`, then
  // copied out; a row of at least the buffer's size goes straight to dst.
  constexpr uint64_t kGapBytes = 256u << 10;
  constexpr size_t kMaxPending = 4096;
  std::unique_ptr<char[]> buffer;
  size_t bufferBytes = 0;
  std::vector<std::pair<uint64_t, char *>> pending;
  uint64_t windowBegin = 0, windowEnd = 0;
  auto flush = [&] {
    if (pending.empty())
      return;
    const size_t span = static_cast<size_t>(windowEnd - windowBegin);
    if (!buffer || span > bufferBytes) {
      bufferBytes = std::max(span, std::min<size_t>(kReadBufferBytes, 64u << 10));
      buffer.reset(new char[bufferBytes]);
    }
    preadAll(fd, path_, windowBegin, buffer.get(), span);
    for (const auto &[at, to] : pending)
      std::memcpy(to, buffer.get() + (at - windowBegin), rowBytes);
    pending.clear();
  };
  std::vector<int64_t> index(nd, 0);
  while (true) {
    int64_t from = 0, to = 0;
    for (size_t d = 0; d < nd; ++d) {
      from += (offset[d] + index[d]) * srcStride[d];
      to += (dstOffset[d] + index[d]) * dstStride[d];
    }
    const uint64_t at = base + static_cast<uint64_t>(from) * elem;
    char *target = dst + static_cast<size_t>(to) * elem;
    if (rowBytes >= kReadBufferBytes) {
      flush();
      preadAll(fd, path_, at, target, rowBytes);
    } else {
      if (!pending.empty() &&
          (at + rowBytes - windowBegin > kReadBufferBytes || at - windowEnd > kGapBytes ||
           pending.size() >= kMaxPending))
        flush();
      if (pending.empty())
        windowBegin = at;
      pending.emplace_back(at, target);
      windowEnd = at + rowBytes;
    }
    int64_t d = static_cast<int64_t>(nd) - 2;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d])
        break;
      index[d] = 0;
    }
    if (d < 0)
      break;
  }
  flush();
}

std::vector<std::string> SafetensorsFile::names() const { return sortedKeys(entries); }

std::pair<size_t, size_t> SafetensorsFile::dataOffsets(const std::string &name) const {
  const Entry &e = entry(name);
  return {e.begin, e.end};
}

//===----------------------------------------------------------------------===//
// Checkpoint
//===----------------------------------------------------------------------===//

namespace {

/// What Checkpoint::open fills in (its members are private, so the helpers
/// below build this and open() moves it in).
struct Opened {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::unordered_map<std::string, size_t> fileIndex;
};

Opened openSingle(const std::string &path) {
  Opened opened;
  opened.files.push_back(SafetensorsFile::open(path));
  for (const std::string &name : opened.files[0]->names())
    opened.fileIndex.emplace(name, 0);
  return opened;
}

json readIndex(const std::string &indexPath) {
  const std::string content = readInputFile(indexPath, uint64_t(1) << 28, "an index");
  checkJsonDepth(content, indexPath);
  return parseJsonObject(indexPath, content.data(), content.data() + content.size(), "index");
}

/// A shard named by the index must be a plain file name next to the index,
/// so that an index cannot make the runtime open arbitrary paths.
std::string shardPath(const std::string &indexPath, const std::string &tensor,
                      const json &shard) {
  if (!shard.is_string())
    inputError("{}: weight_map entry for tensor '{}' is a JSON {}, expected a file name",
               indexPath, tensor, shard.type_name());
  const std::string &name = shard.get_ref<const std::string &>();
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    inputError("{}: weight_map puts tensor '{}' in '{}', which is not a file name in the "
               "checkpoint directory",
               indexPath, tensor, name);
  return (fs::path(indexPath).parent_path() / name).string();
}

/// Opens every distinct shard of the index once and checks that each tensor
/// really is in the shard the index names. Tensors a shard holds but the
/// index does not list are not part of the checkpoint (as in transformers).
Opened openSharded(const std::string &indexPath) {
  json index = readIndex(indexPath);
  auto weightMap = index.find("weight_map");
  if (weightMap == index.end() || !weightMap->is_object())
    inputError("{}: expected a \"weight_map\" object mapping tensor names to shard files",
               indexPath);
  if (weightMap->empty())
    inputError("{}: \"weight_map\" is empty", indexPath);

  Opened opened;
  std::unordered_map<std::string, size_t> shardIndex; // shard path -> files[i]
  for (auto it = weightMap->begin(); it != weightMap->end(); ++it) {
    const std::string &tensor = it.key();
    const std::string shard = shardPath(indexPath, tensor, it.value());
    auto known = shardIndex.find(shard);
    if (known == shardIndex.end()) {
      std::error_code ec;
      if (!fs::exists(shard, ec))
        inputError("{}: weight_map puts tensor '{}' in shard {}, which does not exist",
                   indexPath, tensor, shard);
      opened.files.push_back(SafetensorsFile::open(shard));
      known = shardIndex.emplace(shard, opened.files.size() - 1).first;
    }
    if (!opened.files[known->second]->has(tensor))
      inputError("{}: weight_map puts tensor '{}' in shard {}, which does not hold it",
                 indexPath, tensor, shard);
    opened.fileIndex.emplace(tensor, known->second);
  }
  return opened;
}

/// A directory without an index: its model.safetensors, else its only
/// *.safetensors file.
std::string findSingleFile(const std::string &dir) {
  const fs::path preferred = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (fs::exists(preferred, ec))
    return preferred.string();
  std::vector<std::string> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec))
      found.push_back(it->path().filename().string());
  if (ec)
    inputError("{}: cannot list directory: {}", dir, ec.message());
  if (found.empty())
    inputError("{}: no model.safetensors.index.json, model.safetensors or other *.safetensors "
               "file in the directory",
               dir);
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    inputError("{}: {} *.safetensors files ({}) but no model.safetensors.index.json to say "
               "which tensor is where",
               dir, found.size(), fmt::format("{}", fmt::join(found, ", ")));
  }
  return (fs::path(dir) / found[0]).string();
}

bool endsWith(const std::string &text, const std::string &suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

Checkpoint::Checkpoint() = default;
Checkpoint::~Checkpoint() = default;

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string &path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status))
    inputError("{}: no such checkpoint (expected a directory or a .safetensors file)", path);

  if (fs::is_directory(status) && ShardedCheckpoint::isSharded(path)) {
    auto checkpoint = std::make_unique<Checkpoint>();
    checkpoint->sharded = ShardedCheckpoint::open(path);
    checkpoint->path_ = path;
    checkpoint->manifestPath = checkpoint->sharded->manifestPath();
    checkpoint->modelType_ = checkpoint->sharded->modelType();
    const auto &tensors = checkpoint->sharded->tensors();
    for (size_t i = 0; i < tensors.size(); ++i)
      checkpoint->shardedIndex.emplace(tensors[i].name, i);
    return checkpoint;
  }
  Opened opened;
  if (fs::is_directory(status)) {
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    opened = fs::exists(index, ec) ? openSharded(index.string()) : openSingle(findSingleFile(path));
  } else {
    // An index may also be named directly; anything else is read as one file.
    opened = endsWith(path, ".index.json") ? openSharded(path) : openSingle(path);
  }
  auto checkpoint = std::make_unique<Checkpoint>();
  checkpoint->path_ = path;
  checkpoint->files = std::move(opened.files);
  checkpoint->fileIndex = std::move(opened.fileIndex);
  return checkpoint;
}

std::optional<Checkpoint::Alias> Checkpoint::alias(const std::string &name) const {
  // Sharded checkpoints store the plan's logical names; only Hugging Face
  // files can hold the fused layout.
  if (sharded || fileIndex.count(name))
    return std::nullopt;
  if (std::optional<FusedSlot> slot = fusedSlotOf(name))
    if (fileIndex.count(slot->fused))
      return Alias{slot->fused, slot->expert, slot->parts, slot->part};
  if (std::optional<std::string> renamed = fusedLayoutRename(name))
    if (fileIndex.count(*renamed))
      return Alias{*renamed, -1, 1, 0};
  return std::nullopt;
}

std::vector<int64_t> Checkpoint::aliasShape(const std::string &name, const Alias &a) const {
  const SafetensorsFile::Entry &e = files[fileIndex.at(a.stored)]->entry(a.stored);
  if (a.expert < 0)
    return e.shape;
  if (e.shape.size() != 3 || e.shape[1] % a.parts != 0)
    inputError("{}: tensor '{}' (the fused experts holding '{}'): expected a shape [experts, "
               "{} x rows, columns] but found {}",
               files[fileIndex.at(a.stored)]->path(), a.stored, name, a.parts,
               shapeString(e.shape));
  if (a.expert >= e.shape[0])
    inputError("{}: tensor '{}' holds {} experts, not expert {} ('{}')",
               files[fileIndex.at(a.stored)]->path(), a.stored, e.shape[0], a.expert, name);
  return {e.shape[1] / a.parts, e.shape[2]};
}

std::string Checkpoint::storedName(const std::string &name) const {
  if (fileIndex.count(name) || shardedIndex.count(name))
    return name;
  std::optional<Alias> a = alias(name);
  return a ? a->stored : std::string();
}

bool Checkpoint::hasFusedExperts() const {
  const std::string suffix = ".mlp.experts.gate_up_proj";
  for (const auto &entry : fileIndex)
    if (endsWith(entry.first, suffix))
      return true;
  return false;
}

bool Checkpoint::has(const std::string &name) const {
  return fileIndex.count(name) != 0 || shardedIndex.count(name) != 0 || alias(name);
}

const std::string &Checkpoint::fileOf(const std::string &name) const {
  if (shardedIndex.count(name))
    return manifestPath;
  auto it = fileIndex.find(name);
  if (it == fileIndex.end()) {
    if (std::optional<Alias> a = alias(name))
      return files[fileIndex.at(a->stored)]->path();
    inputError("{}: missing tensor '{}'", path_, name);
  }
  return files[it->second]->path();
}

TensorView Checkpoint::info(const std::string &name, const std::vector<int64_t> &shape) const {
  const std::string &file = fileOf(name);
  TensorView view;
  if (sharded) {
    const ShardedCheckpoint::Tensor &t = sharded->tensors()[shardedIndex.at(name)];
    view.dtype = t.dtype;
    view.shape = t.shape;
  } else if (std::optional<Alias> a = alias(name)) {
    view.dtype = files[fileIndex.at(a->stored)]->entry(a->stored).dtype;
    view.shape = aliasShape(name, *a);
  } else {
    const SafetensorsFile::Entry &e = files[fileIndex.at(name)]->entry(name);
    view.dtype = e.dtype;
    view.shape = e.shape;
  }
  std::string what = name;
  if (std::optional<Alias> a = alias(name))
    what += fmt::format("' (stored in '{}'", a->stored) +
            (a->expert >= 0 ? fmt::format(", expert {})", a->expert) : std::string(")"));
  else
    what += "'";
  if (view.shape != shape)
    inputError("{}: tensor '{}: expected shape {} but found {}", file, what, shapeString(shape),
               shapeString(view.shape));
  if (view.dtype != DType::F32 && view.dtype != DType::BF16 && view.dtype != DType::F16)
    inputError("{}: tensor '{}: dtype {} is not a float type (expected F32, BF16 or F16)", file,
               what, dtypeName(view.dtype));
  return view;
}

TensorView Checkpoint::tensor(const std::string &name, const std::vector<int64_t> &shape) const {
  TensorView view = info(name, shape);
  if (sharded)
    runtimeError("{}: tensor '{}': a sharded checkpoint has no whole-tensor views (read boxes)",
                 manifestPath, name);
  if (std::optional<Alias> a = alias(name)) {
    // Expert e's part is one contiguous block of the fused tensor.
    const char *base =
        static_cast<const char *>(files[fileIndex.at(a->stored)]->tensor(a->stored).data);
    const int64_t block = view.numel();
    const int64_t index = a->expert < 0 ? 0 : a->expert * a->parts + a->part;
    view.data = base + static_cast<size_t>(index * block) * dtypeSize(view.dtype);
    return view;
  }
  view.data = files[fileIndex.at(name)]->tensor(name).data;
  return view;
}

void Checkpoint::readBox(const std::string &name, const std::vector<int64_t> &offset,
                         const std::vector<int64_t> &shape, DType expected, char *dst,
                         const std::vector<int64_t> &dstShape) const {
  if (std::optional<Alias> a = alias(name)) {
    if (a->expert < 0) {
      readBox(a->stored, offset, shape, expected, dst, dstShape);
      return;
    }
    // The box of expert e's part: one more leading dimension.
    const std::vector<int64_t> rows = aliasShape(name, *a);
    const std::vector<int64_t> &into = dstShape.empty() ? shape : dstShape;
    if (offset.size() != 2 || shape.size() != 2 || into.size() != 2)
      inputError("{}: tensor '{}': a box of rank {} of a {} tensor", fileOf(name), name,
                 offset.size(), shapeString(rows));
    for (size_t d = 0; d < 2; ++d)
      if (offset[d] < 0 || shape[d] < 0 || offset[d] + shape[d] > rows[d] || shape[d] > into[d])
        inputError("{}: tensor '{}': box at offset {} of shape {} (into {}) does not fit its "
                   "shape {}",
                   fileOf(name), name, shapeString(offset), shapeString(shape),
                   shapeString(into), shapeString(rows));
    readBox(a->stored, {a->expert, a->part * rows[0] + offset[0], offset[1]},
            {1, shape[0], shape[1]}, expected, dst, {1, into[0], into[1]});
    return;
  }
  const std::string &file = fileOf(name);
  const ShardedCheckpoint::Tensor *t =
      sharded ? &sharded->tensors()[shardedIndex.at(name)] : nullptr;
  const SafetensorsFile *f = sharded ? nullptr : files[fileIndex.at(name)].get();
  const DType dtype = t ? t->dtype : f->entry(name).dtype;
  const std::vector<int64_t> &global = t ? t->shape : f->entry(name).shape;
  if (dtype != expected)
    inputError("{}: tensor '{}': expected dtype {} but found {}", file, name,
               dtypeName(expected), dtypeName(dtype));
  const std::vector<int64_t> &into = dstShape.empty() ? shape : dstShape;
  bool inside = offset.size() == global.size() && shape.size() == global.size() &&
                into.size() == global.size();
  for (size_t d = 0; inside && d < global.size(); ++d)
    inside = offset[d] >= 0 && shape[d] >= 0 && offset[d] + shape[d] <= global[d] &&
             shape[d] <= into[d];
  if (!inside)
    inputError("{}: tensor '{}': box at offset {} of shape {} (into {}) does not fit its shape {}",
               file, name, shapeString(offset), shapeString(shape), shapeString(into),
               shapeString(global));
  if (t)
    sharded->readBox(*t, offset, shape, dst, into);
  else
    f->readBox(name, offset, shape, dst, into, std::vector<int64_t>(shape.size(), 0));
}

std::vector<int64_t> Checkpoint::shapeOf(const std::string &name) const {
  fileOf(name); // InputError when missing
  if (sharded)
    return sharded->tensors()[shardedIndex.at(name)].shape;
  if (std::optional<Alias> a = alias(name))
    return aliasShape(name, *a);
  return files[fileIndex.at(name)]->entry(name).shape;
}

std::vector<std::string> Checkpoint::names() const {
  return sharded ? sortedKeys(shardedIndex) : sortedKeys(fileIndex);
}

} // namespace moert
