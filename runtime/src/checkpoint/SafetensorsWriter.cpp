// Writing safetensors files one tensor at a time: each tensor's bytes are
// filled through a mapping of just those bytes, unmapped right after, so a
// file (or a checkpoint) larger than memory streams through.
#include "moert/SafetensorsWriter.h"
#include "moert/Error.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace moert {
namespace {

/// The header text (padded to 8 bytes) and each tensor's data_offsets.
std::string layout(const std::vector<TensorToWrite> &tensors,
                   std::vector<std::pair<uint64_t, uint64_t>> &offsets, uint64_t &dataBytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  offsets.clear();
  for (const TensorToWrite &t : tensors) {
    TensorView view{t.dtype, t.shape, nullptr};
    // Keep every tensor aligned to 8 bytes so readers can use typed pointers.
    offset = (offset + 7) / 8 * 8;
    offsets.emplace_back(offset, offset + view.bytes());
    header[t.name] = {{"dtype", dtypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + view.bytes()}}};
    offset += view.bytes();
  }
  dataBytes = offset;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

} // namespace

std::vector<std::pair<uint64_t, uint64_t>>
safetensorsDataOffsets(const std::vector<TensorToWrite> &tensors) {
  std::vector<std::pair<uint64_t, uint64_t>> offsets;
  uint64_t dataBytes;
  layout(tensors, offsets, dataBytes);
  return offsets;
}

void writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors,
                      const std::function<void(uint64_t)> &onBytes) {
  std::vector<std::pair<uint64_t, uint64_t>> offsets;
  uint64_t dataBytes;
  std::string text = layout(tensors, offsets, dataBytes);
  const uint64_t dataStart = 8 + text.size();
  const uint64_t total = dataStart + dataBytes;

  std::string temp = path + ".tmp-XXXXXX";
  int fd = mkstemp(temp.data());
  if (fd < 0)
    inputError("{}: cannot create a temporary file beside it", path);
  ::fchmod(fd, 0644); // mkstemp's 0600 would hide a checkpoint from other users
  auto fail = [&](const char *what) {
    int error = errno;
    ::close(fd);
    std::remove(temp.c_str());
    inputError("{}: cannot {} ({})", path, what, std::strerror(error));
  };
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0)
    fail("size the file");
  // Reserve every block now: a write through the shared mapping into a
  // block the file system cannot provide would end the process with SIGBUS
  // instead of an error. Where the file system has no fallocate, the
  // mapping is still used (as before).
  if (int error = ::posix_fallocate(fd, 0, static_cast<off_t>(total))) {
    if (error != EOPNOTSUPP && error != EINVAL) {
      ::close(fd);
      std::remove(temp.c_str());
      if (error == ENOSPC)
        inputError("{}: no space left on the device for its {} bytes (nothing was written)",
                   path, total);
      inputError("{}: cannot reserve its {} bytes ({})", path, total, std::strerror(error));
    }
  }
  std::string head(8, '\0');
  uint64_t length = text.size();
  std::memcpy(head.data(), &length, 8); // little-endian on every supported host
  head += text;
  for (size_t done = 0; done < head.size();) {
    ssize_t n = ::pwrite(fd, head.data() + done, head.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      fail("write the header");
    done += static_cast<size_t>(n);
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t begin = dataStart + offsets[i].first, end = dataStart + offsets[i].second;
    if (begin == end) {
      if (onBytes)
        onBytes(0);
      continue;
    }
    // A mapping of the tensor's pages only; dirty pages go to the page cache
    // when it is unmapped (written back by the kernel, flushed by fsync).
    const uint64_t mapBegin = begin / page * page;
    const size_t mapBytes = static_cast<size_t>(end - mapBegin);
    void *map = ::mmap(nullptr, mapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(mapBegin));
    if (map == MAP_FAILED)
      fail("map the file");
    try {
      tensors[i].fill(static_cast<char *>(map) + (begin - mapBegin));
    } catch (...) {
      ::munmap(map, mapBytes);
      ::close(fd);
      std::remove(temp.c_str());
      throw;
    }
    ::munmap(map, mapBytes);
    if (onBytes)
      onBytes(end - begin);
  }
  if (::fsync(fd) != 0)
    fail("flush the file");
  ::close(fd);
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    inputError("{}: cannot rename into place", path);
  }
}

} // namespace moert
