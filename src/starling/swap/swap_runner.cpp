#include "starling/swap/swap_runner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>

#include "starling/common/cpu_runtime.h"
#include "starling/common/error.h"
#include "starling/common/made_dirs.h"
#include "starling/data/loader.h"
#include "starling/model/build.h"
#include "starling/swap/disk_tier.h"
#include "starling/swap/pinned_tier.h"
#include "starling/swap/profile.h"
#include "starling/swap/swap_config.h"
#include "starling/swap/swapper.h"
#include "starling/train/metrics.h"
#include "starling/train/precision.h"
#include "starling/train/session.h"
#include "starling/train/step_runner.h"

namespace starling::swap {
namespace {

namespace fs = std::filesystem;

// Enough to see the tier's steady bandwidth, and no more than the state it will hold, but for
// the probe's one piece of 8 MiB (measure_tier).
int64_t probe_bytes(int64_t state_bytes) {
  return std::min(std::clamp<int64_t>(state_bytes / 4, int64_t{32} << 20, int64_t{512} << 20),
                  std::max(state_bytes, int64_t{8} << 20));
}

fs::path tier_dir(const train::RunConfig& c) {
  return c.swap.dir.empty() ? fs::path(c.train.out_dir) : fs::path(c.swap.dir);
}

// What a swapped run, and `plan swap` before it profiles, cannot do on this device and libtorch.
void check_supported(const train::RunConfig& c) {
  check_tier_below(c.swap.tier, c10::Device(c.train.device));
  train::check_dtype(c.train.device, c.train.dtype, "train.dtype");
}

// `announced`: one replica, whose trainer announces each step's update (a strategy's exchange
// comes between the passes and the update, which then starts after them). fp16's loss scaling
// comes between them too, so fp16 is never announced.
SwapProblem problem_for(const train::RunConfig& c, graph::OpDag& dag, const std::string& budget,
                        bool announced) {
  announced = announced && c.train.dtype != "fp16";
  graph::ExecutorOptions options{.recompute = c.train.recompute,
                                 .autocast = train::parse_dtype(c.train.dtype, "train.dtype")};
  const c10::Device device(c.train.device);
  int64_t state = 0;  // as the tier stores it: four aligned tensors per parameter
  for (const auto& param : dag.params().params())
    state += 4 * static_cast<int64_t>(align_up(
                     static_cast<size_t>(param.value.numel() * param.value.element_size())));
  // Told before the profile's minute of work and its probe's writes there. A peer's strategy
  // may keep whole-model vectors there too (strategy/outer_vector.h), a parameter's worth each.
  const int64_t kept = c.strategy.kind == "diloco"                    ? 2
                       : c.strategy.kind == "co2" && !c.strategy.zero ? 4
                                                                      : 0;
  // The probe's file comes first and goes before the state's: the room for the larger of the two.
  if (c.swap.tier == "disk") {
    const int64_t needed = state + state / 4 * kept;
    if (probe_bytes(state) > needed)
      check_disk_room(tier_dir(c), probe_bytes(state),
                      "its bandwidth probe, before the training state's " +
                          format_bytes(static_cast<double>(needed)));
    else
      check_disk_room(tier_dir(c), needed,
                      kept == 0 ? "the whole training state: weights, gradients and AdamW moments"
                                : "the whole training state (weights, gradients and AdamW "
                                  "moments) and the strategy's " +
                                      std::to_string(kept) + " vectors of outer state");
  }
  // With clipping, the update inside the backward is a guess, on the disk tier, whose spare
  // rooms hold the weights and moments once more (as the tier stores them). "always" needs their
  // room from the start; "auto" reserves it at its first guess, where there is room then
  // (Swapper::reserve_spare_rooms).
  const bool in_backward =
      announced && c.swap.update_in_backward && device.is_cpu() && c.swap.overlap_update;
  Speculation speculation = Speculation::kOff;
  if (in_backward && c.optim.grad_clip > 0 && c.swap.tier == "disk" &&
      c.swap.speculative_update != "off") {
    speculation = Speculation::kAfterUnclipped;
    if (c.swap.speculative_update == "always") {
      check_disk_room(tier_dir(c), state / 4 * 7,
                      "the training state and the spare rooms of swap.speculative_update = "
                      "\"always\" (\"auto\" guesses only where there is room)");
      speculation = Speculation::kAlways;
    }
  }
  // Read before the profile, which takes minutes on a large model.
  const int64_t budget_bytes = parse_bytes(budget, "swap.budget");
  if (budget_bytes <= 0) throw ConfigError("swap.budget must be more than 0 bytes");
  SwapProblem p = profile_nodes(dag, options, c.train.batch_size, c.model.seq_len, device);
  p.budget = budget_bytes;
  p.micro_batches = c.train.grad_accum;
  p.group_nodes = c.swap.group_nodes;
  p.depth = static_cast<int>(c.swap.depth);
  p.moment_groups = static_cast<int>(c.swap.moment_groups);
  p.overlap_update = c.swap.overlap_update;
  p.update_in_backward =
      in_backward && (c.optim.grad_clip == 0 || speculation != Speculation::kOff);
  p.speculation = speculation;
  p.guess_break_even = c.swap.guess_break_even;
  p.rows_first = c.swap.rows_first && device.is_cpu();
  measure_tier(p, c.swap.tier, tier_dir(c), probe_bytes(state), device,
               /*slowdown=*/c.swap.io_slowdown < 0);
  if (c.swap.io_slowdown >= 0) p.io_slowdown = c.swap.io_slowdown;
  return p;
}

class SwapStepRunner final : public train::StepRunner {
 public:
  SwapStepRunner(train::Session& s, std::unique_ptr<Swapper> swapper)
      : s_(s), swapper_(std::move(swapper)) {
    s_.executor->add_observer(swapper_.get());
  }
  ~SwapStepRunner() override { s_.executor->remove_observer(swapper_.get()); }

