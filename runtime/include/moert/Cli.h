// `moert` as a library entry point (tools/moert is a thin main over it).
#pragma once

namespace moert {

/// Runs the moert command line; returns the exit code (0 ok, 1 internal
/// failure, 2 bad input: a bad plan, checkpoint, option or prompt).
int moertMain(int argc, char **argv);

} // namespace moert
