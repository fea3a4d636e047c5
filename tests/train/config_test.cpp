// Run configs: TOML in, RunConfig out; --set overrides; every error a ConfigError that names the
// file, the line and the key; to_toml writes a config that parses back to itself. And the
// learning-rate schedule.
#include "starling/train/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "starling/common/error.h"
#include "starling/train/metrics.h"
#include "starling/train/schedule.h"

namespace starling::train {
namespace {

// parse_run_config must throw ConfigError whose message contains every one of `parts`.
void expect_error(const std::string& text, const std::vector<std::string>& parts,
                  const std::vector<std::string>& overrides = {}) {
  try {
    parse_run_config(text, "run.toml", overrides);
    ADD_FAILURE() << "expected ConfigError for:\n" << text;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "\"" << p << "\" not in: " << what;
  }
}

const char* kFull = R"([model]
arch = "llama"
vocab_size = 512
seq_len = 64
n_layer = 3
n_head = 8
n_kv_head = 2
d_model = 128
d_ff = 320
norm_eps = 1e-6
rope_theta = 500000.0
tie_embeddings = false
init_std = 0.01

[data]
dir = "data/tiny"

[train]
steps = 250
batch_size = 4
grad_accum = 2
seed = 7
threads = 2
device = "cuda:1"
recompute = true
log_every = 5
eval_every = 50
eval_batches = 3
checkpoint_every = 100
keep_checkpoints = 3
out_dir = "runs/x"
peak_tflops = 1.5
init_from = "gpt2/model.safetensors"
sample_at_end = false

[optim]
lr = 3e-4
min_lr = 3e-5
warmup_steps = 20
schedule = "constant"
weight_decay = 0.05
beta1 = 0.85
beta2 = 0.99
eps = 1e-7
grad_clip = 0.5

[sample]
prompt = "Once"
max_tokens = 17
temperature = 0
top_k = 5
seed = 9
slide = 1
)";

TEST(RunConfig, ParsesEveryKey) {
  const RunConfig c = parse_run_config(kFull, "run.toml");
  EXPECT_EQ(c.model_preset, "");
  EXPECT_EQ(c.model.arch, model::Arch::kLlama);
  EXPECT_EQ(c.model.vocab_size, 512);
  EXPECT_EQ(c.model.seq_len, 64);
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_head, 8);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.d_ff, 320);
  EXPECT_EQ(c.model.norm_eps, 1e-6);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.init_std, 0.01);
  EXPECT_EQ(c.data.dir, "data/tiny");
  EXPECT_EQ(c.train.steps, 250);
  EXPECT_EQ(c.train.batch_size, 4);
  EXPECT_EQ(c.train.grad_accum, 2);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.train.threads, 2);
  EXPECT_EQ(c.train.device, "cuda:1");
  EXPECT_TRUE(c.train.recompute);
  EXPECT_EQ(c.train.log_every, 5);
  EXPECT_EQ(c.train.eval_every, 50);
  EXPECT_EQ(c.train.eval_batches, 3);
  EXPECT_EQ(c.train.checkpoint_every, 100);
  EXPECT_EQ(c.train.keep_checkpoints, 3);
  EXPECT_EQ(c.train.out_dir, "runs/x");
  EXPECT_EQ(c.train.peak_tflops, 1.5);
  EXPECT_EQ(c.train.init_from, "gpt2/model.safetensors");
  EXPECT_FALSE(c.train.sample_at_end);
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.min_lr, 3e-5);
  EXPECT_EQ(c.optim.warmup_steps, 20);
  EXPECT_EQ(c.optim.schedule, "constant");
  EXPECT_EQ(c.optim.weight_decay, 0.05);
  EXPECT_EQ(c.optim.beta1, 0.85);
  EXPECT_EQ(c.optim.beta2, 0.99);
  EXPECT_EQ(c.optim.eps, 1e-7);
  EXPECT_EQ(c.optim.grad_clip, 0.5);
  EXPECT_EQ(c.sample.prompt, "Once");
  EXPECT_EQ(c.sample.max_tokens, 17);
  EXPECT_EQ(c.sample.temperature, 0.0);  // an integer where a float is expected is fine
  EXPECT_EQ(c.sample.top_k, 5);
  EXPECT_EQ(c.sample.seed, 9u);
  EXPECT_EQ(c.sample.slide, 1);
}

