#include "starling/train/session.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>

#include "starling/common/cpu_runtime.h"
#include "starling/common/device.h"
#include "starling/common/error.h"
#include "starling/common/made_dirs.h"
#include "starling/model/build.h"
#include "starling/model/hf_config.h"
#include "starling/model/hf_import.h"
#include "starling/swap/swap_config.h"
#include "starling/train/checkpoint_dir.h"
#include "starling/train/checkpoint_model.h"
#include "starling/train/compute_bench.h"
#include "starling/train/evaluate.h"
#include "starling/train/precision.h"
#include "starling/train/step_runner.h"

namespace starling::train {
namespace fs = std::filesystem;
namespace {

// The model table of a config as TOML: equal strings mean the same architecture and shape.
std::string model_signature(const RunConfig& c) {
  RunConfig only;
  only.model = c.model;
  const std::string text = to_toml(only);
  const auto begin = text.find("[model]");
  const auto end = text.find("\n[", begin + 1);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The keys of two [model] tables (model_signature) whose values differ, one line each:
// "  model.arch: the checkpoint's "gpt2", the config's "llama"".
std::string model_differences(const std::string& saved, const std::string& wanted) {
  const auto entries = [](const std::string& table) {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);) {
      const auto eq = line.find(" = ");
      if (eq != std::string::npos) out.emplace_back(line.substr(0, eq), line.substr(eq + 3));
    }
    return out;
  };
  const auto theirs = entries(wanted);
  std::string out;
  for (const auto& [key, value] : entries(saved)) {
    const auto it = std::find_if(theirs.begin(), theirs.end(),
                                 [&key](const auto& e) { return e.first == key; });
    const std::string other = it == theirs.end() ? "(none)" : it->second;
    if (other != value)
      out += "  model." + key + ": the checkpoint's " + value + ", the config's " + other + "\n";
  }
  return out;
}

void cap_device_memory(const RunConfig& c) {
  if (c.train.device_memory.empty()) return;
  check_device_memory(c);
  const int64_t bytes = swap::parse_bytes(c.train.device_memory, "train.device_memory");
  const c10::Device device(c.train.device);
  try {
    limit_memory(device, bytes);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("train.device_memory = \"" + c.train.device_memory + "\": " + e.what());
  }
}

// A model's weights come with its config.json (beside model.safetensors, or in the directory
// train.init_from names): where it is there, the [model] table is checked against it, so that a
// wrong key is named as such instead of as a tensor whose shape does not fit.
void check_hf_model(const RunConfig& c) {
  const fs::path from(c.train.init_from);
  const fs::path json = (fs::is_directory(from) ? from : from.parent_path()) / "config.json";
  if (!fs::exists(json)) return;
  model::ModelConfig hf;
  try {
    hf = model::model_from_hf_config(json);
  } catch (const ConfigError& e) {
    // A model of another name with the same tensors (a LLaMA saved as "mistral", say) may still
    // load: the tensors' names and shapes decide.
    std::cerr << "note: train.init_from: the [model] is not checked against " << json.string()
              << " (" << e.what() << ")\n";
    return;
  }
  const std::vector<std::string> differences = model::hf_model_differences(c.model, hf);
  if (differences.empty()) return;
  std::string text;
  for (const auto& d : differences) text += "\n  " + d;
  throw ConfigError("train.init_from = \"" + c.train.init_from +
                    "\": the config's [model] does not describe that model (`starling model "
                    "from-hf " +
                    json.string() + "` prints the table that does):" + text);
}

// Whether the data's tokens mean what the checkpoint's model learned: tokens of the same kind,
// and for SentencePiece the same model (another one, even of the same size, gives the ids other
// pieces). DataError starting with `what`, ending with `hint`, otherwise.
void check_same_tokens(const Checkpoint& ckpt, const data::DatasetInfo& ds, const std::string& what,
                       const std::string& hint) {
  if (ckpt.meta.tokenizer_kind != ds.tokenizer_kind)
    throw DataError(what + ": " + ds.dir.string() + " holds " + ds.tokenizer_kind +
                    " tokens, but the model of " + ckpt.dir.string() + " was trained on " +
                    ckpt.meta.tokenizer_kind + " tokens" + hint);
  const fs::path theirs = ckpt.dir / "tokenizer.model";
  if (ds.tokenizer_kind != "sentencepiece" || ds.tokenizer_model.empty() || !fs::exists(theirs))
    return;
  const auto bytes = [](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (bytes(theirs) != bytes(ds.tokenizer_model))
    throw DataError(what + ": the SentencePiece model of " + ds.dir.string() +
                    " is not the one the model of " + ckpt.dir.string() +
                    " was trained with (its ids mean other pieces)" + hint +
                    "; prepare the text with that one: starling data prepare TEXT --out DIR "
                    "--tokenizer sentencepiece --sp-model " +
                    theirs.string());
}

// Whether train.init_from names a Starling checkpoint rather than a Hugging Face model: a run's
// directory (a swarm's too), its checkpoints, one checkpoint, or that checkpoint's
// model.safetensors.
std::optional<fs::path> starling_checkpoint(const std::string& init_from) {
  const fs::path p = fs::absolute(init_from);
  if (fs::is_regular_file(p) && fs::exists(p.parent_path() / "meta.json")) return p.parent_path();
  if (!fs::is_directory(p)) return std::nullopt;
  if (fs::exists(p / "meta.json") || fs::exists(p / "latest") || holds_checkpoint(p)) return p;
  // A checkpoints directory whose `latest` is lost, and a swarm's run (any peer's checkpoints).
  for (const auto& entry : fs::directory_iterator(p)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0 && fs::exists(entry.path() / "meta.json")) return p;
    if (name.rfind("peer-", 0) == 0 && entry.is_directory() && holds_checkpoint(entry.path()))
      return p;
  }
  return std::nullopt;
}

// A new run from another run's weights (fine-tuning on other data, say): the model must be the
// config's, the data's tokens of the same kind; the optimizer, the step and the data start fresh.
void initialise_from_checkpoint(Session& s, const fs::path& path) {
  const Checkpoint ckpt = read_model_checkpoint(path);
  const RunConfig saved = saved_run_config(ckpt);
  const std::string what = "train.init_from = \"" + s.config.train.init_from + "\"";
  if (saved.pipeline.count() > 1)
    throw ConfigError(what + ": " + ckpt.dir.string() +
                      " is a pipeline stage's checkpoint, which holds part of the model");
  // What the weights do not depend on may differ: the init's scale, and LLaMA's context
  // (rotary positions: fine-tuning at a longer one).
  RunConfig wanted = s.config;
  wanted.model.init_std = saved.model.init_std;
  if (wanted.model.arch == model::Arch::kLlama) wanted.model.seq_len = saved.model.seq_len;
  if (model_signature(saved) != model_signature(wanted))
    throw ConfigError(what + ": the model of " + ckpt.dir.string() +
                      " differs from the config's [model] (a run starts from the weights of the "
                      "model it trains):\n" +
                      model_differences(model_signature(saved), model_signature(wanted)));
  check_same_tokens(ckpt, s.dataset, what, "");
  load_params(ckpt.model, s.dag->params());
  check_finite_weights(s.dag->params(), ckpt);
}

void restore(Session& s, const Checkpoint& ckpt) {
  const RunConfig saved = saved_run_config(ckpt);
  if (model_signature(saved) != model_signature(s.config))
    throw ConfigError("--resume: the model in " + ckpt.dir.string() +
                      " differs from the config's [model] (a run resumes with the model it "
                      "was trained with; train a new one into another train.out_dir):\n" +
                      model_differences(model_signature(saved), model_signature(s.config)));
  check_same_tokens(ckpt, s.dataset, "--resume", " (data.dir is not the run's data?)");
  try {
    load_params(ckpt.model, s.dag->params());
  } catch (const CheckpointError& e) {
    // A pipeline stage's checkpoint holds its part of the model: resumed with another cut, the
    // stage's tensors are others, which is no fault of the checkpoint's or the model's.
    const auto cut = [](const RunConfig& r) {
      if (r.pipeline.stages.empty())
        return "pipeline.num_stages = " + std::to_string(r.pipeline.num_stages);
      std::string text;
      for (const auto& [first, last] : r.pipeline.stages)
        text += (text.empty() ? "[" : ", ") + ("[" + std::to_string(first) + ", ") +
                std::to_string(last) + "]";
      return "pipeline.stages = " + text + "]";
    };
    if ((saved.pipeline.count() > 1 || s.config.pipeline.count() > 1) &&
        cut(saved) != cut(s.config))
      throw ConfigError("--resume: " + ckpt.dir.string() + " was written with " + cut(saved) +
                        ", this run has " + cut(s.config) +
                        ": a pipeline resumes with the cut it began with (" + e.what() + ")");
    throw;
  }
  s.optimizer->load_state(ckpt.optimizer, ckpt.meta.step);
  try {
    s.loader->restore(ckpt.meta.loader);
  } catch (const Error& e) {
    throw CheckpointError((ckpt.dir / "meta.json").string() + ": " + e.what());
  }
  if (ckpt.optimizer.contains(kRngTensor)) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle to the global one
    gen.set_state(ckpt.optimizer.at(kRngTensor));
  }
  s.replica->step = ckpt.meta.step;
  s.replica->tokens = ckpt.meta.tokens;
  s.val_loss = ckpt.meta.val_loss;
  s.resumed = true;
}

}  // namespace

