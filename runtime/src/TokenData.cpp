// Token data for training (moert/TokenData.h): .npy and Megatron's
// indexed dataset, checked header by header.
#include "moert/TokenData.h"
#include "InputFile.h"
#include "moert/Error.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <limits>

namespace moert {
namespace {

/// Token stores larger than this are refused (moert reads them whole).
constexpr uint64_t kMaxDataBytes = uint64_t(1) << 36;

struct IntType {
  int bytes;
  bool isSigned;
  const char *name;
};

/// Widens `count` little-endian integers of `type` at `data` to int32 ids,
/// each in [0, vocab); `what` names the file for the error.
std::vector<int32_t> widen(const char *data, uint64_t count, IntType type, int64_t vocab,
                           const std::string &what) {
  std::vector<int32_t> ids(count);
  for (uint64_t i = 0; i < count; ++i) {
    const char *p = data + i * type.bytes;
    int64_t v = 0;
    if (type.isSigned) {
      switch (type.bytes) {
      case 1: { int8_t x; std::memcpy(&x, p, 1); v = x; break; }
      case 2: { int16_t x; std::memcpy(&x, p, 2); v = x; break; }
      case 4: { int32_t x; std::memcpy(&x, p, 4); v = x; break; }
      default: { int64_t x; std::memcpy(&x, p, 8); v = x; break; }
      }
    } else {
      uint64_t x = 0;
      std::memcpy(&x, p, type.bytes);
      v = x > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : static_cast<int64_t>(x);
    }
    if (v < 0 || v >= vocab)
      inputError("{}: token {} is id {}, outside the model's vocabulary [0, {})", what, i, v,
                 vocab);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

std::string fileOf(const std::string &path) {
  return readInputFile(path, kMaxDataBytes, "token data");
}

/// A .npy header's value of `key` (the text up to the next ',' or '}',
/// or the parenthesised shape).
std::string headerValue(const std::string &header, const std::string &key,
                        const std::string &path) {
  size_t at = header.find("'" + key + "':");
  if (at == std::string::npos)
    inputError("{}: the .npy header has no '{}'", path, key);
  at += key.size() + 3;
  while (at < header.size() && header[at] == ' ')
    ++at;
  size_t end = header[at] == '(' ? header.find(')', at) + 1 : header.find_first_of(",}", at);
  if (end == std::string::npos || end == 0)
    inputError("{}: a malformed .npy header", path);
  return header.substr(at, end - at);
}

std::vector<int32_t> readNpyTokens(const std::string &path, int64_t vocab) {
  const std::string file = fileOf(path);
  if (file.size() < 10 || file.compare(0, 6, "\x93NUMPY") != 0)
    inputError("{}: not a .npy file", path);
  const int major = static_cast<uint8_t>(file[6]);
  uint64_t headerBytes = static_cast<uint8_t>(file[8]) | (static_cast<uint8_t>(file[9]) << 8);
  uint64_t start = 10;
  if (major >= 2) {
    if (file.size() < 12)
      inputError("{}: truncated .npy header", path);
    headerBytes |= (uint64_t(static_cast<uint8_t>(file[10])) << 16) |
                   (uint64_t(static_cast<uint8_t>(file[11])) << 24);
    start = 12;
  }
  if (major < 1 || major > 3 || start + headerBytes > file.size())
    inputError("{}: a .npy header of version {} that is not 1-3 or runs past the file", path,
               major);
  const std::string header = file.substr(start, headerBytes);
  const std::string descr = headerValue(header, "descr", path);
  static const std::pair<const char *, IntType> kTypes[] = {
      {"'|u1'", {1, false, "uint8"}}, {"'|i1'", {1, true, "int8"}},
      {"'<u2'", {2, false, "uint16"}}, {"'<i2'", {2, true, "int16"}},
      {"'<u4'", {4, false, "uint32"}}, {"'<i4'", {4, true, "int32"}},
      {"'<u8'", {8, false, "uint64"}}, {"'<i8'", {8, true, "int64"}}};
  const IntType *type = nullptr;
  for (const auto &[d, t] : kTypes)
    if (descr == d)
      type = &t;
  if (!type)
    inputError("{}: dtype {} is not a little-endian integer type (token ids)", path, descr);
  if (headerValue(header, "fortran_order", path) != "False")
    inputError("{}: expected a C-order array ('fortran_order': False)", path);
  const std::string shape = headerValue(header, "shape", path);
  uint64_t count = 0;
  if (std::sscanf(shape.c_str(), "(%lu,)", &count) != 1 || shape.find(',') == std::string::npos ||
      shape.find(',') + 2 != shape.size())
    inputError("{}: shape {} is not one dimension (a flat array of token ids)", path, shape);
  const uint64_t data = start + headerBytes;
  if (file.size() - data != count * type->bytes)
    inputError("{}: {} bytes of data for {} {} ids ({} expected)", path, file.size() - data,
               count, type->name, count * type->bytes);
  return widen(file.data() + data, count, *type, vocab, path);
}

template <typename T> T readAt(const std::string &file, uint64_t &at, const std::string &path) {
  if (at + sizeof(T) > file.size())
    inputError("{}: truncated index (at byte {})", path, at);
  T value;
  std::memcpy(&value, file.data() + at, sizeof(T));
  at += sizeof(T);
  return value;
}

std::vector<int32_t> readMegatron(const std::string &prefix, int64_t vocab) {
  const std::string idxPath = prefix + ".idx", binPath = prefix + ".bin";
  const std::string idx = fileOf(idxPath);
  if (idx.size() < 9 || idx.compare(0, 9, std::string("MMIDIDX\0\0", 9)) != 0)
    inputError("{}: not a Megatron index (no MMIDIDX header)", idxPath);
  uint64_t at = 9;
  const uint64_t version = readAt<uint64_t>(idx, at, idxPath);
  if (version != 1)
    inputError("{}: index version {} (expected 1)", idxPath, version);
  const uint8_t code = readAt<uint8_t>(idx, at, idxPath);
  static const IntType kCodes[] = {{1, false, "uint8"}, {1, true, "int8"},  {2, true, "int16"},
                                   {4, true, "int32"},  {8, true, "int64"}, {0, false, "float64"},
                                   {0, false, "float32"}, {2, false, "uint16"}};
  if (code < 1 || code > 8 || kCodes[code - 1].bytes == 0)
    inputError("{}: dtype code {} is not an integer type (token ids)", idxPath, int(code));
  const IntType type = kCodes[code - 1];
  const uint64_t sequences = readAt<uint64_t>(idx, at, idxPath);
  const uint64_t documents = readAt<uint64_t>(idx, at, idxPath);
  if (sequences > idx.size() || documents > idx.size() ||
      idx.size() - at != sequences * 12 + documents * 8)
    inputError("{}: {} sequences and {} documents do not fill the {} bytes of the index "
               "(a multimodal index is not supported)",
               idxPath, sequences, documents, idx.size());
  std::vector<int32_t> lengths(sequences);
  std::vector<int64_t> pointers(sequences);
  std::memcpy(lengths.data(), idx.data() + at, sequences * 4);
  std::memcpy(pointers.data(), idx.data() + at + sequences * 4, sequences * 8);
  const std::string bin = fileOf(binPath);
  std::vector<int32_t> tokens;
  for (uint64_t s = 0; s < sequences; ++s) {
    const uint64_t bytes = static_cast<uint64_t>(lengths[s]) * type.bytes;
    if (lengths[s] < 0 || pointers[s] < 0 || static_cast<uint64_t>(pointers[s]) > bin.size() ||
        bytes > bin.size() - static_cast<uint64_t>(pointers[s]))
      inputError("{}: sequence {} ({} {} ids at byte {}) lies outside {} ({} bytes)", idxPath, s,
                 lengths[s], type.name, pointers[s], binPath, bin.size());
    std::vector<int32_t> ids = widen(bin.data() + pointers[s], lengths[s], type, vocab,
                                     fmt::format("{} (sequence {})", binPath, s));
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  return tokens;
}

bool endsWith(const std::string &s, const char *suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

} // namespace

std::vector<int32_t> readTokenData(const std::string &path, int64_t vocab) {
  if (endsWith(path, ".npy"))
    return readNpyTokens(path, vocab);
  if (endsWith(path, ".bin") || endsWith(path, ".idx"))
    return readMegatron(path.substr(0, path.size() - 4), vocab);
  std::ifstream idx(path + ".idx");
  if (!idx)
    inputError("{}: expected a .npy file of token ids or a Megatron dataset prefix "
               "(PREFIX.bin and PREFIX.idx)",
               path);
  return readMegatron(path, vocab);
}

int64_t windowCount(int64_t tokens, int64_t seqLen) {
  return tokens > 1 ? (tokens - 1) / seqLen : 0;
}

std::vector<int64_t> windowOrder(int64_t windows, int64_t seed, int64_t pass) {
  std::vector<int64_t> order(static_cast<size_t>(windows));
  for (int64_t i = 0; i < windows; ++i)
    order[static_cast<size_t>(i)] = i;
  if (seed < 0)
    return order;
  uint64_t state = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(pass);
  auto next = [&state] { // SplitMix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = windows - 1; i > 0; --i) {
    // A draw in [0, i] (the modulo's bias is below 2^-40 for any i here).
    const auto j = static_cast<int64_t>(next() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

} // namespace moert
