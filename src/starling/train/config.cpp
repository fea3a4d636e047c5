#include "starling/train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "starling/common/error.h"
#include "starling/config/config_keys.h"

namespace starling::train {
namespace {

using config::Key;
using namespace config;  // the key builders

// Every key of a RunConfig, bound to its fields, table by table in the order to_toml writes
// them. model.preset is handled before the others because it resets the whole model shape.
std::vector<Key> bind(RunConfig& c) {
  auto& t = c.train;
  auto& o = c.optim;
  auto& s = c.sample;
  std::vector<Key> k;
  model::add_config_keys(c.model, k);

  k.push_back(string_key("data", "dir", &c.data.dir,
                         "dataset directory from `starling data prepare`, or llm.c shards"));

  k.push_back(int_key("train", "steps", &t.steps, 1, "optimizer steps in total"));
  k.push_back(
      int_key("train", "batch_size", &t.batch_size, 1, "sequences per micro-batch", 1 << 20));
  k.push_back(int_key("train", "grad_accum", &t.grad_accum, 1, "micro-batches per optimizer step",
                      1 << 20));
  k.push_back(seed_key("train", "seed", &t.seed, "seed of model init and data order"));
  k.push_back(int32_key(
      "train", "threads", &t.threads, 0,
      "intra-op CPU threads; 0 = one per physical core, within a cgroup's CPU limit", 1024));
  k.push_back({"train", "device", "string",
               "\"cpu\", \"cuda\" or \"cuda:N\" (a CUDA libtorch and a GPU for cuda)",
               [&t](const toml::node& n, const std::string& where) {
                 if (!n.is_string()) wrong_type(n, where, "a string");
                 const std::string v = n.as_string()->get();
                 bool ok = v == "cpu" || v == "cuda";
                 if (!ok && v.rfind("cuda:", 0) == 0 && v.size() > 5)
                   ok = v.find_first_not_of("0123456789", 5) == std::string::npos;
                 if (!ok)
                   throw ConfigError(where + ": expected \"cpu\", \"cuda\" or \"cuda:N\", got \"" +
                                     v + "\"");
                 t.device = v;
               },
               [&t](toml::table& tb) { tb.insert_or_assign("device", t.device); }});
  k.push_back(string_key("train", "cpu_allocator", &t.cpu_allocator,
                         "\"caching\" keeps freed tensor memory for reuse (no page faults per "
                         "step); \"system\" returns it to the OS",
                         {"caching", "system"}));
  k.push_back(string_key("train", "dtype", &t.dtype,
                         "compute precision: \"fp32\", \"bf16\" or \"fp16\" (autocast with fp32 "
                         "master weights; fp16 adds dynamic loss scaling; checkpoints stay fp32)",
                         {"fp32", "bf16", "fp16"}));
  k.push_back(
      bool_key("train", "tf32", &t.tf32, "CUDA: let fp32 matrix products use TF32 tensor cores"));
  k.push_back(bool_key("train", "deterministic", &t.deterministic,
                       "CUDA: deterministic kernels only, so reruns give the same bits"));
  k.push_back(string_key("train", "device_memory", &t.device_memory,
                         "CUDA: cap this process's GPU memory (\"12GB\"; \"\" = the whole card)"));
  k.push_back(bool_key("train", "recompute", &t.recompute,
                       "recompute each node's activations in backward (saves memory)"));
  k.push_back(int_key("train", "log_every", &t.log_every, 1, "steps between metric lines"));
  k.push_back(int_key("train", "eval_every", &t.eval_every, 0,
                      "steps between validation passes; 0 = only at the end"));
  k.push_back(
      int_key("train", "eval_batches", &t.eval_batches, 1, "micro-batches per validation pass"));
  k.push_back(int_key("train", "checkpoint_every", &t.checkpoint_every, 0,
                      "steps between checkpoints; 0 = only at the end"));
  k.push_back(
      int32_key("train", "keep_checkpoints", &t.keep_checkpoints, 1, "newest checkpoints kept"));
  k.push_back(string_key("train", "on_checkpoint_error", &t.on_checkpoint_error,
                         "a periodic checkpoint that fails (full disk): \"stop\" the run or "
                         "\"continue\" and retry at the next one",
                         {"stop", "continue"}));
  k.push_back(string_key("train", "out_dir", &t.out_dir,
                         "run directory: checkpoints, metrics.jsonl, config.toml"));
  k.push_back(float_key("train", "peak_tflops", &t.peak_tflops, 0,
                        "device peak TFLOP/s for MFU; 0 = measure with a matmul probe"));
  k.push_back(string_key(
      "train", "init_from", &t.init_from,
      "Hugging Face GPT-2 or LLaMA model.safetensors, or a model's directory (sharded ones "
      "too), or a Starling run or checkpoint, whose weights start the run (the model config must "
      "match them); \"\" = random"));
  k.push_back(bool_key("train", "sample_at_end", &t.sample_at_end,
                       "print a sample ([sample]) when training ends"));

  k.push_back(float_key("optim", "lr", &o.lr, 0, "peak learning rate"));
  k.push_back(float_key("optim", "min_lr", &o.min_lr, 0, "learning rate at the end of the cosine"));
  k.push_back(int_key("optim", "warmup_steps", &o.warmup_steps, 0, "linear warmup steps"));
  k.push_back(string_key("optim", "schedule", &o.schedule,
                         "\"cosine\" (decay to min_lr) or \"constant\" after warmup",
                         {"cosine", "constant"}));
  k.push_back(float_key("optim", "weight_decay", &o.weight_decay, 0,
                        "AdamW weight decay (not on norms/biases)"));
  k.push_back(float_key("optim", "beta1", &o.beta1, 0, "AdamW beta1"));
  k.push_back(float_key("optim", "beta2", &o.beta2, 0, "AdamW beta2"));
  k.push_back(float_key("optim", "eps", &o.eps, 0, "AdamW epsilon"));
  k.push_back(float_key("optim", "grad_clip", &o.grad_clip, 0,
                        "max global gradient norm; 0 = no clipping"));

  k.push_back(string_key("sample", "prompt", &s.prompt, "prompt of the end-of-training sample"));
  k.push_back(int_key("sample", "max_tokens", &s.max_tokens, 1, "tokens to generate"));
  k.push_back(float_key("sample", "temperature", &s.temperature, 0, "0 = greedy"));
  k.push_back(int_key("sample", "top_k", &s.top_k, 0, "sample among the k likeliest; 0 = all"));
  k.push_back(float_key("sample", "top_p", &s.top_p, 0,
                        "sample among the likeliest tokens that together hold this probability "
                        "(after top_k); 1 = off"));
  k.push_back(string_list_key("sample", "stop", &s.stop,
                              "texts that end the sample (it stops before the first one)"));
  k.push_back(seed_key("sample", "seed", &s.seed, "sampling seed"));
  k.push_back(bool_key("sample", "cache", &s.cache,
                       "keep each layer's keys and values (KV cache): each new token runs alone; "
                       "false = the whole context again for every token"));
  k.push_back(int_key("sample", "slide", &s.slide, 0,
                      "past seq_len tokens, how many the context window moves on at once (the "
                      "cached window reruns once per move); 1 = token by token; 0 = half of "
                      "seq_len"));

  strategy::add_config_keys(c.strategy, k);
  net::add_config_keys(c.net, k);
  swap::add_config_keys(c.swap, k);
  strategy::add_config_keys(c.pipeline, k);
  return k;
}

// The tables, in the order their keys were bound: the one list of known tables.
std::vector<std::string> tables_of(const std::vector<Key>& keys) {
  std::vector<std::string> tables;
  for (const auto& k : keys)
    if (std::find(tables.begin(), tables.end(), k.table) == tables.end()) tables.push_back(k.table);
  return tables;
}

std::string at_line(const std::string& source, const toml::node& n) {
  const auto line = n.source().begin.line;
  return line > 0 ? source + ":" + std::to_string(line) : source;
}

// Parses "v = <value>"; a value that is not valid TOML is taken as a bare string.
toml::table parse_override_value(const std::string& value) {
  try {
    return toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    toml::table t;
    t.insert("v", value);
    return t;
  }
}

}  // namespace

namespace {

RunConfig parse_config(std::string_view text, const std::string& source,
                       const std::vector<std::string>& overrides, bool rules_across_keys) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(source + ":" + std::to_string(e.source().begin.line) +
                      ": invalid TOML: " + std::string(e.description()));
  }

