#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "starling/common/error.h"
#include "starling/data/sentencepiece_backend.h"

namespace starling::data::spm {
namespace {

constexpr const char* kModuleName = "libstarling_sentencepiece.so";

std::vector<std::filesystem::path> candidates() {
  std::vector<std::filesystem::path> paths;
  if (const char* env = std::getenv("STARLING_SENTENCEPIECE_MODULE")) paths.emplace_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) paths.push_back(exe.parent_path() / kModuleName);
#ifdef STARLING_SENTENCEPIECE_MODULE_PATH
  paths.emplace_back(STARLING_SENTENCEPIECE_MODULE_PATH);
#endif
  return paths;
}

Backend* open_backend() {
  std::string tried;
  for (const auto& path : candidates()) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!handle) {
      tried += "\n  " + path.string() + ": " + ::dlerror();
      continue;
    }
    auto* entry =
        reinterpret_cast<Backend* (*)()>(::dlsym(handle, "starling_sentencepiece_backend"));
    if (!entry) {
      tried += "\n  " + path.string() + ": no entry point starling_sentencepiece_backend";
      continue;
    }
    return entry();  // the module stays loaded for the life of the process
  }
  throw DataError("cannot load the SentencePiece module (" + std::string(kModuleName) +
                  "); set STARLING_SENTENCEPIECE_MODULE to its path. Tried:" + tried);
}

}  // namespace

Backend& backend() {
  static Backend* instance = open_backend();
  return *instance;
}

}  // namespace starling::data::spm
