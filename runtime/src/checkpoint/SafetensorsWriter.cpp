#include "moert/SafetensorsWriter.h"
#include "moert/Error.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace moert {

void writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<size_t> offsets;
  size_t offset = 0;
  for (const TensorToWrite &t : tensors) {
    TensorView view{t.dtype, t.shape, nullptr};
    // Keep every tensor aligned to 8 bytes so readers can use typed pointers.
    offset = (offset + 7) / 8 * 8;
    offsets.push_back(offset);
    header[t.name] = {{"dtype", dtypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + view.bytes()}}};
    offset += view.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  size_t total = 8 + text.size() + offset;

  std::string temp = path + ".tmp-XXXXXX";
  int fd = mkstemp(temp.data());
  if (fd < 0)
    inputError("{}: cannot create a temporary file beside it", path);
  ::fchmod(fd, 0644); // mkstemp's 0600 would hide a checkpoint from other users
  auto fail = [&](const char *what) {
    ::close(fd);
    std::remove(temp.c_str());
    inputError("{}: cannot {} ({})", path, what, std::strerror(errno));
  };
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0)
    fail("size the file");
  void *map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED)
    fail("map the file");
  char *base = static_cast<char *>(map);
  uint64_t length = text.size();
  std::memcpy(base, &length, 8); // little-endian on every supported host
  std::memcpy(base + 8, text.data(), text.size());
  char *data = base + 8 + text.size();
  for (size_t i = 0; i < tensors.size(); ++i)
    tensors[i].fill(data + offsets[i]);
  bool synced = ::msync(map, total, MS_SYNC) == 0;
  ::munmap(map, total);
  if (!synced || ::fsync(fd) != 0)
    fail("flush the file");
  ::close(fd);
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    inputError("{}: cannot rename into place", path);
  }
}

} // namespace moert