  at::Tensor run(int64_t micro_batches, double loss_scale) override {
    swapper_->begin_step(micro_batches);
    at::Tensor loss_sum;
    for (int64_t m = 0; m < micro_batches; ++m) {
      swapper_->begin_micro_batch(m);
      at::Tensor l = s_.executor->forward_backward(train::to_device(s_.loader->next(), s_.device),
                                                   loss_scale / static_cast<double>(micro_batches));
      swapper_->end_pass();
      loss_sum = loss_sum.defined() ? loss_sum + l : l;
    }
    return loss_sum / static_cast<double>(micro_batches);
  }

  void begin_accumulation() override {
    swapper_->begin_step(0);
    micro_ = 0;
  }

  at::Tensor accumulate(double loss_scale, int64_t sequences) override {
    swapper_->begin_micro_batch(micro_++);
    at::Tensor l =
        s_.executor->forward_backward(train::to_device(s_.loader->next(sequences), s_.device),
                                      loss_scale * static_cast<double>(sequences));
    swapper_->end_pass();
    return l;
  }

  void visit_gradients(const GradientVisitor& visit) override { swapper_->visit_gradients(visit); }
  // The swapper's pieces are a node's parameters already.
  void visit_gradients_by_node(const GradientVisitor& visit) override {
    swapper_->visit_gradients(visit);
  }

  void unscale_next_step(double factor) override { swapper_->unscale_next_step(factor); }
  bool gradients_finite() override { return swapper_->gradients_finite(); }

  void expect_update(double lr, double max_norm) override {
    if (s_.config.swap.update_in_backward) swapper_->expect_update(lr, max_norm);
  }

  at::Tensor update(double lr, double max_norm, bool skip) override {
    // The update may still be running when this returns: it completes during the next step's
    // first forward pass (swapper.h), an open-ended step's (atom) as well.
    return swapper_->update(lr, max_norm, skip);
  }

  void gather_weights() override { swapper_->gather_weights(); }
  at::Tensor read_state(const at::Tensor& t) override { return swapper_->read_state(t); }
  void write_state(const at::Tensor& t, const at::Tensor& values) override {
    swapper_->write_state(t, values);
  }
  bool keep_state(const at::Tensor& t, const at::Tensor& values) override {
    swapper_->keep_state(t, values);
    return true;
  }

  // Outside the budget, on a CPU: freed activation and gradient blocks the CPU allocator keeps
  // for the next step (common/cpu_runtime.h), most of the resident set's overhead. (A GPU run's
  // device memory peak closes every GPU run's log.)
  std::string allocator_report() const {
    if (!s_.device.is_cpu()) return "";
    return "; CPU allocator cache " +
           format_bytes(static_cast<double>(caching_cpu_allocator_stats().cached_bytes));
  }
  data::TokenLoader* dealt_loader() override { return s_.loader.get(); }

