//===- Moec.h - the moec driver as a library entry point --------*- C++ -*-===//
#ifndef MOE_DRIVER_MOEC_H
#define MOE_DRIVER_MOEC_H

namespace moe {

/// Exit codes shared by the tools: 0 success, 1 internal failure, 2 bad input.
enum ExitCode { kExitOk = 0, kExitFailure = 1, kExitBadInput = 2 };

/// Runs `moec` with the given command line; returns the process exit code.
int moecMain(int argc, char **argv);

} // namespace moe

#endif // MOE_DRIVER_MOEC_H
