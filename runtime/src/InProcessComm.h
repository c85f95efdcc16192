// Every rank of a plan in one process, one thread each (InProcessComm.cpp).
#pragma once

#include "moert/Comm.h"

#include <functional>

namespace moert {

/// Runs `rankMain` for ranks 0..ranks-1 of a world of `ranks`, each on its
/// own thread with a communicator of that world (collectives between the
/// threads, with MpiComm's arithmetic); returns the first nonzero status,
/// else 0. A rank that returns nonzero or throws ends the process (every
/// rank), as a failing rank ends an MPI job.
int runRanksInProcess(int ranks, const std::function<int(Comm &)> &rankMain);

} // namespace moert
