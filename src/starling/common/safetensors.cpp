#include "starling/common/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "starling/common/error.h"

namespace starling {
namespace {

// The format caps the header at 100 MB; anything larger is a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw Error(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

bool dtype_from_name(const std::string& name, at::ScalarType* out) {
  for (const auto& d : kDtypes)
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  return false;
}

void write_all(int fd, const void* data, size_t n, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(path.string() + ": write failed: " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// A private, writable mapping of a whole file (writes are copied on write, never reach the file).
struct FileMapping {
  void* data = nullptr;
  size_t bytes = 0;
  ~FileMapping() {
    if (data != nullptr) ::munmap(data, bytes);
  }
  // A tensor whose bytes were [p, p + n) is gone: the whole pages it alone covered leave the
  // process now rather than when the last tensor of the file goes (a resumed swapped run reads
  // a moment, writes it to its tier and drops it, one after another).
  void drop(void* p, size_t n) const {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
};

std::shared_ptr<FileMapping> map_file(const std::filesystem::path& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(path.string() + ": cannot open: " + std::strerror(errno));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) throw CheckpointError(path.string() + ": cannot map: " + std::strerror(err));
  auto m = std::make_shared<FileMapping>();
  m->data = p;
  m->bytes = bytes;
  return m;
}

}  // namespace

const at::Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  throw CheckpointError(file.string() + ": no tensor named \"" + name + "\"");
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& p) { return p.first == name; });
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const TensorReader& read) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned, as the reference writer does.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(path.string() + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, len, 8, path);
    write_all(fd, text.data(), text.size(), path);
    for (const auto& [name, t] : tensors) {
      const at::Tensor c = (read ? read(t) : t).detach().to(at::kCPU).contiguous();
      if (c.sizes() != t.sizes() || c.scalar_type() != t.scalar_type())
        throw std::logic_error("write_safetensors: the reader changed tensor \"" + name + "\"");
      write_all(fd, c.data_ptr(), c.numel() * c.element_size(), path);
    }
    if (::fsync(fd) != 0)
      throw CheckpointError(path.string() + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0)
    throw CheckpointError(path.string() + ": close failed: " + std::strerror(errno));
}

SafetensorsFile read_safetensors(const std::filesystem::path& path, SafetensorsRead mode) {
  const std::string where = path.string();
  // A directory opens as an empty stream and a FIFO blocks: neither is a file to read.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status))
    throw CheckpointError(where + ": is a directory, not a safetensors file");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw CheckpointError(where + ": is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(where + ": cannot open (missing or unreadable)");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (!in) throw CheckpointError(where + ": cannot read its size (not a regular file?)");
  if (file_size < 8)
    throw CheckpointError(where + ": not a safetensors file (only " + std::to_string(file_size) +
                          " bytes)");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    throw CheckpointError(where + ": header length " + std::to_string(header_len) +
                          " does not fit in a file of " + std::to_string(file_size) + " bytes");
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(where + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw CheckpointError(where + ": header is not a JSON object");

  SafetensorsFile result;
  result.file = path;
  const uint64_t data_size = file_size - 8 - header_len;
  struct Entry {
    std::string name;
    at::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw CheckpointError(where + ": __metadata__ is not an object");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string())
          throw CheckpointError(where + ": __metadata__." + k + " is not a string");
        result.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string what = where + ": tensor \"" + name + "\"";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      throw CheckpointError(what + ": expected {dtype, shape, data_offsets}");
    Entry e;
    e.name = name;
    if (!info["dtype"].is_string() || !dtype_from_name(info["dtype"].get<std::string>(), &e.type))
      throw CheckpointError(what + ": unsupported dtype " + info["dtype"].dump());
    const auto& shape = info["shape"];
    const auto& offsets = info["data_offsets"];
    if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2)
      throw CheckpointError(what + ": malformed shape or data_offsets");
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) throw CheckpointError(what + ": shape must hold integers >= 0");
      // Guard the product: an overflowed element count could pass the size check below.
      if (d.get<uint64_t>() != 0 && numel > (uint64_t{1} << 60) / d.get<uint64_t>())
        throw CheckpointError(what + ": shape " + shape.dump() + " is too large");
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw CheckpointError(what + ": data_offsets must be integers >= 0");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    const uint64_t bytes = numel * c10::elementSize(e.type);
    if (e.end < e.begin || e.end - e.begin != bytes)
      throw CheckpointError(what + ": data_offsets [" + std::to_string(e.begin) + ", " +
                            std::to_string(e.end) + ") disagree with shape and dtype (" +
                            std::to_string(bytes) + " bytes)");
    if (e.end > data_size)
      throw CheckpointError(what + ": data ends at byte " + std::to_string(e.end) +
                            " but the file holds only " + std::to_string(data_size) +
                            " data bytes (truncated?)");
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].begin < entries[i - 1].end)
      throw CheckpointError(where + ": tensors \"" + entries[i - 1].name + "\" and \"" +
                            entries[i].name + "\" overlap");
  std::shared_ptr<FileMapping> mapping;
  if (mode == SafetensorsRead::kMap && !entries.empty()) mapping = map_file(path, file_size);
  for (const auto& e : entries) {
    const uint64_t at_byte = 8 + header_len + e.begin;
    // A mapped tensor keeps the mapping alive; one whose bytes are not aligned to its element
    // size (possible in foreign files) is copied instead.
    if (mapping && at_byte % c10::elementSize(e.type) == 0) {
      std::shared_ptr<FileMapping> keep = mapping;
      char* data = static_cast<char*>(mapping->data) + at_byte;
      const size_t bytes = e.end - e.begin;
      result.tensors.emplace_back(e.name, at::from_blob(
                                              data, e.shape,
                                              [keep, bytes](void* p) mutable {
                                                keep->drop(p, bytes);
                                                keep.reset();
                                              },
                                              at::TensorOptions(e.type)));
      continue;
    }
    at::Tensor t = at::empty(e.shape, at::TensorOptions(e.type));
    in.seekg(static_cast<std::streamoff>(at_byte));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
    if (!in) throw CheckpointError(where + ": read failed for tensor \"" + e.name + "\"");
    result.tensors.emplace_back(e.name, std::move(t));
  }
  return result;
}

}  // namespace starling
