/* qva_version(): the header's QVA_VERSION, which CMake checks against
 * project(VERSION) at configure time. */
#include "qvattn.h"

int qva_version(void) { return QVA_VERSION; }
