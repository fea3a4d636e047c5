// The name of a config section's key list, for headers that declare a section's keys without
// pulling in the TOML parser (config/config_keys.h has the definitions).
#pragma once

#include <vector>

namespace starling::config {

struct Key;
using Keys = std::vector<Key>;

}  // namespace starling::config
