#include "starling/train/trainer.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>

#include "starling/common/cpu_runtime.h"
#include "starling/common/device.h"
#include "starling/common/error.h"
#include "starling/common/signal_clock.h"
#include "starling/train/evaluate.h"
#include "starling/train/precision.h"
#include "starling/train/sampler.h"
#include "starling/train/schedule.h"
#include "starling/train/session.h"
#include "starling/train/step_reporter.h"
#include "starling/train/step_runner.h"
#include "starling/train/stop_request.h"

namespace starling::train {
namespace fs = std::filesystem;
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int64_t> g_first_signal_ns{0};  // signal_clock_ns() of the run's first stop signal
// A run under a launcher (--json: `train --peers N` reads it) leaves a forced stop to that
// launcher: a Ctrl-C at a terminal reaches the launcher and its peers alike, and the launcher
// passes it on as a SIGTERM, so each peer hears two signals for one keypress.
std::atomic<bool> g_second_signal_quits{true};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "used in a signal handler");

// The first SIGINT/SIGTERM asks for a stop at the step's end (a swarm's: its round's), with a
// checkpoint; a second one, a second or more later, quits at once, as the user who pressed
// Ctrl-C again wants (a step of a big model on a CPU may take minutes). Sooner, it is taken for
// the same keypress delivered twice (signal_clock.h). Quitting loses nothing saved: checkpoints
// are written aside and renamed whole.
extern "C" void on_stop_signal(int sig) {
  g_stop.store(true);
  if (!g_second_signal_quits.load()) return;
  const int64_t now = signal_clock_ns();
  int64_t first = 0;
  if (g_first_signal_ns.compare_exchange_strong(first, now)) {
    static const char kFirst[] =
        "\nstopping at the end of this step (a swarm's: of this round), with a checkpoint; "
        "Ctrl-C again, a second from now or later, quits at once without one\n";
    [[maybe_unused]] const auto n = ::write(2, kFirst, sizeof kFirst - 1);
    return;
  }
  if (now - first < kSecondSignalGapNs) return;
  static const char kSecond[] =
      "\nquitting now, without a checkpoint of this step (the last one saved is whole)\n";
  [[maybe_unused]] const auto n = ::write(2, kSecond, sizeof kSecond - 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Installs SIGINT/SIGTERM handlers for the duration of a run and restores the old ones after.
class StopSignals {
 public:
  explicit StopSignals(bool second_quits) {
    g_stop.store(false);
    g_first_signal_ns.store(0);
    g_second_signal_quits.store(second_quits);
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

// The run's first progress note: model, data, batch, device and the peak MFU is measured against.
std::string describe(const Session& s, double peak_gflops) {
  const RunConfig& c = s.config;
  const int64_t tokens_per_step = c.train.batch_size * c.train.grad_accum * c.model.seq_len;
  // A cgroup's CPU limit (a container's, a local swarm peer's quota) bounds the default threads.
  const double cpus = usable_cpus();
  const std::string limit = cpus < logical_cpus() ? fmt(" (CPU limit %g)", cpus) : std::string();
  return "model " + (c.model_preset.empty() ? c.model.name : c.model_preset) + " (" +
         model::to_string(c.model.arch) + ", " +
         fmt("%.2fM", static_cast<double>(c.model.num_params()) / 1e6) + " params) | data " +
         s.dataset.dir.string() + " (" + s.dataset.tokenizer_kind + ", " +
         fmt("%.2fM", static_cast<double>(s.dataset.train_tokens) / 1e6) + " train tokens) | " +
         std::to_string(tokens_per_step) + " tokens/step | " + c.train.device + " " +
         c.train.dtype + ", " + std::to_string(s.threads) + " threads" + limit + " | peak " +
         fmt("%.1f", peak_gflops) + " GFLOP/s";
}

// The strategy's report, the runner's (a pipeline stage's traffic with the other stages), or both:
// then the strategy's, with the runner's waits added and its figures beside the strategy's.
std::optional<StrategyReport> report_of(const StepHooks* hooks, const StepRunner& runner) {
  std::optional<StrategyReport> own = runner.network_report();
  if (hooks == nullptr) return own;
  StrategyReport r = hooks->report();
  if (own) {
    r.net_wait_s += own->net_wait_s;
    r.figures.insert(own->figures.begin(), own->figures.end());
  }
  return r;
}

}  // namespace

bool stop_requested() { return g_stop.load(); }

TrainResult train(const RunConfig& c, const TrainOptions& options) {
  ProgressLine progress(options.progress);
  const std::unique_ptr<Session> session = open_session(c, options, progress);
  Session& s = *session;
  // A start that fails before write_config() (a runner that cannot plan its budget, a strategy
  // that refuses its state) leaves no empty run directory behind it (options.tidy_failed_start).
  // Declared before the runner, which is gone first.
  struct UnstartedRun {
    Session& s;
    bool started = false;
    ~UnstartedRun() {
      if (!started) s.remove_unstarted_run_dir();
    }
  } unstarted{s, !options.tidy_failed_start};
  Replica& replica = *s.replica;
  StepHooks* const hooks = options.hooks;
  // The runner exists before the strategy starts: a swapping runner takes the state over first,
  // so a state transfer at the start (a joiner) goes through it like any later one.
  const std::unique_ptr<StepRunner> runner_owner =
      options.step_runner ? options.step_runner(s, progress)
                          : std::make_unique<LocalStepRunner>(*s.executor, s.dag->params(),
                                                              *s.optimizer, *s.loader, s.device);
  StepRunner& runner = *runner_owner;
  replica.runner = &runner;
  // A resumed run's step: what its checkpoint on disk holds, whatever state start() adopts.
  const int64_t own_step = replica.step;
  if (hooks)
    hooks->start(replica, s.restored ? s.restored->meta.strategy : nlohmann::json(),
                 s.restored ? &s.restored->optimizer : nullptr);
  s.restored.reset();

  const double peak_gflops = c.train.peak_tflops > 0
                                 ? c.train.peak_tflops * 1e3
                                 : measure_peak_gflops(c.train.device, c.train.dtype);
  // With JSON events on stdout (a launcher's peer), stderr is the peer's log: the header goes
  // there even in a quiet run, so a log says what its peer ran with (threads under a quota, say).
  if (options.json_events)
    progress.log(describe(s, peak_gflops));
  else
    progress.note(describe(s, peak_gflops));
  const int64_t last =
      options.stop_at >= 0 ? std::min(options.stop_at, c.train.steps) : c.train.steps;
  // Not an error (a finished run's command run again with --resume ends at once), but said: a
  // lowered train.steps or --stop-at trains nothing. A swarm's peer is left out: its start may
  // have adopted the swarm's state, at another step.
  if (!hooks && s.resumed && own_step >= last)
    std::cerr << "nothing to train: the checkpoint is at step " << own_step
              << ", and this run ends " << (own_step == last ? "there" : "before it") << " (step "
              << last << ": " << (last < c.train.steps ? "--stop-at" : "train.steps") << ")\n";
  StepReporter reporter(c, progress, options.json_events, peak_gflops, last,
                        options.resume ? replica.step : -1, options.on_record);
  const bool fp16 = c.train.dtype == "fp16";
  const auto tokens_per_step =
      static_cast<uint64_t>(c.train.batch_size * c.train.grad_accum * c.model.seq_len);

  s.write_config();
  unstarted.started = true;
  StopSignals signals(!options.json_events);
  TrainResult result;
  fs::path last_ckpt;
  // A resumed run's starting step is already on disk; stopping at once must not rewrite it.
  int64_t saved_step = s.resumed ? own_step : -1;
  int64_t evaluated_step = replica.step;
  bool at_boundary = true;
  double loss = 0;  // the last loss read back from the device
  // On a GPU: the most device memory a step allocated (evaluations and checkpoints, which may
  // gather a swapped state, fall between steps and do not count).
  int64_t step_peak = 0;
  // At a round boundary: the evaluation and checkpoint due at replica.step.
  const auto evaluate_and_save = [&] {
    const bool final_step = replica.step == c.train.steps;
    // "Crossed a multiple" rather than "is a multiple": rounds of a strategy may step past it.
    auto crossed = [&](int64_t every, int64_t since) {
      return every > 0 && replica.step / every > since / every;
    };
    if (!s.dataset.val_shards.empty() &&
        (crossed(c.train.eval_every, evaluated_step) || final_step)) {
      // A signal ends a long evaluation (the checkpoint is what matters then), except a
      // pipeline's, whose stages evaluate together.
      const auto stop = [&] { return g_stop.load() && !c.pipeline.enabled(); };
      if (const std::optional<double> v =
              evaluate(runner, *s.executor, s.dataset, c, s.device, stop)) {
        s.val_loss = *v;
        evaluated_step = replica.step;
        reporter.eval(replica.step, s.val_loss, replica.tokens);
      } else {
        // No loss for this step: an earlier one must not pass for it (results, checkpoint).
        s.val_loss = -1;
        progress.note("step " + std::to_string(replica.step) +
                      ": evaluation stopped by the signal; no validation loss");
      }
    }
    if (crossed(c.train.checkpoint_every, std::max<int64_t>(saved_step, 0)) || final_step) {
      try {
        last_ckpt = s.save(hooks);
        progress.note("checkpoint " + last_ckpt.string());
        if (options.on_record) options.on_record({{"checkpoint_step", replica.step}});
      } catch (const CheckpointError& e) {
        // Nothing of the failed save is left, and the previous checkpoints are as they were.
        if (final_step || c.train.on_checkpoint_error != "continue")
          throw CheckpointError(std::string(e.what()) +
                                "; free some space and continue with --resume");
        progress.log("checkpoint at step " + std::to_string(replica.step) + " skipped: " +
                     e.what() + "; training goes on (train.on_checkpoint_error = \"continue\")");
      }
      saved_step = replica.step;
    }
  };
  // A signal stops at the next round boundary (at once for a single replica), where the
  // parameters are the shared model and a checkpoint can be taken; so does --stop-at, whose step
  // may fall inside a round (it used to stop there, with no checkpoint of the steps since the
  // last boundary, and a --resume went back to that one).
  bool past_stop_at = false;
  while (replica.step < c.train.steps &&
         !((g_stop.load() || replica.step >= last) && at_boundary)) {
    if (replica.step >= last && !past_stop_at) {
      past_stop_at = true;
      progress.log("--stop-at " + std::to_string(last) + " falls inside a round of strategy " +
                   c.strategy.kind +
                   ": training on to the round's end, where the swarm's model is checkpointed");
    }
    const double t0 = now_s();
    if (!s.device.is_cpu()) reset_peak_memory(s.device);
    // The loss and the gradient norm stay on the device until they are reported: reading them
    // every step would make the host wait for the GPU and leave it idle between steps.
    const double loss_scale = fp16 ? s.scaler.scale() : 1.0;
    if (fp16) runner.unscale_next_step(s.scaler.unscale_factor());
    StepHooks::StepWork work;
    if (hooks) {
      work = hooks->run_step(runner, replica, loss_scale);
    } else {
      // Nothing comes between the passes and the update but fp16's loss scaling.
      if (!fp16)
        runner.expect_update(learning_rate(c.optim, replica.step, c.train.steps),
                             c.optim.grad_clip);
      work = {.loss = runner.run(c.train.grad_accum, loss_scale), .tokens = tokens_per_step};
    }
    const at::Tensor& step_loss = work.loss;
    // fp16: the gradients are unscaled before a strategy sees them (peers' scales may differ),
    // and the skip is decided after its exchange, from the gradients this peer then holds. Where
    // the peers' gradients are summed (ddp, atom), one peer's overflow is in every peer's sum,
    // so all of them skip that step alike; deciding from its own gradients alone, the others
    // would apply an infinite sum, and a peer that sent zeros would skip a step they all took.
    // The scale backs off on this peer's own overflow too: a trimmed mean leaves an overflowed
    // row out, so the sum can be finite, and the step goes on, while this peer's scale is high.
    const bool own_finite = !fp16 || runner.gradients_finite();
    bool finite = own_finite;
    bool applies = true;  // the strategy's say: a ddp or atom step without an average is skipped
    if (hooks) {
      applies = hooks->gradients_ready(replica);
      if (fp16 && applies) finite = runner.gradients_finite();
    }
    const bool skip = !applies || (fp16 && !finite);
    if (fp16 && s.scaler.update(own_finite && finite))
      progress.note("step " + std::to_string(replica.step + 1) + ": fp16 gradients overflowed" +
                    (!hooks ? "; update skipped"
                     : skip ? " (this peer's, or the swarm's sum of them); update skipped"
                            : " on this peer; the swarm's aggregate left them out") +
                    ", loss scale now " + fmt("%.0f", s.scaler.scale()));
    // After the exchange: a peer that adopted the swarm's state there took the swarm's step too.
    const double lr = learning_rate(c.optim, replica.step, c.train.steps);
    const at::Tensor grad_norm = runner.update(lr, c.optim.grad_clip, skip);
    if (!s.device.is_cpu()) step_peak = std::max(step_peak, peak_memory_bytes(s.device));
    ++replica.step;
    replica.tokens += work.tokens;
    // The strategy's round boundary: its communication time counts in the step's time.
    // A signal stops only this peer (it leaves the swarm); train.steps is the same on every peer.
    // --stop-at ends this run but not training: a round boundary, not the end of the schedule.
    at_boundary = hooks ? hooks->step_done(replica, replica.step == c.train.steps) : true;
    // The run's last step is logged, and so is the step a signal stops it at.
    const bool milestone = replica.step % c.train.log_every == 0 || replica.step == last ||
                           ((g_stop.load() || replica.step > last) && at_boundary);
    // On a CPU the value is there already; a GPU is waited for only at milestones (which also
    // makes the window's wall-clock time cover the device work it queued).
    if (milestone || !s.device.is_cuda()) {
      loss = step_loss.item<double>();
      result.train_loss = loss;
      if (!std::isfinite(loss))
        throw Error("training diverged: loss is " + std::to_string(loss) + " at step " +
                    std::to_string(replica.step) + "; lower optim.lr or raise optim.warmup_steps");
    }
    StepOutcome outcome{.step = replica.step,
                        .loss = loss,
                        .lr = lr,
                        .tokens = replica.tokens,
                        .step_tokens = work.tokens,
                        .seconds = now_s() - t0,
                        .skipped = skip};
    if (milestone && !skip) outcome.grad_norm = grad_norm.item<double>();
    if (fp16) outcome.loss_scale = s.scaler.scale();
    reporter.step(outcome, milestone, report_of(hooks, runner));

    if (at_boundary) evaluate_and_save();  // they only see the shared model
  }
  // A peer that joined in the others' last round took no step: it ends on that one as they do.
  if (hooks && hooks->ended_in_start()) evaluate_and_save();
  if (const std::string note = runner.report(); !note.empty()) progress.log(note);
  if (!s.device.is_cpu() && step_peak > 0)
    progress.log(
        fmt("device memory peak over the steps %.2f GiB (allocated: weights, gradients, "
            "optimizer state, activations; not the allocator's cache of freed blocks)",
            static_cast<double>(step_peak) / (1 << 30)));
  progress.finish();
  if (hooks) hooks->finish(replica);
  result.net = report_of(hooks, runner);
  result.step = replica.step;
  result.val_loss = s.val_loss;
  result.tokens_per_s = reporter.run_tokens_per_s();
  result.interrupted = replica.step < c.train.steps;
  // Between boundaries a strategy's parameters are local progress, not the shared model.
  if (result.interrupted && replica.step > 0 && saved_step != replica.step && at_boundary) {
    // Stopped early (signal or stop_at): make sure the last step is on disk.
    last_ckpt = s.save(hooks);
    std::cerr << "stopped at step " << replica.step << "; checkpoint " << last_ckpt.string()
              << "; continue with --resume\n";
  } else if (result.interrupted && saved_step != replica.step) {
    std::cerr << "stopped at step " << replica.step << " inside a round; "
              << (saved_step > 0
                      ? "the newest checkpoint is from step " + std::to_string(saved_step)
                      : std::string("no checkpoint was taken yet"))
              << "\n";
  }
  result.checkpoint = last_ckpt;

  // GPT-2 tokens without GPT-2's BPE files beside them (llm.c shards) train, but cannot be read.
  const bool readable = s.dataset.tokenizer_kind != "gpt2" || !s.dataset.tokenizer_model.empty();
  if (c.train.sample_at_end && !result.interrupted && readable) {
    auto tokenizer = data::load_dataset_tokenizer(s.dataset);
    std::vector<uint32_t> prompt = tokenizer->encode(c.sample.prompt);
    if (prompt.empty()) prompt.push_back(0);
    runner.gather_weights();
    result.sample = sample_text(*s.dag, c.model, *tokenizer, prompt, c.sample);
  }
  return result;
}

}  // namespace starling::train
