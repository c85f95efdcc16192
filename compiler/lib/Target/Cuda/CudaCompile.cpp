//===- CudaCompile.cpp - nvcc into a fatbin, spill check -------*- C++ -*-===//
#include "moe/Target/Cuda.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"

#include <cstdlib>

namespace moe::cuda {
namespace {
llvm::Error compileError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}
} // namespace

std::string findNvcc() {
  if (const char *env = std::getenv("MOE_NVCC"))
    if (*env)
      return llvm::sys::fs::can_execute(env) ? std::string(env) : std::string();
#ifdef MOE_CUDA_COMPILER
  if (llvm::sys::fs::can_execute(MOE_CUDA_COMPILER))
    return MOE_CUDA_COMPILER;
#endif
  if (llvm::sys::fs::can_execute("/usr/local/cuda/bin/nvcc"))
    return "/usr/local/cuda/bin/nvcc";
  if (auto path = llvm::sys::findProgramByName("nvcc"))
    return *path;
  return "";
}

llvm::Error checkPtxasLog(llvm::StringRef log) {
  // ptxas -v prints, per kernel and arch:
  //   ptxas info    : Compiling entry function 'NAME' for 'sm_80'
  //   ptxas info    : Function properties for NAME
  //       N bytes stack frame, N bytes spill stores, N bytes spill loads
  llvm::SmallVector<llvm::StringRef> lines;
  log.split(lines, '\n');
  std::string kernel = "?", arch = "?";
  for (llvm::StringRef line : lines) {
    if (size_t at = line.find("Compiling entry function '"); at != llvm::StringRef::npos) {
      llvm::StringRef rest = line.substr(at + 26);
      kernel = rest.take_until([](char c) { return c == '\''; }).str();
      if (size_t f = rest.find("for '"); f != llvm::StringRef::npos)
        arch = rest.substr(f + 5).take_until([](char c) { return c == '\''; }).str();
      continue;
    }
    if (size_t at = line.find("Function properties for "); at != llvm::StringRef::npos) {
      kernel = line.substr(at + 24).trim().str();
      continue;
    }
    if (!line.contains("bytes stack frame"))
      continue;
    long long stack = 0, stores = 0, loads = 0;
    if (std::sscanf(line.trim().str().c_str(),
                    "%lld bytes stack frame, %lld bytes spill stores, %lld bytes spill loads",
                    &stack, &stores, &loads) != 3)
      continue;
    if (stack > 0 || stores > 0 || loads > 0)
      return compileError(llvm::formatv(
          "--target cuda: kernel '{0}' ({1}) uses local memory: {2} bytes stack frame, {3} "
          "bytes spill stores, {4} bytes spill loads",
          kernel, arch, stack, stores, loads));
  }
  return llvm::Error::success();
}

llvm::Error compileFatbin(llvm::StringRef nvcc, llvm::StringRef source, llvm::StringRef fatbin,
                          const std::vector<std::string> &archs, std::string &ptxasLog) {
  std::vector<std::string> args = {nvcc.str(), "--fatbin", "-std=c++17", "-O3",
                                   "-Xptxas", "-v", "-o", fatbin.str()};
  for (const std::string &arch : archs) {
    llvm::StringRef number = llvm::StringRef(arch).drop_front(3); // sm_80 -> 80
    args.push_back("-gencode");
    args.push_back(llvm::formatv("arch=compute_{0},code=[sm_{0},compute_{0}]", number).str());
  }
  args.push_back(source.str());
  llvm::SmallVector<llvm::StringRef> argv(args.begin(), args.end());
  llvm::SmallString<128> logPath;
  if (std::error_code ec = llvm::sys::fs::createTemporaryFile("moec-nvcc", "log", logPath))
    return compileError("--target cuda: cannot create a temporary file: " + ec.message());
  std::optional<llvm::StringRef> redirects[] = {std::nullopt, logPath.str(), logPath.str()};
  std::string message;
  int rc = llvm::sys::ExecuteAndWait(args[0], argv, std::nullopt, redirects, 0, 0, &message);
  auto log = llvm::MemoryBuffer::getFile(logPath);
  ptxasLog = log ? (*log)->getBuffer().str() : std::string();
  llvm::sys::fs::remove(logPath);
  if (rc != 0)
    return compileError(llvm::formatv("--target cuda: {0} failed on {1} (exit {2}{3}):\n{4}",
                                      nvcc, source, rc, message.empty() ? "" : ", " + message,
                                      ptxasLog));
  return checkPtxasLog(ptxasLog);
}

} // namespace moe::cuda
