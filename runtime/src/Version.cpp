#include "moert/Version.h"

const char *moert::version() { return "0.1.0"; }
