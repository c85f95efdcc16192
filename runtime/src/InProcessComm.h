// Every rank of a plan in one process, one thread each (InProcessComm.cpp).
#pragma once

#include "moert/Comm.h"

#include <functional>

namespace moert {

/// Runs `rankMain` for the ranks of a world of `ranks` that process
/// `process` of `processes` holds (ranks / processes of them, in order),
/// each on its own thread with a communicator of that world (collectives
/// between the threads, and with other processes' ranks over MPI, which
/// must allow every thread to call it; MpiComm's arithmetic); returns the
/// first nonzero status, else 0. A rank that returns nonzero or throws ends
/// the job (every rank), as a failing rank ends an MPI job.
int runRanksInProcess(int ranks, const std::function<int(Comm &)> &rankMain,
                      int processes = 1, int process = 0);

} // namespace moert
