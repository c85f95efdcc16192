// `moert train` (TrainCli.cpp): a training plan over token data.
#pragma once

#include "moert/Comm.h"
#include "moert/RankExecutor.h"

namespace moert {

int trainCommand(int argc, char **argv, Comm &comm);

/// --in-process (moert run and train; Cli.cpp): InputError under mpirun,
/// with --threads other than 1 or on the CUDA device.
void checkInProcess(const Comm &comm, int threads, DeviceKind device);
/// `command` (argv without --in-process, with --threads 1) for every rank
/// of a plan of `ranks`, each on a thread of this process
/// (runRanksInProcess); an error on a rank ends them all, printed as under
/// mpirun.
int runCommandInProcess(int ranks, int argc, char **argv, int (*command)(int, char **, Comm &));

} // namespace moert
