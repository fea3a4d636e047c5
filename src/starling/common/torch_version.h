// Which libtorch this translation unit is compiled against. Starling builds unchanged on Debian's
// libtorch 1.13 (CPU) and on any libtorch 2.x (CPU or CUDA); code that needs an API of one side
// tests STARLING_TORCH_AT_LEAST rather than guessing from other macros.
#pragma once

#include <torch/version.h>

#define STARLING_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
