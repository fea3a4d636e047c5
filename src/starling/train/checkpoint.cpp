#include "starling/train/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "starling/common/error.h"
#include "starling/data/atomic_file.h"

namespace starling::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "starling-checkpoint";
constexpr int kVersion = 1;

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(dir.string() + ": cannot open directory to fsync");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError(dir.string() + ": fsync failed: " + std::strerror(err));
}

void write_text(const fs::path& path, const std::string& text) {
  data::write_file_atomically(path, {std::as_bytes(std::span(text.data(), text.size()))});
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

nlohmann::json meta_to_json(const CheckpointMeta& m) {
  nlohmann::json j = {
      {"format", kFormat},
      {"version", kVersion},
      {"step", m.step},
      {"tokens", m.tokens},
      {"loader", m.loader},
      {"tokenizer", {{"kind", m.tokenizer_kind}, {"vocab_size", m.data_vocab_size}}},
      {"val_loss", m.val_loss},
      {"config", m.config_toml}};
  if (!m.strategy.is_null()) j["strategy"] = m.strategy;
  return j;
}

template <class T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw CheckpointError(where + ": missing field \"" + key + "\"");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw CheckpointError(where + ": field \"" + key + "\" has the wrong type (" +
                          j.at(key).dump() + ")");
  }
}

// A whole number in [min, max]: nlohmann converts 1e30 or -1 to an integer type without a word
// (-1 to 2^64 - 1), so a damaged meta.json could resume at a nonsense step.
template <class T>
T whole_field(const nlohmann::json& j, const char* key, const std::string& where, T min) {
  const auto v = field<nlohmann::json>(j, key, where);
  constexpr auto max = static_cast<uint64_t>(std::numeric_limits<T>::max());
  bool fits = false;
  if (v.is_number_unsigned()) {
    fits = v.get<uint64_t>() <= max;
  } else if (v.is_number_integer()) {
    fits = v.get<int64_t>() >= 0 && static_cast<uint64_t>(v.get<int64_t>()) <= max;
  }
  if (!fits || v.get<T>() < min)
    throw CheckpointError(where + ": field \"" + key + "\" must be a whole number from " +
                          std::to_string(min) + " to " +
                          std::to_string(std::numeric_limits<T>::max()) + ", not " + v.dump());
  return v.get<T>();
}

CheckpointMeta meta_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw CheckpointError(where + ": not a JSON object");
  if (field<std::string>(j, "format", where) != kFormat)
    throw CheckpointError(where + ": format is not \"" + std::string(kFormat) + "\"");
  const int version = field<int>(j, "version", where);
  if (version != kVersion)
    throw CheckpointError(where + ": unsupported checkpoint version " + std::to_string(version) +
                          " (this build reads version " + std::to_string(kVersion) + ")");
  CheckpointMeta m;
  m.step = whole_field<int64_t>(j, "step", where, 0);
  m.tokens = whole_field<uint64_t>(j, "tokens", where, 0);
  try {
    m.loader = j.at("loader").get<data::LoaderState>();
  } catch (const std::exception& e) {
    throw CheckpointError(where + ": field \"loader\" is malformed: " + e.what());
  }
  const auto tok = field<nlohmann::json>(j, "tokenizer", where);
  m.tokenizer_kind = field<std::string>(tok, "kind", where + " tokenizer");
  m.data_vocab_size = whole_field<uint32_t>(tok, "vocab_size", where + " tokenizer", 1);
  m.val_loss = field<double>(j, "val_loss", where);
  m.config_toml = field<std::string>(j, "config", where);
  if (j.contains("strategy")) {
    if (!j["strategy"].is_object())
      throw CheckpointError(where + ": field \"strategy\" must be an object");
    m.strategy = j["strategy"];
  }
  return m;
}