  struct Override {
    std::string table, name, text;
    toml::table value;
  };
  std::vector<Override> sets;
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    const auto dot = o.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq)
      throw ConfigError("--set \"" + o + "\": expected table.key=value, e.g. train.steps=100");
    sets.push_back({o.substr(0, dot), o.substr(dot + 1, eq - dot - 1), o,
                    parse_override_value(o.substr(eq + 1))});
  }

  RunConfig config;
  // The preset comes first: it resets the model shape the other model keys refine.
  std::string preset;
  if (auto* model = root["model"].as_table()) {
    if (auto* p = model->get("preset")) {
      if (!p->is_string()) wrong_type(*p, at_line(source, *p) + ": model.preset", "a string");
      preset = p->as_string()->get();
    }
  }
  for (const auto& s : sets)
    if (s.table == "model" && s.name == "preset") {
      if (!s.value["v"].is_string()) throw ConfigError("--set model.preset: expected a string");
      preset = s.value["v"].as_string()->get();
    }
  if (!preset.empty()) {
    try {
      config.model = model::preset(preset);
    } catch (const ConfigError& e) {
      const auto* p = root["model"]["preset"].node();
      const bool from_set = std::any_of(sets.begin(), sets.end(), [](const Override& s) {
        return s.table == "model" && s.name == "preset";
      });
      throw ConfigError((from_set || !p ? "--set model.preset" : at_line(source, *p)) + ": " +
                        e.what());
    }
    config.model_preset = preset;
  }

  auto keys = bind(config);
  const auto tables = tables_of(keys);
  auto find_key = [&](const std::string& table, const std::string& name) -> Key* {
    for (auto& k : keys)
      if (k.table == table && k.name == name) return &k;
    return nullptr;
  };
  auto known_in = [&](const std::string& table) {
    std::string list;
    for (const auto& k : keys)
      if (k.table == table) list += (list.empty() ? "" : ", ") + k.name;
    if (table == "model") list = "preset, " + list;
    return list;
  };

  for (const auto& [table_name, node] : root) {
    const std::string table(table_name.str());
    if (std::find(tables.begin(), tables.end(), table) == tables.end()) {
      std::string known;
      for (const auto& t : tables) known += (known.empty() ? "" : ", ") + t;
      throw ConfigError(at_line(source, node) + ": unknown table [" + table +
                        "]; known tables: " + known);
    }
    const auto* tbl = node.as_table();
    if (!tbl) throw ConfigError(at_line(source, node) + ": \"" + table + "\" must be a table");
    for (const auto& [key_name, value] : *tbl) {
      const std::string name(key_name.str());
      if (table == "model" && name == "preset") continue;
      Key* key = find_key(table, name);
      if (!key)
        throw ConfigError(at_line(source, value) + ": unknown key \"" + table + "." + name +
                          "\"; known keys in [" + table + "]: " + known_in(table));
      key->read(value, at_line(source, value) + ": " + key->full());
    }
  }
  for (const auto& s : sets) {
    if (s.table == "model" && s.name == "preset") continue;
    Key* key = find_key(s.table, s.name);
    if (!key)
      throw ConfigError("--set \"" + s.text + "\": unknown key \"" + s.table + "." + s.name + "\"");
    key->read(*s.value.get("v"), "--set " + key->full());
  }

  // Rules checked after every value is in: a value from the command line may be the one at
  // fault, so the label names those too ("run.toml with --set model.n_head=3").
  std::string where = source;
  for (size_t i = 0; i < sets.size(); ++i)
    where += (i == 0 ? " with --set " : ", --set ") + sets[i].text;
  try {
    config.model.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(where + ": " + e.what());
  }
  if (!rules_across_keys) return config;
  if (config.train.out_dir.empty())
    throw ConfigError(where +
                      ": train.out_dir must not be empty (the run's directory: its "
                      "checkpoints and metrics.jsonl)");
  if (config.data.dir.empty())
    throw ConfigError(where +
                      ": data.dir is required (a directory made by `starling data prepare`)");
  if (config.optim.min_lr > config.optim.lr)
    throw ConfigError(where + ": optim.min_lr (" + std::to_string(config.optim.min_lr) +
                      ") must not exceed optim.lr (" + std::to_string(config.optim.lr) + ")");
  // AdamW divides by sqrt(v) + eps: with 0, a parameter that has had no gradient yet (an untied
  // embedding's unseen rows) becomes 0/0, and the run diverges at its second step.
  if (config.optim.eps <= 0)
    throw ConfigError(
        where + ": optim.eps must be more than 0 (AdamW divides by sqrt(v) + eps; " +
        "with 0 a parameter without a gradient yet becomes NaN); the default is 1e-8");
  if (config.optim.beta1 >= 1 || config.optim.beta2 >= 1)
    throw ConfigError(where + ": optim.beta1 and optim.beta2 must be < 1");
  if (config.sample.top_p <= 0 || config.sample.top_p > 1)
    throw ConfigError(where + ": sample.top_p must be in (0, 1]");
  // Every atom peer gathers at least one micro-batch a step: a smaller target is never met, it
  // is overshot every step.
  if (config.strategy.kind == "atom" && config.strategy.target_batch > 0 &&
      config.strategy.target_batch < config.train.batch_size)
    throw ConfigError(where + ": strategy.target_batch (" +
                      std::to_string(config.strategy.target_batch) +
                      ") is less than one micro-batch (train.batch_size = " +
                      std::to_string(config.train.batch_size) +
                      "): each atom peer gathers at least one a step, so the swarm would take "
                      "more every step; set strategy.target_batch to " +
                      std::to_string(config.train.batch_size) + " or more");
  strategy::check(config.strategy, where);
  net::check(config.net, where);
  swap::check(config.swap, where);
  strategy::check(config.pipeline, where);
  return config;
}

}  // namespace