std::unique_ptr<Session> open_session(const RunConfig& c, const TrainOptions& options,
                                      ProgressLine& progress) {
  const int threads = setup_cpu_runtime(c.train.threads, c.train.cpu_allocator == "system");
  check_device(c.train.device, "train.device");
  check_dtype(c.train.device, c.train.dtype, "train.dtype");
  configure_matmul_precision(c.train.device, c.train.tf32);
  configure_determinism(c.train.device, c.train.deterministic);
  cap_device_memory(c);
  // The global generators draw nothing in training (the model, the loader and the sampler keep
  // their own), but a checkpoint saves the CPU one's state: seeded here, two runs with the same
  // seeds write the same bytes, where a seed from the process's start made them differ.
  at::manual_seed(static_cast<uint64_t>(c.train.seed));
  auto s = std::make_unique<Session>(c, c10::Device(c.train.device));
  s->threads = threads;
  if (const std::filesystem::path dir(c.data.dir); !std::filesystem::exists(dir))
    throw DataError("data.dir = \"" + c.data.dir + "\": no such dataset directory" +
                    (dir.is_relative()
                         ? " (a relative path is resolved against the working "
                           "directory, " +
                               std::filesystem::current_path().string() + ", not the config file's)"
                         : std::string()) +
                    "; `starling data prepare TEXT --out DIR` makes one");
  s->dataset = data::open_dataset(c.data.dir);
  const data::DatasetInfo& ds = s->dataset;
  if (ds.vocab_size > static_cast<uint64_t>(c.model.vocab_size))
    throw ConfigError("model.vocab_size (" + std::to_string(c.model.vocab_size) +
                      ") is smaller than the vocabulary of the data in " + ds.dir.string() + " (" +
                      ds.tokenizer_kind + ", " + std::to_string(ds.vocab_size) +
                      "); set model.vocab_size = " + std::to_string(ds.vocab_size));

  const fs::path run_dir = c.train.out_dir;
  if (fs::exists(run_dir) && !fs::is_directory(run_dir))
    throw ConfigError("train.out_dir: " + run_dir.string() + " is a file, not a directory");
  // A local swarm's output (train --peers N) keeps each peer's run in peer-<i>: a single
  // process's checkpoints beside them would be the ones `sample --checkpoint DIR` reads.
  for (int i = 0; fs::is_directory(run_dir / ("peer-" + std::to_string(i))); ++i)
    if (holds_checkpoint(run_dir / ("peer-" + std::to_string(i))))
      throw ConfigError(run_dir.string() +
                        " holds a swarm's run (a directory per peer, peer-<i>); set "
                        "train.out_dir (--out) to a new directory, or go on with the swarm "
                        "(train --peers N --resume)");
  s->made_run_dir = outermost_missing(run_dir);
  // The disk tier makes swap.dir where it is missing (its file is unlinked once open, so a
  // failed start leaves the directory empty).
  if (c.swap.enabled() && !c.swap.dir.empty()) s->made_swap_dir = outermost_missing(c.swap.dir);
  fs::create_directories(run_dir);
  // Before the checkpoint check: two runs starting together must not both find none.
  s->run_dir_lock = std::make_unique<DirLock>(run_dir);
  // Until the session is whole (a model part, initial weights or a checkpoint that fails to
  // load), a failure leaves no directory this call made.
  struct Unopened {
    Session* s;
    ~Unopened() {
      if (s != nullptr) s->remove_unstarted_run_dir();
    }
  } unopened{options.tidy_failed_start ? s.get() : nullptr};
  const bool has_checkpoint = holds_checkpoint(run_dir);
  if (has_checkpoint && !options.resume)
    throw ConfigError(run_dir.string() +
                      " already holds a checkpoint; pass --resume to continue "
                      "that run, or set train.out_dir (--out) to a new directory");

  if (options.model_part) {
    s->dag =
        model::build_model_part(c.model, c.train.seed, s->device, [&](const graph::OpDag& whole) {
          const auto [first, last] = options.model_part(whole.size());
          return graph::StageRange{first, last};
        });
  } else {
    s->dag = model::build_model(c.model, c.train.seed, s->device);
  }
  s->executor = std::make_unique<graph::Executor>(
      *s->dag, graph::ExecutorOptions{.recompute = c.train.recompute,
                                      .autocast = parse_dtype(c.train.dtype, "train.dtype")});
  s->optimizer =
      std::make_unique<AdamW>(s->dag->params(), AdamWOptions{.beta1 = c.optim.beta1,
                                                             .beta2 = c.optim.beta2,
                                                             .eps = c.optim.eps,
                                                             .weight_decay = c.optim.weight_decay,
                                                             // A swapping runner takes the moments
                                                             // over as zeros in its tier.
                                                             .defer_zero_state = c.swap.enabled()});
  s->loader = std::make_unique<data::TokenLoader>(
      ds.train_shards, data::LoaderOptions{.seq_len = c.model.seq_len,
                                           .batch = c.train.batch_size,
                                           .seed = c.train.seed,
                                           .rank = options.data_rank,
                                           .world = options.data_world,
                                           .shuffle = true,
                                           .vocab_size = c.model.vocab_size});
  // A validation split the run cannot evaluate is found now, not after the training: its loader,
  // made and dropped, throws where the split holds no batch.
  if (!ds.val_shards.empty()) (void)validation_loader(ds, c);
  s->replica = std::make_unique<Replica>(Replica{c, s->dag->params(), *s->optimizer});

  if (options.resume && has_checkpoint) {
    if (!fs::exists(run_dir / "checkpoints" / "latest"))
      progress.note(run_dir.string() +
                    "/checkpoints/latest is missing: resuming from the checkpoint of the highest "
                    "step there");
    const Checkpoint& ckpt = s->restored.emplace(read_checkpoint(find_checkpoint(run_dir)));
    restore(*s, ckpt);
    std::cerr << "resumed from " << ckpt.dir.string() << " at step " << s->replica->step << "\n";
  } else if (!c.train.init_from.empty()) {
    if (const std::optional<fs::path> ckpt = starling_checkpoint(c.train.init_from)) {
      initialise_from_checkpoint(*s, *ckpt);
      progress.note("initialised from the weights of " + c.train.init_from +
                    " (a Starling checkpoint; the optimizer, the step and the data start fresh)");
    } else {
      check_hf_model(c);
      model::load_hf(c.train.init_from, *s->dag, c.model);
      progress.note("initialised from " + c.train.init_from);
    }
  } else if (options.resume) {
    progress.note("--resume: no checkpoint in " + run_dir.string() + ", starting fresh");
  }
  unopened.s = nullptr;
  return s;
}