TEST(RunConfig, Defaults) {
  const RunConfig c = parse_run_config("[data]\ndir = \"d\"\n", "run.toml");
  const RunConfig d;  // the defaults the header documents
  EXPECT_EQ(c.model_preset, "");
  EXPECT_EQ(c.model.arch, model::Arch::kGpt2);
  EXPECT_EQ(c.model.d_model, d.model.d_model);
  EXPECT_EQ(c.model.n_layer, d.model.n_layer);
  EXPECT_EQ(c.train.steps, 1000);
  EXPECT_EQ(c.train.batch_size, 8);
  EXPECT_EQ(c.train.seed, 1337u);
  EXPECT_EQ(c.train.keep_checkpoints, 2);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.train.out_dir, "runs/default");
  EXPECT_TRUE(c.train.sample_at_end);
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.optim.schedule, "cosine");
  EXPECT_EQ(c.optim.beta2, 0.95);
  EXPECT_EQ(c.sample.prompt, "The ");
  EXPECT_EQ(c.sample.slide, 0);  // half of seq_len
  EXPECT_EQ(to_toml(c), [&] {
    RunConfig e;
    e.data.dir = "d";
    return to_toml(e);
  }());
}

TEST(RunConfig, PresetThenOverride) {
  // The preset applies first wherever it stands in the table.
  for (const char* text : {"[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n[data]\ndir = \"d\"\n",
                           "[model]\nn_layer = 2\npreset = \"gpt2-tiny\"\n[data]\ndir = \"d\"\n"}) {
    SCOPED_TRACE(text);
    const RunConfig c = parse_run_config(text, "run.toml");
    const auto p = model::preset("gpt2-tiny");
    EXPECT_EQ(c.model_preset, "gpt2-tiny");
    EXPECT_EQ(c.model.name, "gpt2-tiny");
    EXPECT_EQ(c.model.n_layer, 2);
    EXPECT_EQ(c.model.d_model, p.d_model);
    EXPECT_EQ(c.model.seq_len, p.seq_len);
    EXPECT_EQ(c.model.n_head, p.n_head);
  }
}

TEST(RunConfig, SetOverrides) {
  const std::string text =
      "[model]\npreset = \"gpt2-tiny\"\n[data]\ndir = \"d\"\n[train]\nsteps = 10\n";
  const RunConfig c = parse_run_config(
      text, "run.toml",
      {"train.steps=50", "optim.lr=2.5e-4", "train.recompute=true", "data.dir=foo/bar",
       "model.preset=llama-tiny", "model.n_layer=1", "sample.prompt=\"a b\"", "optim.min_lr=0"});
  EXPECT_EQ(c.train.steps, 50);
  EXPECT_EQ(c.optim.lr, 2.5e-4);
  EXPECT_TRUE(c.train.recompute);
  EXPECT_EQ(c.data.dir, "foo/bar");
  EXPECT_EQ(c.model_preset, "llama-tiny");
  EXPECT_EQ(c.model.arch, model::Arch::kLlama);
  EXPECT_EQ(c.model.n_layer, 1);
  EXPECT_EQ(c.model.n_kv_head, model::preset("llama-tiny").n_kv_head);
  EXPECT_EQ(c.sample.prompt, "a b");
  EXPECT_EQ(c.optim.min_lr, 0.0);
  // Overrides alone can supply a required key.
  EXPECT_EQ(parse_run_config("", "run.toml", {"data.dir=x"}).data.dir, "x");
}

// A value handed to another process as an override (a local swarm's peers get their paths so)
// comes back whole, whatever characters it holds.
TEST(RunConfig, TomlStringsCarryAnyTextBackWhole) {
  for (const std::string& text :
       {std::string("plain/dir"), std::string("a \"quoted\" dir"), std::string("back\\slash\\"),
        std::string("tab\there"), std::string("del\x7fhere"), std::string("new\nline"),
        std::string("unit\x1fsep"), std::string("caf\xc3\xa9"), std::string()}) {
    // sample.prompt: a string key that takes any text, the empty one too.
    const std::string quoted = toml_string(text, "sample.prompt");
    const RunConfig c =
        parse_run_config("[data]\ndir = \"d\"\n", "run.toml", {"sample.prompt=" + quoted});
    EXPECT_EQ(c.sample.prompt, text) << quoted;
  }
  try {
    toml_string("bad\xff", "--out");
    ADD_FAILURE() << "took a string that is not UTF-8";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--out: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
  }
}

