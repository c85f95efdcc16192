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
    inputError("{}: tensor '{}': unsupported dtype '{}' (expected F32, BF16, F16, F8_E4M3, I32 or I64)",
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

} // namespace moert