  std::string report() const override {
    const SwapStats& st = swapper_->stats();
    return "swap: peak resident " + format_bytes(static_cast<double>(st.peak_resident)) +
           ", read " + format_bytes(static_cast<double>(st.read_bytes)) + ", written " +
           format_bytes(static_cast<double>(st.write_bytes)) + ", waited " +
           train::fmt("%.2f s", st.wait_s) + " on " + swapper_->tier().describe() + "; passes " +
           train::fmt("%.2f s", st.pass_s) + " (waiting " + train::fmt("%.2f s", st.pass_wait_s) +
           "), optimizer " + train::fmt("%.2f s", st.update_s) + " (waiting " +
           train::fmt("%.2f s", st.update_wait_s) +
           // Without staging (a tier updated in place) the sets are only the batches computed.
           (st.update_sets > 0
                ? "; " + std::to_string(st.update_chunks) + " chunks in " +
                      std::to_string(st.update_sets) +
                      (swapper_->plan().staging_bytes > 0 ? " staging sets" : " batches")
                : std::string()) +
           (st.in_place_bytes > 0 ? "; " + format_bytes(static_cast<double>(st.in_place_bytes)) +
                                        " updated in place in the tier"
                                  : std::string()) +
           (st.pumped > 0 ? "; advanced " + std::to_string(st.pumped) + " times between operators"
                          : std::string()) +
           (st.rows_first > 0 ? "; looked-up rows first " + std::to_string(st.rows_first) + " times"
                              : std::string()) +
           (st.backward_chunks > 0
                ? "; " + std::to_string(st.backward_chunks) + " chunks inside the backward"
                : std::string()) +
           (st.speculated > 0 ? "; " + std::to_string(st.speculated) +
                                    " updates begun before their clipping was known, " +
                                    std::to_string(st.redone) + " of them redone (clipped)"
                              : std::string()) +
           (st.declined > 0
                ? "; " + std::to_string(st.declined) +
                      " steps after an unclipped one not guessed (" +
                      (swapper_->plan().break_even >= 1
                           ? std::string("a guess does not pay here: swap plan above")
                           : "break-even share " +
                                 train::fmt("%.0f%%", 100 * swapper_->plan().break_even)) +
                      ")"
                : std::string()) +
           (st.speculation_off.empty() ? std::string() : "; " + st.speculation_off) + ")" +
           (st.exchange_s > 0
                ? ", exchanges " + train::fmt("%.2f s", st.exchange_s) + " (waiting for the tier " +
                      train::fmt("%.2f s", st.exchange_wait_s) + ")"
                : std::string()) +
           allocator_report();
  }

 private:
  train::Session& s_;
  std::unique_ptr<Swapper> swapper_;
  int64_t micro_ = 0;  // micro-batches of the open-ended step so far
};

}  // namespace

StepRunnerFactory swapped_step_runner(bool one_replica) {
  return [one_replica](train::Session& s,
                       train::ProgressLine& progress) -> std::unique_ptr<train::StepRunner> {
    const train::RunConfig& c = s.config;
    check_supported(c);
    progress.note("swap: profiling the model and the " + c.swap.tier + " tier");
    SwapProblem problem = problem_for(c, *s.dag, c.swap.budget, one_replica);
    SwapPlan plan = plan_swap(problem);
    std::string text = describe_plan(plan, problem);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    progress.log(text);
    // The profiling pass's blocks (a whole model's gradients and activations) go back before
    // the state is adopted, and the evicted state's after: either would otherwise stay
    // cached for the whole run, far over the budget.
    release_cached_cpu_blocks();
    auto swapper = std::make_unique<Swapper>(*s.dag, *s.optimizer, std::move(plan),
                                             make_tier(c.swap.tier, tier_dir(c), s.device));
    release_cached_cpu_blocks();
    return std::make_unique<SwapStepRunner>(s, std::move(swapper));
  };
}

std::string plan_swap_for(const train::RunConfig& c, const std::string& budget) {
  setup_cpu_runtime(c.train.threads, c.train.cpu_allocator == "system");
  check_supported(c);
  auto dag = model::build_model(c.model, c.train.seed, c10::Device(c.train.device));
  // A config with a swarm strategy plans as each of its peers runs it (peer_command.cpp:
  // swapped_step_runner(false)): a peer's update starts after the passes, never inside the
  // backward, so its plan has no guesses either.
  const bool one_replica = c.strategy.kind == "none";
  // The probe makes the tier's directory (train.out_dir by default) where it is missing; a plan
  // leaves no empty directories behind, however it ends: an error, or Ctrl-C during the profile.
  const MadeDirsGuard cleanup(tier_dir(c), outermost_missing(tier_dir(c)),
                              "plan: interrupted; no plan was made");
  // The profile runs every node at the run's batch, and the probe writes and reads the tier: a
  // minute or more for a large model on a CPU, which would otherwise pass in silence.
  std::cerr << "plan: profiling the model's " << dag->nodes().size() << " nodes at batch "
            << c.train.batch_size << " x " << c.model.seq_len << " on " << c.train.device
            << ", and the " << c.swap.tier << " tier's bandwidth; the plan follows"
            << (one_replica
                    ? ""
                    : " (as each peer of strategy.kind = \"" + c.strategy.kind + "\" runs it)")
            << std::endl;
  const SwapProblem problem = problem_for(c, *dag, budget, one_replica);
  return describe_plan(plan_swap(problem), problem);
}

}  // namespace starling::swap
