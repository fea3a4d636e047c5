// Crash-safe file replacement shared by the data writers (shards, meta.json, tokenizer copies).
#pragma once

#include <cstddef>
#include <filesystem>
#include <initializer_list>
#include <span>

namespace starling::data {

// Writes the concatenation of `chunks` to a temporary file next to `path`, fsyncs it, renames it
// over `path` and fsyncs the directory: readers see the old file or the complete new one, never a
// torn write. DataError names the file and the failing system call.
void write_file_atomically(const std::filesystem::path& path,
                           std::initializer_list<std::span<const std::byte>> chunks);

}  // namespace starling::data
