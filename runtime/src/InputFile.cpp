// Input files a user names (InputFile.h).
#include "InputFile.h"
#include "moert/Error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace moert {

void checkRegularFile(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    inputError("{}: cannot open: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    inputError("{}: not a regular file", path);
}

std::string readInputFile(const std::string &path, uint64_t maxBytes, const char *what) {
  checkRegularFile(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    inputError("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    inputError("{}: not a regular file", path);
  }
  if (static_cast<uint64_t>(st.st_size) > maxBytes) {
    ::close(fd);
    inputError("{}: {} bytes, more than {} may have ({})", path, st.st_size, what, maxBytes);
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int error = errno;
      ::close(fd);
      inputError("{}: cannot read: {}", path, n == 0 ? "unexpected end of file" : std::strerror(error));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return text;
}

void checkJsonDepth(const std::string &text, const std::string &path) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        inputError("{}: JSON nested deeper than {} levels", path, kMaxJsonDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

void writeFileAtomically(const std::string &path, std::string_view head, std::string_view body) {
  std::string temp = path + ".tmp-XXXXXX";
  int fd = mkstemp(temp.data());
  if (fd < 0)
    inputError("{}: cannot create a temporary file beside it", path);
  auto writeAll = [&](std::string_view bytes) {
    const char *p = bytes.data();
    size_t left = bytes.size();
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return false;
      p += n;
      left -= static_cast<size_t>(n);
    }
    return true;
  };
  bool ok = writeAll(head) && writeAll(body) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    inputError("{}: cannot write", path);
  }
}

std::string temporaryDirectory(const std::string &prefix) {
  const char *tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (!::mkdtemp(pattern.data()))
    runtimeError("cannot create a temporary directory {}: {}", pattern, std::strerror(errno));
  return pattern;
}

} // namespace moert
