#include "starling/swap/tier.h"

#include "starling/common/error.h"
#include "starling/swap/disk_tier.h"
#include "starling/swap/host_tier.h"

namespace starling::swap {

std::unique_ptr<Tier> make_tier(const std::string& kind, const std::filesystem::path& dir) {
  if (kind == "host") return std::make_unique<HostTier>();
  if (kind == "disk") return std::make_unique<DiskTier>(dir);
  throw ConfigError("swap.tier: \"" + kind + "\" is not a tier; use \"host\" or \"disk\"");
}

}  // namespace starling::swap