// The complete checkpoints of `ckpt_dir`, oldest first.
std::vector<std::string> checkpoint_names(const fs::path& ckpt_dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ckpt_dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && e.is_directory()) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Removes what interrupted saves left behind (".tmp-*" directories).
void remove_leftovers(const fs::path& ckpt_dir) {
  for (const auto& e : fs::directory_iterator(ckpt_dir))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(e.path());
}

void prune(const fs::path& ckpt_dir, int keep, const std::string& current) {
  remove_leftovers(ckpt_dir);
  const std::vector<std::string> names = checkpoint_names(ckpt_dir);
  const int excess = static_cast<int>(names.size()) - std::max(keep, 1);
  for (int i = 0; i < excess; ++i)
    if (names[static_cast<size_t>(i)] != current)
      fs::remove_all(ckpt_dir / names[static_cast<size_t>(i)]);
}

}  // namespace

namespace {

// Bytes a checkpoint of this state takes on disk, headers and meta.json included (an estimate
// from above: the tensors exactly, the rest generously).
uint64_t checkpoint_bytes(const graph::ParamStore& params, const AdamW& optimizer,
                          const SaveOptions& options) {
  uint64_t n = 64 << 10;  // meta.json, the RNG state
  auto add = [&](const at::Tensor& t) {
    // The tensor, its safetensors header entry, and a page of file-system slack.
    n += static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size()) + 256;
  };
  for (const auto& p : params.params()) add(p.value);
  for (const auto& [name, t] : optimizer.state()) add(t);
  for (const auto& [name, t] : options.strategy_tensors) add(t);
  if (!options.tokenizer_model.empty()) {
    std::error_code ec;
    const auto size = fs::file_size(options.tokenizer_model, ec);
    if (!ec) n += size;
  }
  return n;
}

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

// The disk cannot hold the next checkpoint (the message names the directory and the bytes).
struct NoRoom : CheckpointError {
  using CheckpointError::CheckpointError;
};

// Frees room for a checkpoint of `needed` bytes before writing it: leftovers of interrupted saves
// first, then the oldest checkpoints while more than one is kept; the newest complete one is never
// touched. NoRoom when the disk still cannot hold it.
void make_room(const fs::path& ckpt_dir, uint64_t needed, const std::string& name,
               const SaveOptions& options) {
  auto available = [&] { return fs::space(ckpt_dir).available; };
  if (available() >= needed) return;
  remove_leftovers(ckpt_dir);
  std::vector<std::string> names = checkpoint_names(ckpt_dir);
  std::erase(names, name);  // a re-save of this step replaces it only once the new one is whole
  for (size_t i = 0; i + 1 < names.size() && available() < needed; ++i) {
    fs::remove_all(ckpt_dir / names[i]);
    if (options.on_note)
      options.on_note("removed checkpoint " + names[i] + " to make room for " + name);
  }
  if (const uint64_t free = available(); free < needed)
    throw NoRoom(ckpt_dir.string() + ": the checkpoint of " + name + " needs about " +
                 megabytes(needed) + " and the disk has " + megabytes(free) + " free" +
                 (names.empty() ? std::string()
                                : "; the newest checkpoint, " + names.back() + ", is intact"));
}

