// How one optimizer step's forward and backward passes run: the seam between the training loop
// (trainer.cpp), which decides when steps happen and what follows them (strategy hooks, clipping,
// the optimizer, reporting), and the machinery that produces the step's gradients. The local
// runner below runs every micro-batch through one executor on this machine; a runner that swaps
// layer groups through a memory budget, or one that runs a stage of a pipeline, plugs in beside it
// without the loop changing.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "starling/train/strategy_report.h"

namespace starling::data {
class TokenLoader;
struct Batch;
}  // namespace starling::data

namespace starling::graph {
class Executor;
class ParamStore;
}  // namespace starling::graph

namespace starling::train {
class AdamW;
}

namespace starling::train {

// t <- values (as many elements, any shape or device), outside autograd: a weight is a leaf that
// requires its gradient. What StepRunner::write_state does for a tensor kept in memory.
void copy_state(const at::Tensor& t, const at::Tensor& values);

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Clears the gradients, then runs forward and backward over `micro_batches` micro-batches,
  // accumulating into the parameters' gradients with each micro-batch's loss scaled by
  // loss_scale / micro_batches. Returns the mean loss as a 0-dim tensor on the model's device:
  // nothing here waits for the device.
  virtual at::Tensor run(int64_t micro_batches, double loss_scale) = 0;

  // An open-ended step, for strategies that decide how many micro-batches it takes while it runs
  // (atom): begin_accumulation() clears the gradients, and each accumulate() runs one more
  // micro-batch of `sequences` sequences (at least 1; train.batch_size but for a step's last)
  // forward and backward, adding its gradients to those already there, its mean loss scaled by
  // loss_scale x sequences: the step's gradients are a sum over its samples, however they were
  // split into micro-batches. Returns that micro-batch's mean loss (0-dim, on the model's
  // device). A runner that must know a step's micro-batches in advance throws Error.
  virtual void begin_accumulation();
  virtual at::Tensor accumulate(double loss_scale, int64_t sequences);

  // Says, before run(), that the step's gradients will go unchanged into update(lr, max_norm,
  // false): no exchange, no loss scaling in between. A runner may then start updating each
  // parameter as soon as its gradient is final. Only for the next run(); ignored by default.
  virtual void expect_update(double lr, double max_norm) {}

  // fp16's loss scaling (loss_scaler.h), said before run() or begin_accumulation(): the next
  // step's gradients, made from losses multiplied by the loss scale, are multiplied by `factor`
  // (1 / that scale) before anything reads them after the passes (gradients_finite(),
  // visit_gradients(), update()). A runner that keeps gradients elsewhere may do it as each
  // becomes final, where it is in memory anyway. Only for the next step; not with expect_update().
  // By default a runner does not scale losses (Error).
  virtual void unscale_next_step(double factor);
  // Whether every gradient of the step is finite (unscaled first, as above): after the passes,
  // this peer's own; after an exchange, what the exchange left. fp16 skips a step whose
  // gradients overflowed. Waits for the device. Error by default, as above.
  virtual bool gradients_finite();

  // Clips the step's gradients to a global norm of `max_norm` (0 = off) and, unless `skip`,
  // applies the optimizer with learning rate `lr`. Returns the norm before clipping (0-dim fp32 on
  // the model's device; nothing waits for it).
  virtual at::Tensor update(double lr, double max_norm, bool skip) = 0;

  // The step's gradients for an exchange between replicas, after the passes and before update():
  // `visit` is called on pieces of the parameters (ParamStore indices, ascending within a piece,
  // each parameter in exactly one piece, the same pieces on every call), with the piece's
  // gradients resident in the parameters' .grad() while it runs (a missing gradient is made as
  // zeros first). It may change them in place; update() uses what it leaves. The local runner
  // visits every parameter in one piece; a runner that keeps gradients elsewhere brings them in a
  // piece at a time, so an exchange needs no more memory than the runner's budget.
  using GradientVisitor = std::function<void(std::span<const int> params)>;
  virtual void visit_gradients(const GradientVisitor& visit) = 0;
  // The same, in the pieces every runner can visit: one per node, by the node that reads each
  // parameter first (graph::OpDag::params_by_first_reader), the pieces a swapping runner visits
  // anyway. Peers whose runners differ (one swapped, one not) exchange in these, so that every
  // collective has the same size on all of them. By default the runner's own pieces, for a
  // runner that holds no whole model (a pipeline stage, whose counterparts run the same kind).
  virtual void visit_gradients_by_node(const GradientVisitor& visit) { visit_gradients(visit); }

  // The parameters this runner trains when it trains only part of the model (a pipeline stage's:
  // the ones visit_gradients visits); nullopt = all of them. A strategy averages and transfers
  // only these. The first `counted` count in model-wide sums such as a norm; the rest are counted
  // by another part (a weight tied to another stage's, which that stage counts).
  struct ModelPart {
    std::vector<int> params;  // ParamStore indices
    size_t counted = 0;
  };
  virtual std::optional<ModelPart> trained_params() const { return std::nullopt; }
  // Adds up `t` (a small float tensor) over the peers that hold the other parts of the model (a
  // pipeline's other stages), in place; nothing to do for a runner that holds all of it. Every
  // part calls it at the same point.
  virtual void sum_over_model(at::Tensor& /*t*/) {}