// A checkpoint of an older release keeps the config it ran with: its [model] is read back, and
// rules across keys added since (sizes need a unit; atom's target of one micro-batch or more)
// do not stop it being resumed, sampled or exported.
TEST(RunConfig, ASavedConfigIsReadWithoutTheRulesAcrossKeys) {
  const std::string saved =
      "[data]\ndir = \"d\"\n[model]\npreset = \"gpt2-tiny\"\n[train]\nbatch_size = 8\n"
      "[strategy]\nkind = \"atom\"\ntarget_batch = 4\n[swap]\nbudget = \"600000000\"\n";
  EXPECT_THROW(parse_run_config(saved, "meta.json"), ConfigError);
  const RunConfig c = parse_saved_config(saved, "meta.json");
  EXPECT_EQ(c.model.d_model, model::preset("gpt2-tiny").d_model);
  EXPECT_EQ(c.swap.budget, "600000000");
  // Every key is still read as one: a mistyped value is an error there too.
  EXPECT_THROW(parse_saved_config("[train]\nsteps = \"ten\"\n", "meta.json"), ConfigError);
}

TEST(RunConfigErrors, UnknownKey) {
  expect_error("[data]\ndir = \"d\"\n[train]\nsteps = 3\nstepz = 4\n",
               {"run.toml:5", "train.stepz", "steps"});
}

TEST(RunConfigErrors, UnknownTable) {
  expect_error("[data]\ndir = \"d\"\n\n[trian]\nsteps = 3\n",
               {"run.toml:4", "[trian]", "strategy", "net"});
}

TEST(RunConfig, StrategyAndNetTables) {
  const RunConfig c = parse_run_config(
      "[data]\ndir = \"d\"\n[strategy]\nkind = \"co2\"\nlocal_steps = 8\nzero = true\n"
      "precision = \"int8\"\n[net]\njoin = [\"tcp://10.0.0.1:7000\", \"tcp://10.0.0.2:7000\"]\n"
      "peer_timeout_ms = 2000\n",
      "run.toml", {"strategy.clip=value"});
  EXPECT_EQ(c.strategy.kind, "co2");
  EXPECT_EQ(c.strategy.local_steps, 8);
  EXPECT_TRUE(c.strategy.zero);
  EXPECT_EQ(c.strategy.precision, "int8");
  EXPECT_EQ(c.strategy.clip, "value");
  ASSERT_EQ(c.net.join.size(), 2u);
  EXPECT_EQ(c.net.join[1], "tcp://10.0.0.2:7000");
  EXPECT_EQ(parse_run_config(to_toml(c), "<to_toml>").net.join, c.net.join);
  expect_error("[data]\ndir = \"d\"\n[strategy]\nkind = \"gossip\"\n",
               {"run.toml:4", "strategy.kind", "co2"});
  expect_error("[data]\ndir = \"d\"\n[net]\njoin = [\"a\", 3]\n",
               {"run.toml:4", "net.join[1]", "a string"});
  expect_error("[data]\ndir = \"d\"\n[net]\nbackend = \"mpi\"\n",
               {"run.toml:4", "net.backend", "\"gloo\"", "\"nccl\""});
  expect_error("[data]\ndir = \"d\"\n[strategy]\nouter_momentum = 1.0\n",
               {"strategy.outer_momentum must be < 1"});
  expect_error("[data]\ndir = \"d\"\n[strategy]\nlocal_steps = 8\noverlap_steps = 9\n",
               {"strategy.overlap_steps (9) must be at most strategy.local_steps (8)"});
  expect_error("[data]\ndir = \"d\"\n[strategy]\nkind = \"co2\"\nzero = true\noverlap_steps = 4\n",
               {"strategy.overlap_steps < strategy.local_steps", "strategy.zero"});
  expect_error("[data]\ndir = \"d\"\n[net]\nheartbeat_ms = 900\npeer_timeout_ms = 800\n",
               {"net.peer_timeout_ms (800) must exceed net.heartbeat_ms (900)"});
  expect_error("[data]\ndir = \"d\"\n[strategy]\ntransfer_piece = \"1KB\"\n",
               {"run.toml", "strategy.transfer_piece (\"1KB\") must be at least 4KB"});
  expect_error("[data]\ndir = \"d\"\n[strategy]\ntransfer_piece = \"lots\"\n",
               {"run.toml", "strategy.transfer_piece", "lots"});
  EXPECT_EQ(strategy::transfer_piece_bytes(parse_run_config("[data]\ndir = \"d\"\n", "run.toml",
                                                            {"strategy.transfer_piece=\"1MiB\""})
                                               .strategy),
            1 << 20);
}

