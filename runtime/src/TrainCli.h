// `moert train` (TrainCli.cpp): a training plan over token data.
#pragma once

#include "moert/Comm.h"
#include "moert/RankExecutor.h"

namespace moert {

int trainCommand(int argc, char **argv, Comm &comm);

/// --in-process (`asked`), or a plan with several ranks a process (moec
/// compile --tp-arithmetic; moert run and train, Cli.cpp): InputError
/// when the processes (mpirun's, or this one) do not split the plan's
/// ranks, when MPI does not let threads call it, with --threads other than
/// 1 or on the CUDA device. A plan's request is said once (process 0).
void checkInProcess(const Comm &comm, int threads, DeviceKind device, const Plan &plan,
                    const std::string &planPath, bool asked);
/// `command` (argv without --in-process, with --threads 1) for this
/// process's share of the ranks of a plan of `ranks` (all of them, or
/// ranks / P under mpirun -np P: `process` is the process's communicator),
/// each on a thread (runRanksInProcess); an error on a rank ends them all,
/// printed as under mpirun.
int runCommandInProcess(int ranks, int argc, char **argv, int (*command)(int, char **, Comm &),
                        const Comm &process);

} // namespace moert
