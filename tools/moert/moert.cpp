// moert: the MoE runtime (see `moert --help`).
#include "moert/Cli.h"

int main(int argc, char **argv) { return moert::moertMain(argc, argv); }
