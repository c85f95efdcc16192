// `moert train` (TrainCli.cpp): a training plan over token data.
#pragma once

#include "moert/Comm.h"

namespace moert {

int trainCommand(int argc, char **argv, Comm &comm);

} // namespace moert