fs::path save_checkpoint_unchecked(const fs::path& run_dir, const fs::path& tmp,
                                   const graph::ParamStore& params, const AdamW& optimizer,
                                   const CheckpointMeta& meta, const SaveOptions& options) {
  auto stage = [&](const char* s) {
    if (options.on_stage) options.on_stage(s);
  };
  const fs::path ckpt_dir = run_dir / "checkpoints";
  std::error_code ec;
  const std::string name = step_name(meta.step);
  make_room(ckpt_dir, checkpoint_bytes(params, optimizer, options), name, options);
  fs::remove_all(tmp);
  fs::create_directory(tmp);

  std::vector<std::pair<std::string, at::Tensor>> weights;
  for (const auto& p : params.params()) weights.emplace_back(p.name, p.value);
  write_safetensors(tmp / "model.safetensors", weights, {{"format", "pt"}}, options.read_state);
  stage("model");

  auto state = optimizer.state();
  state.emplace_back(kRngTensor, at::detail::getDefaultCPUGenerator().get_state());
  for (const auto& [name, t] : options.strategy_tensors) {
    if (name.rfind("strategy.", 0) != 0)
      throw std::logic_error("strategy tensor \"" + name + "\" lacks the \"strategy.\" prefix");
    state.emplace_back(name, t);
  }
  write_safetensors(tmp / "optimizer.safetensors", state,
                    {{"optimizer", "adamw"}, {"steps", std::to_string(optimizer.steps())}},
                    options.read_state);
  stage("optimizer");

  if (!options.tokenizer_model.empty()) {
    fs::copy_file(options.tokenizer_model, tmp / "tokenizer.model",
                  fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw CheckpointError(options.tokenizer_model.string() +
                            ": cannot copy into checkpoint: " + ec.message());
  }
  write_text(tmp / "meta.json", meta_to_json(meta).dump(2) + "\n");
  fsync_dir(tmp);
  stage("meta");

  const fs::path final_dir = ckpt_dir / name;
  if (fs::exists(final_dir)) {
    // Re-saving a step: swap the two directories in one atomic step, so `latest` never points at
    // a missing directory; the old contents end up under the temporary name and are removed.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      throw CheckpointError(final_dir.string() + ": cannot replace: " + std::strerror(errno));
    fsync_dir(ckpt_dir);
    fs::remove_all(tmp);
  } else {
    fs::rename(tmp, final_dir);
  }
  fsync_dir(ckpt_dir);
  stage("renamed");

  write_text(ckpt_dir / "latest", name + "\n");
  stage("committed");
  prune(ckpt_dir, options.keep, name);
  return final_dir;
}

}  // namespace

fs::path save_checkpoint(const fs::path& run_dir, const graph::ParamStore& params,
                         const AdamW& optimizer, const CheckpointMeta& meta,
                         const SaveOptions& options) {
  const fs::path ckpt_dir = run_dir / "checkpoints";
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  if (ec) throw CheckpointError(ckpt_dir.string() + ": cannot create: " + ec.message());
  const fs::path tmp =
      ckpt_dir / (".tmp-" + step_name(meta.step) + "-" + std::to_string(::getpid()));
  // Disk full, permissions, a vanished directory: the previous checkpoint is untouched, and what
  // this save wrote is removed so that it takes no room.
  auto failed = [&](const std::string& why) {
    fs::remove_all(tmp, ec);
    std::string room;
    if (const auto space = fs::space(ckpt_dir, ec); !ec)
      room = " (it needs about " + megabytes(checkpoint_bytes(params, optimizer, options)) + "; " +
             megabytes(space.available) + " free now)";
    return CheckpointError("saving a checkpoint in " + ckpt_dir.string() + " failed" + room + ": " +
                           why);
  };
  try {
    return save_checkpoint_unchecked(run_dir, tmp, params, optimizer, meta, options);
  } catch (const fs::filesystem_error& e) {
    throw failed(e.what());
  } catch (const NoRoom&) {
    throw;  // nothing was written
  } catch (const CheckpointError& e) {
    throw failed(e.what());
  }
}

namespace {

// The complete checkpoint of the highest step in `ckpt_dir` (a checkpoint directory is renamed
// into place only once complete; meta.json is checked all the same), if any.
std::optional<fs::path> newest_checkpoint(const fs::path& ckpt_dir) {
  std::optional<fs::path> newest;
  std::error_code ec;
  for (fs::directory_iterator it(ckpt_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind("step_", 0) != 0 || n.size() == 5 ||
        n.find_first_not_of("0123456789", 5) != std::string::npos ||
        !fs::exists(it->path() / "meta.json"))
      continue;
    // Of equal width up to 10^8 steps; longer names are higher steps.
    if (!newest || n.size() > newest->filename().string().size() ||
        (n.size() == newest->filename().string().size() && n > newest->filename().string()))
      newest = it->path();
  }
  return newest;
}

}  // namespace

