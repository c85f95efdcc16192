#include "moert/Npy.h"
#include "InputFile.h"
#include "moert/Error.h"
#include "moert/Tensor.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace moert {

namespace {

/// One array of `descr` ('<f4', '<i4', '<i8') and `shape`, atomically.
void writeArray(const std::string &path, const std::vector<int64_t> &shape, const char *descr,
                const void *data, size_t bytes) {
  std::string dims;
  for (int64_t d : shape)
    dims += std::to_string(d) + ", ";
  if (shape.size() > 1)
    dims.erase(dims.size() - 1); // "(3, 4)" but "(3,)"
  else if (shape.size() == 1)
    dims.pop_back();
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';

  std::string prefix = "\x93NUMPY";
  prefix += '\x01';
  prefix += '\x00';
  uint16_t length = static_cast<uint16_t>(header.size());
  prefix += static_cast<char>(length & 0xff);
  prefix += static_cast<char>(length >> 8);
  prefix += header;
  writeFileAtomically(path, prefix, std::string_view(static_cast<const char *>(data), bytes));
}

} // namespace

void writeNpy(const std::string &path, const std::vector<int64_t> &shape,
              const std::vector<float> &values) {
  writeArray(path, shape, "<f4", values.data(), values.size() * sizeof(float));
}

void writeNpy(const std::string &path, const std::vector<int64_t> &shape,
              const std::vector<int32_t> &values) {
  writeArray(path, shape, "<i4", values.data(), values.size() * sizeof(int32_t));
}

void writeNpy(const std::string &path, const std::vector<int64_t> &shape,
              const std::vector<int64_t> &values) {
  writeArray(path, shape, "<i8", values.data(), values.size() * sizeof(int64_t));
}

std::vector<float> readNpy(const std::string &path, std::vector<int64_t> &shape) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    inputError("{}: cannot read", path);
  char magic[10];
  if (!in.read(magic, 10) || std::string(magic, 6) != "\x93NUMPY")
    inputError("{}: not a .npy file", path);
  size_t headerLength;
  if (magic[6] == 1) {
    headerLength = static_cast<uint8_t>(magic[8]) | (static_cast<uint8_t>(magic[9]) << 8);
  } else {
    char more[2];
    in.read(more, 2);
    headerLength = static_cast<uint8_t>(magic[8]) | (static_cast<uint8_t>(magic[9]) << 8) |
                   (static_cast<uint8_t>(more[0]) << 16) | (static_cast<uint8_t>(more[1]) << 24);
  }
  std::string header(headerLength, '\0');
  in.read(header.data(), headerLength);
  if (header.find("'<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    inputError("{}: expected a little-endian float32 C-order array", path);
  size_t open = header.find("'shape': (");
  size_t close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos)
    inputError("{}: no shape in the header", path);
  shape.clear();
  std::string dims = header.substr(open + 10, close - open - 10);
  int64_t count = 1;
  for (size_t at = 0; at < dims.size();) {
    size_t comma = dims.find(',', at);
    std::string d = dims.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (d.find_first_of("0123456789") != std::string::npos) {
      shape.push_back(std::stoll(d));
      count *= shape.back();
    }
    if (comma == std::string::npos)
      break;
    at = comma + 1;
  }
  std::vector<float> values(count);
  if (!in.read(reinterpret_cast<char *>(values.data()), count * sizeof(float)))
    inputError("{}: truncated data", path);
  return values;
}

} // namespace moert