TEST(RunConfigErrors, WrongType) {
  expect_error("[data]\ndir = \"d\"\n[train]\nsteps = \"ten\"\n",
               {"run.toml:4", "train.steps", "integer"});
  expect_error("[data]\ndir = \"d\"\n[train]\nrecompute = 1\n", {"run.toml:4", "train.recompute"});
  expect_error("[data]\ndir = 3\n", {"run.toml:2", "data.dir", "string"});
  expect_error("[model]\npreset = 3\n[data]\ndir = \"d\"\n", {"run.toml:2", "model.preset"});
  expect_error("model = 3\n[data]\ndir = \"d\"\n", {"run.toml:1", "model"});
}

TEST(RunConfigErrors, OutOfRange) {
  expect_error("[data]\ndir = \"d\"\n[train]\nsteps = 0\n", {"run.toml:4", "train.steps", ">= 1"});
  expect_error("[data]\ndir = \"d\"\n[optim]\nlr = -1.0\n",
               {"run.toml:4", "optim.lr", "must be >= 0, got -1"});
  expect_error("[data]\ndir = \"d\"\n[train]\nthreads = 5000000\n",
               {"run.toml:4", "train.threads"});
  expect_error("[data]\ndir = \"d\"\n[train]\nseed = -1\n", {"run.toml:4", "train.seed"});
  // Sizes far beyond any machine are named here, not met as a failed allocation or an
  // overflowed tokens-per-step later.
  expect_error("[data]\ndir = \"d\"\n[train]\nbatch_size = 9223372036854775807\n",
               {"run.toml:4", "train.batch_size", "must be <= 1048576"});
  expect_error("[data]\ndir = \"d\"\n[model]\nn_layer = 1000000000\n",
               {"run.toml:4", "model.n_layer", "must be <= 10000"});
  expect_error("[data]\ndir = \"d\"\n[model]\nseq_len = 2147483648\n",
               {"run.toml:4", "model.seq_len"});
  expect_error("[data]\ndir = \"d\"\n[train]\nthreads = 5000\n",
               {"run.toml:4", "train.threads", "[0, 1024]"});
  // A float that is not finite: nan fails ">= min", inf fails "finite".
  expect_error("[data]\ndir = \"d\"\n[model]\nnorm_eps = inf\n",
               {"run.toml:4", "model.norm_eps", "must be finite, got inf"});
  expect_error("[data]\ndir = \"d\"\n[optim]\nlr = nan\n", {"run.toml:4", "optim.lr"});
}

TEST(RunConfigErrors, BadEnum) {
  expect_error("[data]\ndir = \"d\"\n[optim]\nschedule = \"linear\"\n",
               {"run.toml:4", "optim.schedule", "\"linear\"", "\"cosine\"", "\"constant\""});
  expect_error("[data]\ndir = \"d\"\n[train]\ndevice = \"gpu\"\n",
               {"run.toml:4", "train.device", "\"gpu\""});
  expect_error("[data]\ndir = \"d\"\n[train]\ndevice = \"cuda:x\"\n",
               {"run.toml:4", "train.device"});
  expect_error("[model]\narch = \"bert\"\n[data]\ndir = \"d\"\n",
               {"run.toml:2", "model.arch", "bert"});
  expect_error("[model]\npreset = \"gpt2-huge\"\n[data]\ndir = \"d\"\n",
               {"gpt2-huge", "gpt2-tiny"});
  // The strategy kinds come from the one list (swarm_strategy_kinds).
  std::vector<std::string> kinds = {"strategy.kind", "\"none\""};
  for (const auto& k : strategy::swarm_strategy_kinds()) kinds.push_back("\"" + k + "\"");
  expect_error("[data]\ndir = \"d\"\n[strategy]\nkind = \"gossip\"\n", kinds);
}