bool holds_checkpoint(const fs::path& run_dir) {
  const fs::path ckpt_dir = run_dir / "checkpoints";
  return fs::exists(ckpt_dir / "latest") || newest_checkpoint(ckpt_dir).has_value();
}

fs::path find_checkpoint(const fs::path& path) {
  if (fs::exists(path / "meta.json")) return path;
  for (const fs::path& dir : {path, path / "checkpoints"}) {
    const fs::path latest = dir / "latest";
    if (!fs::exists(latest)) continue;
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    if (name.empty() || name.find('/') != std::string::npos)
      throw CheckpointError(latest.string() + ": does not name a checkpoint directory");
    if (!fs::exists(dir / name / "meta.json"))
      throw CheckpointError(latest.string() + ": points at \"" + name +
                            "\", which is missing or incomplete");
    return dir / name;
  }
  // `latest` lost (a copy that left it out, a hand's rm): the newest complete checkpoint.
  for (const fs::path& dir : {path, path / "checkpoints"})
    if (const auto newest = newest_checkpoint(dir)) return *newest;
  throw CheckpointError(path.string() +
                        ": no checkpoint found (expected meta.json, latest, "
                        "checkpoints/latest or checkpoints/step_*)");
}

Checkpoint read_checkpoint(const fs::path& dir) {
  Checkpoint c;
  c.dir = dir;
  const fs::path meta_path = dir / "meta.json";
  std::ifstream in(meta_path);
  if (!in) throw CheckpointError(meta_path.string() + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(meta_path.string() + ": not valid JSON: " + e.what());
  }
  c.meta = meta_from_json(j, meta_path.string());
  // The directory's name is the step it holds: a meta.json of another step (copied in by hand, or
  // damaged) would resume a run at a step its weights are not from.
  const fs::path named = dir.filename().empty() ? dir.parent_path() : dir;  // "step_X/"
  if (const std::string name = named.filename().string();
      name.size() > 5 && name.rfind("step_", 0) == 0 &&
      name.find_first_not_of("0123456789", 5) == std::string::npos && name.size() - 5 <= 18 &&
      std::stoll(name.substr(5)) != c.meta.step)
    throw CheckpointError(meta_path.string() + ": says step " + std::to_string(c.meta.step) +
                          ", but its directory is " + name);
  c.model = read_safetensors(dir / "model.safetensors", SafetensorsRead::kMap);
  c.optimizer = read_safetensors(dir / "optimizer.safetensors", SafetensorsRead::kMap);
  return c;
}

void load_params(const SafetensorsFile& weights, graph::ParamStore& params) {
  at::NoGradGuard no_grad;
  for (auto& p : params.params()) {
    if (!weights.contains(p.name))
      throw CheckpointError(weights.file.string() + ": missing tensor \"" + p.name +
                            "\" that the model needs (different model config?)");
    const at::Tensor& t = weights.at(p.name);
    if (t.sizes() != p.value.sizes())
      throw CheckpointError(weights.file.string() + ": tensor \"" + p.name + "\" has shape " +
                            c10::str(t.sizes()) + " but the model needs " +
                            c10::str(p.value.sizes()));
    if (!t.is_floating_point())
      throw CheckpointError(weights.file.string() + ": tensor \"" + p.name +
                            "\" is not floating point");
    p.value.copy_(t);
  }
  for (const auto& [name, _] : weights.tensors)
    if (!params.contains(name) && !params.held_elsewhere(name))  // another part's: skipped
      throw CheckpointError(weights.file.string() + ": tensor \"" + name +
                            "\" is not a parameter of this model (different model config?)");
}

}  // namespace starling::train
