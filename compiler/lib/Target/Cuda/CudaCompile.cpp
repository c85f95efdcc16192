//===- CudaCompile.cpp - nvcc into a fatbin, spill check -------*- C++ -*-===//
#include "moe/Target/Cuda.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Base64.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
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

using namespace llvm;

static Error writeText(StringRef path, StringRef text) {
  std::error_code ec;
  raw_fd_ostream os(path, ec);
  if (ec)
    return createStringError(ec, "%s: cannot write: %s", path.str().c_str(),
                             ec.message().c_str());
  os << text;
  return Error::success();
}

Error moe::cuda::emitPlanKernels(json::Object &root, std::vector<EmittedProgram> kernels,
                                 StringRef dir, StringRef nvcc,
                                 const std::vector<std::string> &archs) {
  json::Array *programs = root.getArray("programs");
  if (!programs || programs->size() != kernels.size())
    return createStringError(inconvertibleErrorCode(),
                             "--target cuda: expected the kernels of every program of the plan");
  for (size_t i = 0; i < programs->size(); ++i) {
    json::Object &program = *(*programs)[i].getAsObject();
    EmittedProgram *emitted = &kernels[i];
    // stage<s> (the first entry's programs come first, one per stage), then
    // stage<s>_<entry> for the other entries' (moe-join-entries).
    const int64_t stage = program.getInteger("stage").value_or(int64_t(i));
    std::string name = ("stage" + Twine(stage)).str();
    if (int64_t(i) != stage)
      name += ("_" + program.getString("entry").value_or("entry")).str();
    if (dir.empty() && nvcc.empty()) {
      outs() << "// ===== program " << i << " (" << name << ".cu) =====\n" << emitted->source;
      continue;
    }
    if (!dir.empty()) {
      SmallString<256> source(dir);
      sys::path::append(source, name + ".cu");
      if (Error e = writeText(source, emitted->source))
        return e;
    }
    emitted->table["source"] = name + ".cu";
    emitted->table["code"] = emitted->source;
    if (!nvcc.empty()) {
      // nvcc works on files: a private directory, removed afterwards (kept,
      // and named in the error, when nvcc or ptxas fails).
      SmallString<256> work;
      if (std::error_code ec = sys::fs::createUniqueDirectory("moec-cuda", work))
        return createStringError(ec, "cannot create a temporary directory for nvcc: %s",
                                 ec.message().c_str());
      SmallString<256> source(work), fatbin(work);
      sys::path::append(source, name + ".cu");
      sys::path::append(fatbin, name + ".fatbin");
      if (Error e = writeText(source, emitted->source))
        return e;
      std::string log;
      if (Error compiled = compileFatbin(nvcc, source, fatbin, archs, log)) {
        SmallString<256> logPath(work);
        sys::path::append(logPath, name + ".ptxas.txt");
        std::error_code ec;
        raw_fd_ostream os(logPath, ec);
        if (!ec)
          os << log;
        return joinErrors(std::move(compiled),
                          createStringError(inconvertibleErrorCode(),
                                            "(the source and ptxas' report: %s)", work.c_str()));
      }
      ErrorOr<std::unique_ptr<MemoryBuffer>> image = MemoryBuffer::getFile(fatbin);
      if (!image)
        return createStringError(image.getError(), "%s: cannot read nvcc's fatbin: %s",
                                 fatbin.c_str(), image.getError().message().c_str());
      emitted->table["fatbin"] = encodeBase64((*image)->getBuffer());
      emitted->table["ptxas_report"] = log;
      sys::fs::remove_directories(work);
      json::Array archList;
      for (const std::string &a : archs)
        archList.push_back(a);
      emitted->table["archs"] = std::move(archList);
    }
    program["cuda"] = std::move(emitted->table);
  }
  return Error::success();
}

llvm::Expected<std::vector<std::string>> moe::cuda::parseArchs(llvm::StringRef list) {
  std::vector<std::string> archs;
  llvm::SmallVector<llvm::StringRef> parts;
  list.split(parts, ',', -1, false);
  for (llvm::StringRef a : parts) {
    a = a.trim();
    unsigned number = 0;
    if (!a.starts_with("sm_") || a.drop_front(3).getAsInteger(10, number) || number < 70)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          "--cuda-arch: '%s' is not an architecture like sm_80 (sm_70 or later)",
          a.str().c_str());
    archs.push_back(a.str());
  }
  if (archs.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "--cuda-arch: expected at least one architecture");
  return archs;
}