TEST(RunConfigErrors, MissingDataDir) {
  expect_error("[train]\nsteps = 3\n", {"run.toml", "data.dir"});
}

TEST(RunConfigErrors, InconsistentValues) {
  expect_error("[data]\ndir = \"d\"\n[model]\nd_model = 130\nn_head = 4\n",
               {"run.toml", "model.d_model"});
  expect_error("[data]\ndir = \"d\"\n[optim]\nlr = 1e-4\nmin_lr = 1e-3\n",
               {"run.toml", "optim.min_lr"});
  expect_error("[data]\ndir = \"d\"\n[optim]\nbeta2 = 1.0\n", {"run.toml", "optim.beta2"});
  expect_error("[data]\ndir = \"d\"\n[train]\nout_dir = \"\"\n",
               {"run.toml", "train.out_dir must not be empty"});
  // 0 makes a parameter without a gradient yet 0/0 (an untied embedding's unseen rows).
  expect_error("[data]\ndir = \"d\"\n[optim]\neps = 0.0\n",
               {"run.toml", "optim.eps must be more than 0"});
  expect_error("[data]\ndir = \"d\"\n[strategy]\ntarget_batch = 16777217\n",
               {"run.toml", "strategy.target_batch"});
  expect_error("[data]\ndir = \"d\"\n[pipeline]\nadatopk_topk_beyond = 0.5\n",
               {"run.toml", "pipeline.adatopk_topk_beyond", "must be >= 1"});
  expect_error("[data]\ndir = \"d\"\n[swap]\nbudget = \"1GB\"\nio_slowdown = -0.5\n",
               {"run.toml", "swap.io_slowdown", "-1 (probed) or 0 and up", "-0.5"});
  expect_error(
      "[data]\ndir = \"d\"\n[train]\nbatch_size = 8\n[strategy]\nkind = \"atom\"\n"
      "target_batch = 4\n",
      {"run.toml", "strategy.target_batch (4) is less than one micro-batch",
       "set strategy.target_batch to 8 or more"});
  // One micro-batch is a target a peer can meet.
  EXPECT_EQ(parse_run_config("[data]\ndir = \"d\"\n[train]\nbatch_size = 8\n[strategy]\nkind = "
                             "\"atom\"\ntarget_batch = 8\n",
                             "run.toml")
                .strategy.target_batch,
            8);
}

TEST(RunConfigErrors, InvalidTomlSyntax) {
  expect_error("[data]\ndir = \"d\"\n[train]\nsteps = = 3\n", {"run.toml:4", "TOML"});
  expect_error("[data]\ndir = \"d\n", {"run.toml:2"});
}

TEST(RunConfigErrors, BadSet) {
  const std::string ok = "[data]\ndir = \"d\"\n";
  expect_error(ok, {"--set", "trainsteps100"}, {"trainsteps100"});
  expect_error(ok, {"--set", "steps=100"}, {"steps=100"});
  expect_error(ok, {"--set", "train.stepz"}, {"train.stepz=1"});
  expect_error(ok, {"--set", "train.steps", "integer"}, {"train.steps=many"});
  expect_error(ok, {"--set", "train.steps"}, {"train.steps=0"});
  expect_error(ok, {"--set", "model.preset"}, {"model.preset=3"});
  // A rule over several keys names the overrides beside the file: either may be at fault.
  expect_error(ok, {"run.toml with --set model.n_head=3, --set train.steps=5: model.d_model"},
               {"model.n_head=3", "train.steps=5"});
}

