#include "starling/net/heap_reuse.h"

#include <mutex>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace starling::net {

void keep_freed_heap_for_reuse() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest allowed value on 64-bit
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  });
}

}  // namespace starling::net
