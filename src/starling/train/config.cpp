#include "starling/train/config.h"

#include <toml++/toml.h>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "starling/common/error.h"

namespace starling::train {
namespace {

// One config key: how to read it from a TOML node, write it back, and document it.
struct Key {
  std::string table, name, type, doc;
  std::function<void(const toml::node&, const std::string& where)> read;
  std::function<void(toml::table&)> write;
  std::string full() const { return table + "." + name; }
};

std::string type_name(const toml::node& n) {
  std::ostringstream s;
  s << n.type();
  return s.str();
}

[[noreturn]] void wrong_type(const toml::node& n, const std::string& where, const char* expected) {
  throw ConfigError(where + ": expected " + expected + ", got " + type_name(n));
}

int64_t read_int(const toml::node& n, const std::string& where) {
  if (!n.is_integer()) wrong_type(n, where, "an integer");
  return n.as_integer()->get();
}

Key int_key(const char* table, const char* name, int64_t* p, int64_t min, const char* doc) {
  return {table,
          name,
          "integer",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const int64_t v = read_int(n, where);
            if (v < min)
              throw ConfigError(where + ": must be >= " + std::to_string(min) + ", got " +
                                std::to_string(v));
            *p = v;
          },
          [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key int32_key(const char* table, const char* name, int* p, int min, const char* doc) {
  return {table,
          name,
          "integer",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const int64_t v = read_int(n, where);
            if (v < min || v > 1'000'000)
              throw ConfigError(where + ": must be in [" + std::to_string(min) +
                                ", 1000000], got " + std::to_string(v));
            *p = static_cast<int>(v);
          },
          [=](toml::table& t) { t.insert_or_assign(name, static_cast<int64_t>(*p)); }};
}

Key seed_key(const char* table, const char* name, uint64_t* p, const char* doc) {
  return {table,
          name,
          "integer",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const int64_t v = read_int(n, where);
            if (v < 0) throw ConfigError(where + ": must be >= 0, got " + std::to_string(v));
            *p = static_cast<uint64_t>(v);
          },
          [=](toml::table& t) { t.insert_or_assign(name, static_cast<int64_t>(*p)); }};
}

Key float_key(const char* table, const char* name, double* p, double min, const char* doc) {
  return {table,
          name,
          "float",
          doc,
          [=](const toml::node& n, const std::string& where) {
            double v;
            if (n.is_floating_point())
              v = n.as_floating_point()->get();
            else if (n.is_integer())
              v = static_cast<double>(n.as_integer()->get());
            else
              wrong_type(n, where, "a number");
            if (!(v >= min))
              throw ConfigError(where + ": must be >= " + std::to_string(min) + ", got " +
                                std::to_string(v));
            *p = v;
          },
          [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key bool_key(const char* table, const char* name, bool* p, const char* doc) {
  return {table,
          name,
          "boolean",
          doc,
          [=](const toml::node& n, const std::string& where) {
            if (!n.is_boolean()) wrong_type(n, where, "true or false");
            *p = n.as_boolean()->get();
          },
          [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key string_key(const char* table, const char* name, std::string* p, const std::string& doc,
               std::vector<std::string> allowed = {}) {
  return {table,
          name,
          "string",
          doc,
          [=](const toml::node& n, const std::string& where) {
            if (!n.is_string()) wrong_type(n, where, "a string");
            std::string v = n.as_string()->get();
            if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
              std::string list;
              for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
              throw ConfigError(where + ": expected one of " + list + ", got \"" + v + "\"");
            }
            *p = v;
          },
          [=](toml::table& t) { t.insert_or_assign(name, *p); }};
}

Key string_list_key(const char* table, const char* name, std::vector<std::string>* p,
                    const char* doc) {
  return {table,
          name,
          "array of strings",
          doc,
          [=](const toml::node& n, const std::string& where) {
            const auto* a = n.as_array();
            if (!a) wrong_type(n, where, "an array of strings");
            std::vector<std::string> v;
            for (const auto& e : *a) {
              if (!e.is_string())
                wrong_type(e, where + "[" + std::to_string(v.size()) + "]", "a string");
              v.push_back(e.as_string()->get());
            }
            *p = std::move(v);
          },
          [=](toml::table& t) {
            toml::array a;
            for (const auto& e : *p) a.push_back(e);
            t.insert_or_assign(name, std::move(a));
          }};
}

// Every key of a RunConfig, bound to its fields. model.preset is handled before the others
// because it resets the whole model shape.
std::vector<Key> bind(RunConfig& c) {
  auto& m = c.model;
  auto& t = c.train;
  auto& o = c.optim;
  auto& s = c.sample;
  std::vector<Key> k;
  k.push_back({"model", "arch", "string", "\"gpt2\" or \"llama\" (architecture; set by the preset)",
               [&m](const toml::node& n, const std::string& where) {
                 if (!n.is_string()) wrong_type(n, where, "a string");
                 try {
                   m.arch = model::parse_arch(n.as_string()->get());
                 } catch (const ConfigError& e) {
                   throw ConfigError(where + ": " + e.what());
                 }
               },
               [&m](toml::table& tb) { tb.insert_or_assign("arch", model::to_string(m.arch)); }});
  k.push_back(int_key("model", "vocab_size", &m.vocab_size, 1,
                      "vocabulary size; must be >= the dataset's"));
  k.push_back(int_key("model", "seq_len", &m.seq_len, 1, "context length in tokens"));
  k.push_back(int_key("model", "n_layer", &m.n_layer, 1, "transformer layers"));
  k.push_back(int_key("model", "n_head", &m.n_head, 1, "attention heads"));
  k.push_back(int_key("model", "n_kv_head", &m.n_kv_head, 0,
                      "key/value heads for grouped-query attention (llama); 0 = n_head"));
  k.push_back(int_key("model", "d_model", &m.d_model, 1, "residual stream width"));
  k.push_back(int_key("model", "d_ff", &m.d_ff, 0,
                      "MLP hidden width; 0 = 4*d_model (gpt2) or ~8/3*d_model (llama)"));
  k.push_back(float_key("model", "norm_eps", &m.norm_eps, 0, "epsilon of LayerNorm/RMSNorm"));
  k.push_back(float_key("model", "rope_theta", &m.rope_theta, 0, "rotary base (llama)"));
  k.push_back(bool_key("model", "tie_embeddings", &m.tie_embeddings,
                       "share the token embedding with the LM head"));
  k.push_back(float_key("model", "init_std", &m.init_std, 0, "std of the weight init"));

  k.push_back(string_key("data", "dir", &c.data.dir,
                         "dataset directory from `starling data prepare`, or llm.c shards"));

  k.push_back(int_key("train", "steps", &t.steps, 1, "optimizer steps in total"));
  k.push_back(int_key("train", "batch_size", &t.batch_size, 1, "sequences per micro-batch"));
  k.push_back(int_key("train", "grad_accum", &t.grad_accum, 1, "micro-batches per optimizer step"));
  k.push_back(seed_key("train", "seed", &t.seed, "seed of model init and data order"));
  k.push_back(int32_key("train", "threads", &t.threads, 0,
                        "intra-op CPU threads; 0 = one per physical core"));
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
  k.push_back(string_key("train", "out_dir", &t.out_dir,
                         "run directory: checkpoints, metrics.jsonl, config.toml"));
  k.push_back(float_key("train", "peak_tflops", &t.peak_tflops, 0,
                        "device peak TFLOP/s for MFU; 0 = measure with a matmul probe"));
  k.push_back(string_key("train", "init_from", &t.init_from,
                         "Hugging Face GPT-2 model.safetensors to fine-tune from; \"\" = random"));
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
  k.push_back(seed_key("sample", "seed", &s.seed, "sampling seed"));

  auto& st = c.strategy;
  std::vector<std::string> kinds{"none"};
  kinds.insert(kinds.end(), swarm_strategy_kinds().begin(), swarm_strategy_kinds().end());
  k.push_back(string_key("strategy", "kind", &st.kind,
                         "how peers train together: \"none\" (one replica), or with peers " +
                             swarm_strategy_list() + " (docs/strategies.md)",
                         kinds));
  k.push_back(int_key("strategy", "local_steps", &st.local_steps, 1,
                      "tau: local optimizer steps per round (localsgd, diloco, co2)"));
  k.push_back(float_key("strategy", "outer_lr", &st.outer_lr, 0,
                        "alpha: outer learning rate applied to the averaged update (diloco, co2)"));
  k.push_back(float_key("strategy", "outer_momentum", &st.outer_momentum, 0,
                        "beta: outer momentum (diloco: Nesterov, co2: heavy ball); < 1"));
  k.push_back(float_key("strategy", "staleness_penalty", &st.staleness_penalty, 0,
                        "gamma (co2): the stale update is divided by 1 + gamma * staleness gap"));
  k.push_back(string_key("strategy", "clip", &st.clip,
                         "co2 outer-momentum clipping: \"norm\" (global L2 norm), \"value\" "
                         "(each element) or \"none\"",
                         {"norm", "value", "none"}));
  k.push_back(float_key("strategy", "clip_threshold", &st.clip_threshold, 0,
                        "phi (co2): the largest momentum norm (clip = \"norm\") or |element| "
                        "(clip = \"value\")"));
  k.push_back(bool_key("strategy", "zero", &st.zero,
                       "co2: each peer keeps 1/N of the anchor and outer momentum "
                       "(reduce-scatter + all-gather instead of all-reduce)"));
  k.push_back(string_key("strategy", "precision", &st.precision,
                         "wire precision of the averaged tensors: \"fp32\", \"fp16\", \"bf16\" "
                         "or \"int8\" (accumulation is always fp32)",
                         {"fp32", "fp16", "bf16", "int8"}));

  auto& n = c.net;
  k.push_back(string_key("net", "backend", &n.backend,
                         "collectives: \"starling\" (the elastic, encrypted swarm), or a fixed "
                         "c10d group: \"gloo\" (CPU) or \"nccl\" (GPUs in one datacenter; needs "
                         "a CUDA libtorch)",
                         {"starling", "gloo", "nccl"}));
  k.push_back(int_key("net", "rank", &n.rank, -1,
                      "gloo/nccl: this process's rank; -1 = $RANK (torchrun sets it)"));
  k.push_back(int_key("net", "world_size", &n.world_size, 0,
                      "gloo/nccl: ranks in the group; 0 = $WORLD_SIZE"));
  k.push_back(string_key("net", "store", &n.store,
                         "gloo/nccl: HOST:PORT of the rendezvous store rank 0 hosts; \"\" = "
                         "$MASTER_ADDR:$MASTER_PORT"));
  k.push_back(string_key("net", "interface", &n.interface,
                         "gloo: the local address (IP or host name) its connections use"));
  k.push_back(string_key("net", "name", &n.name, "this peer's name in status and logs"));
  k.push_back(string_key("net", "listen", &n.listen,
                         "address to listen on, tcp://HOST:PORT (port 0 picks a free port)"));
  k.push_back(string_key("net", "advertise", &n.advertise,
                         "host or IP others reach this peer at, when listening on 0.0.0.0"));
  k.push_back(string_list_key("net", "join", &n.join,
                              "entry points: any live member, tcp://HOST:PORT or "
                              "KEY@tcp://HOST:PORT; [] = start a new swarm"));
  k.push_back(string_key("net", "key", &n.key, "this peer's key file (`starling keygen`)"));
  k.push_back(
      string_key("net", "allow", &n.allow, "the swarm's allowlist: one public key per line"));
  k.push_back(bool_key("net", "insecure", &n.insecure,
                       "plain TCP without CURVE encryption (trusted networks only)"));
  k.push_back(int_key("net", "heartbeat_ms", &n.heartbeat_ms, 10, "heartbeat interval"));
  k.push_back(int_key("net", "peer_timeout_ms", &n.peer_timeout_ms, 100,
                      "silence after which a peer counts as dead"));
  k.push_back(int_key("net", "join_timeout_s", &n.join_timeout_s, 1,
                      "how long joining waits for an entry point to answer"));
  k.push_back(int_key("net", "collective_timeout_s", &n.collective_timeout_s, 1,
                      "how long a round waits for every peer to reach it"));
  k.push_back(int_key("net", "min_peers", &n.min_peers, 1,
                      "peers (this one included) to wait for before the first step"));
  return k;
}

const std::vector<std::string> kTables = {"model",  "data",     "train", "optim",
                                          "sample", "strategy", "net"};

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

RunConfig parse_run_config(std::string_view text, const std::string& source,
                           const std::vector<std::string>& overrides) {
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
    config.model = model::preset(preset);
    config.model_preset = preset;
  }

  auto keys = bind(config);
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
    if (std::find(kTables.begin(), kTables.end(), table) == kTables.end()) {
      std::string known;
      for (const auto& t : kTables) known += (known.empty() ? "" : ", ") + t;
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

  try {
    config.model.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(source + ": " + e.what());
  }
  if (config.data.dir.empty())
    throw ConfigError(source +
                      ": data.dir is required (a directory made by `starling data prepare`)");
  if (config.optim.min_lr > config.optim.lr)
    throw ConfigError(source + ": optim.min_lr (" + std::to_string(config.optim.min_lr) +
                      ") must not exceed optim.lr (" + std::to_string(config.optim.lr) + ")");
  if (config.optim.beta1 >= 1 || config.optim.beta2 >= 1)
    throw ConfigError(source + ": optim.beta1 and optim.beta2 must be < 1");
  if (config.strategy.outer_momentum >= 1)
    throw ConfigError(source + ": strategy.outer_momentum must be < 1");
  if (config.net.peer_timeout_ms <= config.net.heartbeat_ms)
    throw ConfigError(
        source + ": net.peer_timeout_ms (" + std::to_string(config.net.peer_timeout_ms) +
        ") must exceed net.heartbeat_ms (" + std::to_string(config.net.heartbeat_ms) + ")");
  return config;
}

RunConfig load_run_config(const std::filesystem::path& file,
                          const std::vector<std::string>& overrides) {
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot read config file (missing or unreadable)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), file.string(), overrides);
}

std::string to_toml(const RunConfig& config) {
  RunConfig copy = config;
  auto keys = bind(copy);
  toml::table root;
  for (const auto& table : kTables) {
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
    std::ostringstream value;
    value << toml::toml_formatter(t);
    std::string v = value.str();
    const auto eq = v.find(" = ");
    v = eq == std::string::npos ? v : v.substr(eq + 3);
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    out << k.full() << "  " << k.type << "  " << v << "  " << k.doc << "\n";
  }
  return out.str();
}

const std::vector<std::string>& swarm_strategy_kinds() {
  static const std::vector<std::string> kinds = {"ddp", "localsgd", "diloco", "co2"};
  return kinds;
}

std::string swarm_strategy_list() {
  const auto& kinds = swarm_strategy_kinds();
  std::string list;
  for (size_t i = 0; i < kinds.size(); ++i)
    list += (i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + kinds[i];
  return list;
}

}  // namespace starling::train
