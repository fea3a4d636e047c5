#include "starling/common/error.h"
#include "starling/net/collective.h"

namespace starling::net {

std::string to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::broadcast:
      return "broadcast";
  }
  return "collective";
}

Shard shard_of(size_t count, int size, int position) {
  const auto n = static_cast<unsigned __int128>(count);
  return {static_cast<size_t>(n * position / size), static_cast<size_t>(n * (position + 1) / size)};
}

}  // namespace starling::net