RunConfig parse_run_config(std::string_view text, const std::string& source,
                           const std::vector<std::string>& overrides) {
  return parse_config(text, source, overrides, true);
}

RunConfig parse_saved_config(std::string_view text, const std::string& source) {
  try {
    return parse_config(text, source, {}, false);
  } catch (const ConfigError& e) {
    // Key checks that know no line ("model.preset: unknown preset") name the file here.
    if (std::string_view(e.what()).starts_with(source)) throw;
    throw ConfigError(source + ": the run's config: " + e.what());
  }
}

void check_device_memory(const RunConfig& c) {
  if (c.train.device_memory.empty()) return;
  (void)swap::parse_bytes(c.train.device_memory, "train.device_memory");
  if (c.train.device.rfind("cuda", 0) != 0)
    throw ConfigError("train.device_memory caps a GPU's memory; train.device is \"" +
                      c.train.device + "\"");
}

RunConfig load_run_config(const std::filesystem::path& file,
                          const std::vector<std::string>& overrides) {
  if (std::filesystem::is_directory(file))
    throw ConfigError(file.string() + ": is a directory, not a config file");
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot read config file (missing or unreadable)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), file.string(), overrides);
}

std::string toml_string(const std::string& text, const std::string& what) {
  std::string out;
  try {
    // A JSON string is a TOML basic string, but for DEL, which JSON leaves as it is.
    out = nlohmann::json(text).dump();
  } catch (const nlohmann::json::exception&) {
    throw ConfigError(what + ": \"" + text + "\" is not valid UTF-8, which a TOML string must be");
  }
  for (size_t at; (at = out.find('\x7f')) != std::string::npos;) out.replace(at, 1, "\\u007f");
  return out;
}