TEST(RunConfig, LoadRunConfigMissingFile) {
  try {
    load_run_config("/nonexistent/starling/run.toml");
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/starling/run.toml"), std::string::npos);
  }
  // A directory reads as nothing at all: it used to pass for an empty config.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("starling_config_dir_" + std::to_string(::getpid()) + ".toml");
  std::filesystem::create_directories(dir);
  try {
    load_run_config(dir);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  std::filesystem::remove(dir);
}

TEST(RunConfig, ToTomlRoundTrips) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{},
        std::vector<std::string>{"model.preset=gpt2-tiny", "model.n_layer=2", "optim.lr=3.3e-4",
                                 "optim.min_lr=1.7e-5", "model.init_std=0.0123",
                                 "sample.prompt=\"line\\nwith \\\"quotes\\\"\"",
                                 "train.seed=42"}}) {
    RunConfig c = parse_run_config(kFull, "run.toml", sets);
    const std::string text = to_toml(c);
    const RunConfig back = parse_run_config(text, "<to_toml>");
    EXPECT_EQ(to_toml(back), text);
    EXPECT_EQ(back.model_preset, c.model_preset);
    EXPECT_EQ(back.model.n_layer, c.model.n_layer);
    EXPECT_EQ(back.model.init_std, c.model.init_std);
    EXPECT_EQ(back.model.arch, c.model.arch);
    EXPECT_EQ(back.optim.lr, c.optim.lr);
    EXPECT_EQ(back.optim.min_lr, c.optim.min_lr);
    EXPECT_EQ(back.optim.eps, c.optim.eps);
    EXPECT_EQ(back.sample.prompt, c.sample.prompt);
    EXPECT_EQ(back.train.seed, c.train.seed);
    EXPECT_EQ(back.train.init_from, c.train.init_from);
  }
}

// Every field of the structs in config.h, as "table.key".
std::vector<std::string> all_keys() {
  const std::vector<std::pair<std::string, std::vector<std::string>>> tables = {
      {"model",
       {"preset", "arch", "vocab_size", "seq_len", "n_layer", "n_head", "n_kv_head", "d_model",
        "d_ff", "norm_eps", "rope_theta", "tie_embeddings", "init_std"}},
      {"data", {"dir"}},
      {"train",
       {"steps",
        "batch_size",
        "grad_accum",
        "seed",
        "threads",
        "device",
        "cpu_allocator",
        "dtype",
        "tf32",
        "deterministic",
        "device_memory",
        "recompute",
        "log_every",
        "eval_every",
        "eval_batches",
        "checkpoint_every",
        "keep_checkpoints",
        "on_checkpoint_error",
        "out_dir",
        "peak_tflops",
        "init_from",
        "sample_at_end"}},
      {"optim",
       {"lr", "min_lr", "warmup_steps", "schedule", "weight_decay", "beta1", "beta2", "eps",
        "grad_clip"}},
      {"sample",
       {"prompt", "max_tokens", "temperature", "top_k", "top_p", "stop", "seed", "cache", "slide"}},
      {"strategy",
       {"kind", "local_steps", "outer_lr", "outer_momentum", "outer_nesterov", "staleness_penalty",
        "clip", "clip_threshold", "final_step", "zero", "overlap_steps", "target_batch",
        "partial_micro_batches", "precision", "aggregation", "trim", "fingerprint", "redeal_data",
        "transfer_piece"}},
      {"net",
       {"backend", "rank", "world_size", "store", "interface", "name", "listen", "advertise",
        "join", "key", "allow", "insecure", "direct_data", "heartbeat_ms", "peer_timeout_ms",
        "join_timeout_s", "collective_timeout_s", "min_peers", "dashboard"}},
      {"swap",
       {"budget", "tier", "dir", "group_nodes", "depth", "moment_groups", "overlap_update",
        "rows_first", "update_in_backward", "speculative_update", "guess_break_even",
        "io_slowdown"}},
      {"pipeline",
       {"stages", "profile", "planner", "calibrate_steps", "lab_speeds", "num_stages", "schedule",
        "extra_warmup", "stage", "replicas", "replica", "replacement_wait_s", "compression",
        "topk_ratio", "compress_activations", "adatopk_min_ratio", "adatopk_topk_beyond",
        "error_feedback"}}};
  std::vector<std::string> keys;
  for (const auto& [table, names] : tables)
    for (const auto& n : names) keys.push_back(table + "." + n);
  return keys;
}

