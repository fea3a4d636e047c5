#include "starling/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>

#include "starling/common/cpu_runtime.h"
#include "starling/common/error.h"
#include "starling/data/dataset.h"
#include "starling/data/loader.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/model/hf_gpt2.h"
#include "starling/train/adamw.h"
#include "starling/train/checkpoint.h"
#include "starling/train/compute_bench.h"
#include "starling/train/loss_scaler.h"
#include "starling/train/metrics.h"
#include "starling/train/precision.h"
#include "starling/train/sampler.h"
#include "starling/train/schedule.h"
#include "starling/train/step_hooks.h"

namespace starling::train {
namespace fs = std::filesystem;
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop.store(true); }

// Installs SIGINT/SIGTERM handlers for the duration of a run and restores the old ones after.
class StopSignals {
 public:
  StopSignals() {
    g_stop.store(false);
    old_int_ = std::signal(SIGINT, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }

 private:
  void (*old_int_)(int);
  void (*old_term_)(int);
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<at::Tensor> to_tensors(const data::Batch& b, const c10::Device& device) {
  auto make = [&](const std::vector<int64_t>& v) {
    at::Tensor host = at::tensor(at::ArrayRef<int64_t>(v), at::kLong).view({b.batch, b.seq_len});
    if (!device.is_cuda()) return host;
    // A copy from pageable memory waits for everything queued on the GPU; from pinned memory it
    // is queued behind the previous step instead, and the host runs ahead to the next batch.
    return host.pin_memory().to(device, /*non_blocking=*/true);
  };
  return {make(b.inputs), make(b.targets)};
}

// The model table of a config as TOML: equal strings mean the same architecture and shape.
std::string model_signature(const RunConfig& c) {
  RunConfig only;
  only.model = c.model;
  const std::string text = to_toml(only);
  const auto begin = text.find("[model]");
  const auto end = text.find("\n[", begin + 1);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

double evaluate(graph::Executor& exec, const data::DatasetInfo& ds, const RunConfig& c,
                const c10::Device& device) {
  data::LoaderOptions opts{.seq_len = c.model.seq_len,
                           .batch = c.train.batch_size,
                           .seed = c.train.seed,
                           .rank = 0,
                           .world = 1,
                           .shuffle = false};
  data::TokenLoader val(ds.val_shards, opts);
  at::Tensor total = at::zeros({}, at::TensorOptions(at::kDouble).device(device));
  for (int64_t i = 0; i < c.train.eval_batches; ++i)
    total += exec.forward(to_tensors(val.next(), device));
  return total.item<double>() / static_cast<double>(c.train.eval_batches);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// " | 4 peers | sent 12.3 MB | net wait 4%" from a strategy's report, "" without one.
std::string net_summary(const nlohmann::json& net) {
  if (!net.is_object()) return "";
  return " | " + std::to_string(net.value("peers", 0)) + " peers | sent " +
         fmt("%.1f MB", net.value("bytes_sent", 0.0) / 1e6) + " | net wait " +
         fmt("%.1fs", net.value("net_wait_s", 0.0));
}

}  // namespace

TrainResult train(const RunConfig& c, const TrainOptions& options) {
  const int threads = setup_cpu_runtime(c.train.threads, c.train.cpu_allocator == "system");
  check_device(c.train.device, "train.device");
  check_dtype(c.train.device, c.train.dtype, "train.dtype");
  configure_matmul_precision(c.train.device, c.train.tf32);
  const c10::Device device(c.train.device);
  const data::DatasetInfo ds = data::open_dataset(c.data.dir);
  if (ds.vocab_size > static_cast<uint64_t>(c.model.vocab_size))
    throw ConfigError("model.vocab_size (" + std::to_string(c.model.vocab_size) +
                      ") is smaller than the vocabulary of the data in " + ds.dir.string() + " (" +
                      ds.tokenizer_kind + ", " + std::to_string(ds.vocab_size) +
                      "); set model.vocab_size = " + std::to_string(ds.vocab_size));
  const bool have_val = !ds.val_shards.empty();

  const fs::path run_dir = c.train.out_dir;
  fs::create_directories(run_dir);
  const bool has_checkpoint = fs::exists(run_dir / "checkpoints" / "latest");
  if (has_checkpoint && !options.resume)
    throw ConfigError(run_dir.string() +
                      " already holds a checkpoint; pass --resume to continue "
                      "that run, or set train.out_dir to a new directory");

  ProgressLine progress(options.progress);
  auto dag = model::build_model(c.model, c.train.seed, device);
  graph::Executor exec(*dag, {.recompute = c.train.recompute,
                              .autocast = parse_dtype(c.train.dtype, "train.dtype")});
  const bool fp16 = c.train.dtype == "fp16";
  LossScaler scaler;
  AdamW optimizer(dag->params(), {.beta1 = c.optim.beta1,
                                  .beta2 = c.optim.beta2,
                                  .eps = c.optim.eps,
                                  .weight_decay = c.optim.weight_decay});
  data::TokenLoader loader(ds.train_shards, {.seq_len = c.model.seq_len,
                                             .batch = c.train.batch_size,
                                             .seed = c.train.seed,
                                             .rank = options.data_rank,
                                             .world = options.data_world,
                                             .shuffle = true});

  int64_t step = 0;
  uint64_t tokens = 0;
  double val_loss = -1;
  std::optional<Checkpoint> ckpt_holder;
  if (options.resume && has_checkpoint) {
    const Checkpoint& ckpt = ckpt_holder.emplace(read_checkpoint(find_checkpoint(run_dir)));
    const RunConfig saved =
        parse_run_config(ckpt.meta.config_toml, (ckpt.dir / "meta.json").string());
    if (model_signature(saved) != model_signature(c))
      throw ConfigError("--resume: the model in " + ckpt.dir.string() +
                        " differs from the config's [model]:\n" + model_signature(saved) +
                        "\nversus\n" + model_signature(c));
    load_params(ckpt.model, dag->params());
    optimizer.load_state(ckpt.optimizer, ckpt.meta.step);
    loader.restore(ckpt.meta.loader);
    if (ckpt.optimizer.contains(kRngTensor)) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle to the global one
      gen.set_state(ckpt.optimizer.at(kRngTensor));
    }
    step = ckpt.meta.step;
    tokens = ckpt.meta.tokens;
    val_loss = ckpt.meta.val_loss;
    std::cerr << "resumed from " << ckpt.dir.string() << " at step " << step << "\n";
  } else if (!c.train.init_from.empty()) {
    model::load_hf_gpt2(c.train.init_from, *dag, c.model);
    progress.note("initialised from " + c.train.init_from);
  } else if (options.resume) {
    progress.note("--resume: no checkpoint in " + run_dir.string() + ", starting fresh");
  }
  { std::ofstream(run_dir / "config.toml") << to_toml(c); }
  auto emit = [&](const nlohmann::json& event) {
    if (options.json_events) std::cout << event.dump() << std::endl;
  };
  Replica replica{c, dag->params(), optimizer, step, tokens};
  if (options.hooks) {
    options.hooks->start(replica, ckpt_holder ? ckpt_holder->meta.strategy : nlohmann::json(),
                         ckpt_holder ? &ckpt_holder->optimizer : nullptr);
    ckpt_holder.reset();
  }

  const double peak_gflops = c.train.peak_tflops > 0
                                 ? c.train.peak_tflops * 1e3
                                 : measure_peak_gflops(c.train.device, c.train.dtype);
  const double flops_per_token = c.model.train_flops_per_token();
  const int64_t tokens_per_step = c.train.batch_size * c.train.grad_accum * c.model.seq_len;
  progress.note("model " + (c.model_preset.empty() ? c.model.name : c.model_preset) + " (" +
                model::to_string(c.model.arch) + ", " +
                fmt("%.2fM", static_cast<double>(c.model.num_params()) / 1e6) + " params) | data " +
                ds.dir.string() + " (" + ds.tokenizer_kind + ", " +
                fmt("%.2fM", static_cast<double>(ds.train_tokens) / 1e6) + " train tokens) | " +
                std::to_string(tokens_per_step) + " tokens/step | " + c.train.device + " " +
                c.train.dtype + ", " + std::to_string(threads) + " threads | peak " +
                fmt("%.1f", peak_gflops) + " GFLOP/s");

  MetricsLog metrics(run_dir, options.resume ? step : -1);
  std::string tokenizer_model = ds.tokenizer_model.empty() ? "" : ds.tokenizer_model.string();
  auto save = [&](int64_t at_step) {
    std::vector<std::pair<std::string, at::Tensor>> strategy_tensors;
    nlohmann::json strategy_state;
    if (options.hooks) strategy_state = options.hooks->checkpoint_state(strategy_tensors);
    CheckpointMeta meta{.step = at_step,
                        .tokens = tokens,
                        .loader = loader.state(),
                        .config_toml = to_toml(c),
                        .tokenizer_kind = ds.tokenizer_kind,
                        .data_vocab_size = ds.vocab_size,
                        .val_loss = val_loss,
                        .strategy = strategy_state};
    return save_checkpoint(run_dir, dag->params(), optimizer, meta,
                           {.keep = c.train.keep_checkpoints,
                            .tokenizer_model = tokenizer_model,
                            .strategy_tensors = std::move(strategy_tensors)});
  };

  StopSignals signals;
  TrainResult result;
  const int64_t last =
      options.stop_at >= 0 ? std::min(options.stop_at, c.train.steps) : c.train.steps;
  const double run_start = now_s();
  double compute_s = 0, window_s = 0;
  int64_t window_tokens = 0, run_tokens = 0;
  fs::path last_ckpt;
  // A resumed run's starting step is already on disk; stopping at once must not rewrite it.
  int64_t saved_step = options.resume && has_checkpoint ? step : -1;
  int64_t evaluated_step = step;
  bool at_boundary = true;
  double loss = 0;  // the last loss read back from the device
  // A signal stops at the next round boundary (at once for a single replica), where the
  // parameters are the shared model and a checkpoint can be taken.
  while (step < last && !(g_stop.load() && at_boundary)) {
    const double t0 = now_s();
    const double lr = learning_rate(c.optim, step, c.train.steps);
    dag->params().zero_grad();
    // The loss and the gradient norm stay on the device until they are reported: reading them
    // every step would make the host wait for the GPU and leave it idle between steps.
    at::Tensor loss_sum;
    for (int64_t m = 0; m < c.train.grad_accum; ++m) {
      at::Tensor l = exec.forward_backward(
          to_tensors(loader.next(), device),
          (fp16 ? scaler.scale() : 1.0) / static_cast<double>(c.train.grad_accum));
      loss_sum = loss_sum.defined() ? loss_sum + l : l;
    }
    const bool skip = fp16 && scaler.update(scaler.unscale(dag->params()));
    if (skip)
      progress.note("step " + std::to_string(step + 1) +
                    ": fp16 gradients overflowed; update skipped, loss scale now " +
                    fmt("%.0f", scaler.scale()));
    if (options.hooks) options.hooks->gradients_ready(replica);
    const at::Tensor grad_norm = clip_grad_norm(dag->params(), c.optim.grad_clip);
    if (!skip) optimizer.step(lr);
    ++step;
    tokens += static_cast<uint64_t>(tokens_per_step);
    // The strategy's round boundary: its communication time counts in the step's time.
    // A signal stops only this peer (it leaves the swarm); train.steps is the same on every peer.
    // --stop-at ends this run but not training: a round boundary, not the end of the schedule.
    at_boundary = options.hooks ? options.hooks->step_done(replica, step == c.train.steps) : true;
    const bool milestone = step % c.train.log_every == 0 || step == last;
    // On a CPU the value is there already; a GPU is waited for only at milestones (which also
    // makes the window's wall-clock time cover the device work it queued).
    if (milestone || !device.is_cuda()) {
      loss = loss_sum.item<double>() / static_cast<double>(c.train.grad_accum);
      result.train_loss = loss;
      if (!std::isfinite(loss))
        throw Error("training diverged: loss is " + std::to_string(loss) + " at step " +
                    std::to_string(step) + "; lower optim.lr or raise optim.warmup_steps");
    }
    const double dt = now_s() - t0;
    compute_s += dt;
    window_s += dt;
    window_tokens += tokens_per_step;
    run_tokens += tokens_per_step;

    const double tps = static_cast<double>(window_tokens) / window_s;
    const double tflops = tps * flops_per_token / 1e12;
    const double mfu = tflops * 1e3 / peak_gflops;
    const double eta = (compute_s / static_cast<double>(run_tokens / tokens_per_step)) *
                       static_cast<double>(last - step);
    const nlohmann::json net = options.hooks ? options.hooks->report() : nlohmann::json();
    if (milestone)
      emit({{"event", "step"},
            {"step", step},
            {"steps", c.train.steps},
            {"loss", loss},
            {"lr", lr},
            {"tokens", tokens},
            {"tokens_per_s", tps},
            {"net", net},
            {"elapsed_s", now_s() - run_start}});
    progress.update("step " + std::to_string(step) + "/" + std::to_string(c.train.steps) +
                        " | loss " + fmt("%.4f", loss) + " | lr " + fmt("%.2e", lr) + " | " +
                        fmt("%.0f", tps) + " tok/s | " + fmt("%.1f", tflops) + " TFLOP/s | MFU " +
                        fmt("%.1f%%", 100 * mfu) + " | " + format_duration(now_s() - run_start) +
                        " elapsed, eta " + format_duration(eta) + net_summary(net),
                    milestone);
    if (milestone) {
      nlohmann::json record = {{"step", step},
                               {"loss", loss},
                               {"lr", lr},
                               {"grad_norm", grad_norm.item<double>()},
                               {"tokens", tokens},
                               {"tokens_per_s", tps},
                               {"tflops", tflops},
                               {"mfu", mfu},
                               {"elapsed_s", now_s() - run_start}};
      if (fp16) record["loss_scale"] = scaler.scale();
      if (!net.is_null()) record["net"] = net;
      metrics.write(record);
      window_s = 0;
      window_tokens = 0;
    }
    const bool final_step = step == c.train.steps;
    if (!at_boundary) continue;  // evaluation and checkpoints only see the shared model
    // "Crossed a multiple" rather than "is a multiple": rounds of a strategy may step past it.
    auto crossed = [&](int64_t every, int64_t since) {
      return every > 0 && step / every > since / every;
    };
    if (have_val && (crossed(c.train.eval_every, evaluated_step) || final_step)) {
      val_loss = evaluate(exec, ds, c, device);
      evaluated_step = step;
      metrics.write({{"step", step},
                     {"val_loss", val_loss},
                     {"tokens", tokens},
                     {"elapsed_s", now_s() - run_start}});
      emit({{"event", "eval"},
            {"step", step},
            {"val_loss", val_loss},
            {"tokens", tokens},
            {"elapsed_s", now_s() - run_start}});
      progress.note("step " + std::to_string(step) + " | val loss " + fmt("%.4f", val_loss));
    }
    if (crossed(c.train.checkpoint_every, std::max<int64_t>(saved_step, 0)) || final_step) {
      last_ckpt = save(step);
      saved_step = step;
      progress.note("checkpoint " + last_ckpt.string());
    }
  }
  progress.finish();
  if (options.hooks) {
    options.hooks->finish(replica);
    result.net_report = options.hooks->report().dump();
  }
  result.step = step;
  result.val_loss = val_loss;
  result.tokens_per_s = compute_s > 0 ? static_cast<double>(run_tokens) / compute_s : 0;
  result.interrupted = step < c.train.steps;
  // Between boundaries a strategy's parameters are local progress, not the shared model.
  if (result.interrupted && step > 0 && saved_step != step && at_boundary) {
    // Stopped early (signal or stop_at): make sure the last step is on disk.
    last_ckpt = save(step);
    std::cerr << "stopped at step " << step << "; checkpoint " << last_ckpt.string()
              << "; continue with --resume\n";
  } else if (result.interrupted && saved_step != step) {
    std::cerr << "stopped at step " << step << " inside a round; "
              << (saved_step > 0
                      ? "the newest checkpoint is from step " + std::to_string(saved_step)
                      : std::string("no checkpoint was taken yet"))
              << "\n";
  }
  result.checkpoint = last_ckpt;

  if (c.train.sample_at_end && !result.interrupted && ds.tokenizer_kind != "gpt2") {
    auto tokenizer = data::load_dataset_tokenizer(ds);
    std::vector<uint32_t> prompt = tokenizer->encode(c.sample.prompt);
    if (prompt.empty()) prompt.push_back(0);
    auto ids = generate(*dag, c.model, prompt, c.sample);
    result.sample = tokenizer->decode(ids);
  }
  return result;
}

}  // namespace starling::train