void Session::remove_unstarted_run_dir() noexcept {
  remove_made_empty_dirs(config.swap.dir, made_swap_dir);
  if (made_run_dir.empty()) return;
  std::error_code ec;
  // Only where the lock is all there is: anything else written there keeps the directory, and
  // the lock with it. Another run waiting for the lock on the file removed here finds it gone
  // once it holds it (DirLock), and says so.
  int entries = 0;
  bool lock_only = true;
  for (fs::directory_iterator it(run_dir(), ec), end; !ec && it != end; it.increment(ec))
    if (++entries > 1 || it->path().filename() != ".lock") lock_only = false;
  if (ec || !lock_only) return;
  fs::remove(run_dir() / ".lock", ec);
  remove_made_empty_dirs(run_dir(), made_run_dir);
}

void Session::write_config() const { std::ofstream(run_dir() / "config.toml") << to_toml(config); }

fs::path Session::save(StepHooks* hooks) {
  std::vector<std::pair<std::string, at::Tensor>> strategy_tensors;
  nlohmann::json strategy_state;
  if (hooks != nullptr) strategy_state = hooks->checkpoint_state(strategy_tensors);
  CheckpointMeta meta{.step = replica->step,
                      .tokens = replica->tokens,
                      .loader = loader->state(),
                      .config_toml = to_toml(config),
                      .tokenizer_kind = dataset.tokenizer_kind,
                      .data_vocab_size = dataset.vocab_size,
                      .val_loss = val_loss,
                      .strategy = strategy_state};
  return save_checkpoint(
      run_dir(), dag->params(), *optimizer, meta,
      {.keep = config.train.keep_checkpoints,
       // A SentencePiece model travels with the checkpoint; GPT-2's BPE is public and fixed, and
       // samples read it from the dataset (sample_checkpoint.cpp).
       .tokenizer_model =
           dataset.tokenizer_kind == "sentencepiece" ? dataset.tokenizer_model.string() : "",
       .on_note = [](const std::string& note) { std::cerr << note << "\n"; },
       .strategy_tensors = std::move(strategy_tensors),
       .read_state =
           [this](const at::Tensor& t) {
             return replica->runner != nullptr ? replica->runner->read_state(t) : t;
           }});
}

}  // namespace starling::train