  // Makes every weight readable in full (sampling); a runner that keeps weights elsewhere brings
  // them in here.
  virtual void gather_weights() {}
  // The values of one weight or optimizer tensor, for a checkpoint or a state transfer that reads
  // them one at a time (SaveOptions::read_state): `t` itself, or, where the runner keeps it
  // elsewhere, a temporary copy of the same shape. Any other tensor comes back as it is.
  virtual at::Tensor read_state(const at::Tensor& t) { return t; }
  // Gives one weight or optimizer tensor new values (`values`: as many elements, any shape, any
  // device), for a state transfer that writes them one at a time: copied into `t`, or where the
  // runner keeps it elsewhere, stored there without bringing the rest of the state in.
  virtual void write_state(const at::Tensor& t, const at::Tensor& values) { copy_state(t, values); }
  // Takes a tensor of a strategy's own state beside the replica (diloco's anchor and outer
  // momentum, one tensor per parameter: whole, contiguous, fp32, on the model's device) into the
  // runner's keeping, wherever the runner keeps the replica's state, with `values` (as many
  // elements, any shape or device; undefined: zeros). A swapped runner writes the values to its
  // tier (zeros are not written) and empties the tensor's storage without reading or writing it,
  // so a tensor fresh from at::empty never occupies memory. read_state() and write_state() then
  // reach it as they reach a weight, and so do checkpoints and state transfers. Returns whether
  // the runner took it; the default leaves it in memory, untouched (false).
  virtual bool keep_state(const at::Tensor& /*t*/, const at::Tensor& /*values*/) { return false; }
  // The replica adopted the swarm's step `step` (a joiner, or a peer that fell behind): a runner
  // whose peers must draw the same batches as it does (a pipeline's stages) moves its loader to
  // where a run that started at step 0 is before drawing step `step`'s micro-batches.
  virtual void align(int64_t /*step*/) {}
  // The loader whose share of the data a swarm may deal again when its peers change
  // (data::TokenLoader::redeal); nullptr when this runner's batches must not move (a pipeline
  // stage, whose batches its other stages draw alike).
  virtual data::TokenLoader* dealt_loader() { return nullptr; }

  // Admitting waiting peers (a replacement pipeline, strategy/pipeline_admission.h) at one step
  // across the swarm: whether this runner, and every part of the model with it, sees peers waiting
  // that can be admitted now. A strategy counts the votes in its round agreement; when every
  // participant voted yes, each calls admit_waiting() before its next collective.
  virtual bool admission_ready() const { return false; }
  virtual void admit_waiting() {}

  // The loss of one evaluation batch ([inputs, targets] on the model's device) without training,
  // 0-dim on the model's device. By default `executor` runs the whole model here; a pipeline
  // stage runs its part with the other stages, and every stage returns the loss.
  virtual at::Tensor evaluation_loss(graph::Executor& executor,
                                     const std::vector<at::Tensor>& batch);

  // What a runner that itself talks to other peers (a pipeline stage) reports about that
  // traffic, for the progress line and the launcher when no strategy reports; none by default.
  virtual std::optional<StrategyReport> network_report() const { return std::nullopt; }

  // One line on how the run went (what moved where), printed when training ends; "" for none.
  virtual std::string report() const { return ""; }
};

// The batch as the model's [inputs, targets] on `device` (through pinned memory to a GPU, so the
// host does not wait for the copy).
std::vector<at::Tensor> to_device(const data::Batch& batch, const c10::Device& device);

// Every micro-batch through one executor, on this machine's device, from one loader.
class LocalStepRunner : public StepRunner {
 public:
  LocalStepRunner(graph::Executor& executor, graph::ParamStore& params, AdamW& optimizer,
                  data::TokenLoader& loader, c10::Device device);
  at::Tensor run(int64_t micro_batches, double loss_scale) override;
  void begin_accumulation() override;
  at::Tensor accumulate(double loss_scale, int64_t sequences) override;
  at::Tensor update(double lr, double max_norm, bool skip) override;
  void visit_gradients(const GradientVisitor& visit) override;
  void visit_gradients_by_node(const GradientVisitor& visit) override;
  void unscale_next_step(double factor) override { next_factor_ = factor; }
  bool gradients_finite() override;
  data::TokenLoader* dealt_loader() override { return &loader_; }

 private:
  void begin_step();  // gradients cleared; the step's unscaling (unscale_next_step) pending
  void unscale();     // multiplies the gradients by the step's factor, once

  graph::Executor& executor_;
  graph::ParamStore& params_;
  AdamW& optimizer_;
  data::TokenLoader& loader_;
  c10::Device device_;
  double next_factor_ = 1, step_factor_ = 1;  // 1: nothing to unscale
};

}  // namespace starling::train