std::string to_toml(const RunConfig& config) {
  RunConfig copy = config;
  auto keys = bind(copy);
  toml::table root;
  for (const auto& table : tables_of(keys)) {
    toml::table t;
    if (table == "model" && !config.model_preset.empty()) t.insert("preset", config.model_preset);
    for (auto& k : keys)
      if (k.table == table) k.write(t);
    root.insert(table, std::move(t));
  }
  std::ostringstream out;
  out << toml::toml_formatter(root) << "\n";
  return out.str();
}

std::string describe_keys() {
  RunConfig defaults;
  auto keys = bind(defaults);
  std::ostringstream out;
  out << "model.preset  string  \"\"  start from a named shape (see `starling model presets`)\n";
  for (auto& k : keys) {
    toml::table t;
    k.write(t);
    std::string v;
    if (const auto* d = t.empty() ? nullptr : t.begin()->second.as_floating_point()) {
      // The shortest text that reads back as the same double: 0.1, not toml++'s
      // 0.10000000000000001; still a TOML float (1.0, not 1).
      char text[32];
      v.assign(text, std::to_chars(text, text + sizeof text, d->get()).ptr);
      if (v.find_first_of(".eEin") == std::string::npos) v += ".0";
    } else {
      std::ostringstream value;
      value << toml::toml_formatter(t);
      v = value.str();
      const auto eq = v.find(" = ");
      v = eq == std::string::npos ? v : v.substr(eq + 3);
      while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    }
    out << k.full() << "  " << k.type << "  " << v << "  " << k.doc << "\n";
  }
  return out.str();
}

}  // namespace starling::train