TEST(RunConfig, DescribeKeysMentionsEveryKey) {
  const std::string text = describe_keys();
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  EXPECT_EQ(lines.size(), all_keys().size());
  for (const auto& key : all_keys()) {
    bool found = false;
    for (const auto& line : lines)
      if (line.rfind(key + " ", 0) == 0) {
        found = true;
        EXPECT_GT(line.size(), key.size() + 10) << "no type/default/meaning: " << line;
      }
    EXPECT_TRUE(found) << key << " not described";
  }
  // to_toml writes every key too (preset only when one is set).
  RunConfig c = parse_run_config("[model]\npreset = \"gpt2-tiny\"\n[data]\ndir = \"d\"\n", "x");
  const std::string toml = to_toml(c);
  for (const auto& key : all_keys()) {
    const auto dot = key.find('.');
    ASSERT_NE(dot, std::string::npos);
    std::string table = "[";
    table.append(key, 0, dot).push_back(']');
    const std::string name = key.substr(dot + 1);
    const auto at = toml.find(table);
    ASSERT_NE(at, std::string::npos) << table;
    const auto end = toml.find("\n[", at + 1);
    const std::string body = toml.substr(at, end == std::string::npos ? end : end - at);
    EXPECT_NE(body.find("\n" + name + " = "), std::string::npos) << key << " not in to_toml";
  }
}

OptimConfig optim(const char* schedule) {
  OptimConfig o;
  o.lr = 1e-3;
  o.min_lr = 1e-4;
  o.warmup_steps = 10;
  o.schedule = schedule;
  return o;
}

TEST(Fmt, FormatsLinesOfAnyLength) {
  EXPECT_EQ(fmt("%.1f MB", 12.34), "12.3 MB");
  const std::string tail(300, 'x');
  EXPECT_EQ(fmt(("peak %.2f GiB " + tail).c_str(), 1.5), "peak 1.50 GiB " + tail);
}

TEST(LearningRate, LinearWarmupToPeak) {
  const auto o = optim("cosine");
  for (int64_t s = 0; s < 10; ++s)
    EXPECT_NEAR(learning_rate(o, s, 100), 1e-3 * (s + 1) / 10.0, 1e-15) << s;
  EXPECT_GT(learning_rate(o, 0, 100), 0.0);
  // The last warmup step is at the peak, and decay starts from the peak.
  EXPECT_DOUBLE_EQ(learning_rate(o, 9, 100), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10, 100), 1e-3);
}

TEST(LearningRate, CosineReachesMinAtLastStep) {
  const auto o = optim("cosine");
  const int64_t total = 101;
  double prev = learning_rate(o, 10, total);
  for (int64_t s = 11; s < total; ++s) {
    const double lr = learning_rate(o, s, total);
    EXPECT_LT(lr, prev) << s;
    EXPECT_GE(lr, o.min_lr) << s;
    prev = lr;
  }
  EXPECT_NEAR(learning_rate(o, total - 1, total), o.min_lr, 1e-12);
  // Halfway through the decay the cosine is at the mean of peak and floor.
  EXPECT_NEAR(learning_rate(o, 55, total), 0.5 * (o.lr + o.min_lr), 1e-12);
  // Never below the floor, even past the end (a resumed run with fewer steps).
  EXPECT_NEAR(learning_rate(o, total + 50, total), o.min_lr, 1e-12);
}

TEST(LearningRate, ConstantAfterWarmup) {
  const auto o = optim("constant");
  EXPECT_NEAR(learning_rate(o, 0, 100), 1e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 4, 100), 5e-4, 1e-15);
  for (int64_t s : {9, 10, 50, 99, 150}) EXPECT_DOUBLE_EQ(learning_rate(o, s, 100), 1e-3) << s;
}

TEST(LearningRate, NoWarmup) {
  auto o = optim("cosine");
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 50), 1e-3);
  EXPECT_NEAR(learning_rate(o, 49, 50), 1e-4, 1e-12);
}

}  // namespace
}  // namespace starling::train
