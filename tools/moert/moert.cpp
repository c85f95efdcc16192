// moert: the MoE runtime tool. `moert run` arrives with the plan format.
#include "moert/Version.h"

#include <fmt/core.h>

#include <cstring>

int main(int argc, char **argv) {
  if (argc == 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version"))) {
    fmt::print("moert {}\n", moert::version());
    return 0;
  }
  fmt::print(stderr, "usage: moert --version\n"
                     "(moert run PLAN --weights DIR arrives with the plan format)\n");
  return 2;
}
