// A training run's configuration, read from TOML. The run's own tables ([data], [train], [optim],
// [sample]) are declared here; the model, strategy and network layers declare theirs beside their
// code (config/config_keys.h) and this file assembles them. Every key is documented in
// docs/config.md and listed by `starling train --list-keys`; unknown tables, unknown keys and
// wrong types are errors that name the file, line and key. Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "starling/model/config.h"
#include "starling/net/net_config.h"
#include "starling/strategy/pipeline_config.h"
#include "starling/strategy/strategy_config.h"
#include "starling/swap/swap_config.h"

namespace starling::train {

struct DataConfig {
  std::string dir;  // a prepared dataset directory (`starling data prepare`) or llm.c shards
};

struct TrainConfig {
  int64_t steps = 1000;        // optimizer steps in total
  int64_t batch_size = 8;      // sequences per micro-batch
  int64_t grad_accum = 1;      // micro-batches per optimizer step
  uint64_t seed = 1337;        // model init and data order
  int threads = 0;             // intra-op threads; 0 = one per physical core
  std::string device = "cpu";  // "cpu", "cuda" or "cuda:N" (needs a libtorch built with CUDA)
  std::string cpu_allocator = "caching";  // "caching" (keep freed large blocks) or "system"
  std::string dtype = "fp32";  // compute precision: "fp32", "bf16" or "fp16" (autocast; fp32 master
                               // weights and optimizer state; fp16 adds dynamic loss scaling)
  bool tf32 = true;            // CUDA: fp32 matrix products may use TF32 tensor cores
  bool deterministic = false;  // CUDA: deterministic kernels only (same bits on every run)
  // CUDA: a cap on what this process may hold on the GPU ("12GB"; "" = the whole card), to share
  // a card or to see how a smaller one would fare.
  std::string device_memory;
  bool recompute = false;          // per-node activation recomputation
  int64_t log_every = 10;          // steps between metric lines
  int64_t eval_every = 200;        // steps between validation passes; 0 = only at the end
  int64_t eval_batches = 20;       // micro-batches per validation pass
  int64_t checkpoint_every = 500;  // steps between checkpoints; 0 = only at the end
  int keep_checkpoints = 2;        // newest checkpoints kept in out_dir
  // A periodic checkpoint that cannot be written (a full disk): "stop" the run with the error, or
  // "continue" training and try again at the next one. The last checkpoint must always succeed.
  std::string on_checkpoint_error = "stop";
  std::string out_dir = "runs/default";
  double peak_tflops = 0;     // device peak for MFU; 0 = measure with a matmul probe
  std::string init_from;      // weights to start from: Hugging Face's, or a Starling checkpoint
  bool sample_at_end = true;  // print a sample from [sample] when training ends
};

struct OptimConfig {
  double lr = 1e-3;                 // peak learning rate
  double min_lr = 1e-4;             // floor of the cosine decay
  int64_t warmup_steps = 100;       // linear warmup from 0
  std::string schedule = "cosine";  // "cosine" or "constant" (after warmup)
  double weight_decay = 0.1;        // AdamW decoupled decay; never applied to norms or biases
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // max global gradient norm; 0 = off
};

struct SampleConfig {
  std::string prompt = "The ";
  int64_t max_tokens = 200;
  double temperature = 0.8;  // 0 = greedy
  int64_t top_k = 40;        // 0 = whole vocabulary
  double top_p = 1.0;        // nucleus: the smallest set of likeliest tokens holding p; 1 = off
  std::vector<std::string> stop;  // generation ends before the first of these in the text
  uint64_t seed = 1;
  // Keep each layer's keys and values (a KV cache): the prompt runs once, then each new token
  // alone, instead of the whole context again for every token.
  bool cache = true;
  // Past seq_len tokens the context window moves on by this many tokens at once (the cached
  // window then reruns once every `slide` tokens); 1 = token by token; 0 = half of seq_len.
  int64_t slide = 0;
};

struct RunConfig {
  std::string model_preset;  // the [model] preset the shape started from ("" = none)
  model::ModelConfig model;  // [model], declared by the model layer
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  SampleConfig sample;
  strategy::StrategyConfig strategy;  // [strategy], declared by the strategy layer
  net::NetConfig net;                 // [net], declared by the network layer
  swap::SwapConfig swap;              // [swap], declared by the swap layer
  strategy::PipelineConfig pipeline;  // [pipeline], declared by the strategy layer
};

// Parses TOML text. `source` names the text in errors (a file path or "<checkpoint>").
// `overrides` are "table.key=value" strings (value in TOML syntax; a bare word is taken as a
// string) applied over the text, e.g. {"train.steps=100", "data.dir=data/x"}.
RunConfig parse_run_config(std::string_view text, const std::string& source,
                           const std::vector<std::string>& overrides = {});

// A checkpoint's saved config, for its [model] and what the run was: every key is read and
// checked as parse_run_config does, but not the rules across keys, which a run checks as it
// starts (a run of an older release may have started under other ones).
RunConfig parse_saved_config(std::string_view text, const std::string& source);

// train.device_memory, where it is set: a size, and a GPU's to cap. ConfigError naming the key
// otherwise. A rule of the process that runs the config, not of the config: a swarm's launcher
// checks it for each peer (whose own train.device may make it right).
void check_device_memory(const RunConfig& c);

// Reads a file (ConfigError if missing) and parses it.
RunConfig load_run_config(const std::filesystem::path& file,
                          const std::vector<std::string>& overrides = {});

// `text` as a TOML basic string (quoted, escaped) for an override's value, e.g. a path handed
// to another process as --set train.out_dir=...; ConfigError naming `what` where `text` is not
// valid UTF-8, which no TOML string can hold.
std::string toml_string(const std::string& text, const std::string& what);

// The complete configuration as TOML, every key written out; parse_run_config(to_toml(c)) == c.
std::string to_toml(const RunConfig& config);

// "table.key  type  default  meaning" for every key, for --list-keys and the docs.
std::string describe_keys();

}  // namespace starling::train
