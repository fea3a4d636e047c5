// One stage of a pipeline across peers (FusionLLM's remote autodiff): the step runner that runs
// this peer's contiguous range of the model's nodes for every micro-batch, receiving the
// activations it reads from earlier stages and sending its outputs on, then, backward, receiving
// the gradients of its outputs and sending back those of its inputs. Tensors cross the swarm's
// point-to-point messages (encrypted like all traffic) in tensor_message.h's format, so nothing
// but tensors is shared between stages.
//
// A step: every stage draws the same micro-batches from its own loader (the first stage reads the
// tokens, the last the targets), runs them in the configured order (GPipe: all forwards, then all
// backwards; 1F1B: after a warm-up of stages - 1 - stage forwards, one forward and one backward in
// turn), and the last stage sends the step's mean loss to the others. update() adds up the
// gradients of parameters several stages read (tied embeddings), clips to the global norm over
// all stages (each parameter counted once), and steps this stage's parameters. The result is
// single-process training of the same batch up to fp32 rounding.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "starling/compress/ada_topk.h"
#include "starling/compress/topk.h"
#include "starling/net/node.h"
#include "starling/strategy/pipeline_layout.h"
#include "starling/strategy/tensor_message.h"
#include "starling/train/step_runner.h"

namespace starling::data {
class TokenLoader;
}
namespace starling::train {
class AdamW;
}

namespace starling::strategy {

class PipelineAdmission;

struct PipelineRunnerOptions {
  int stage = 0;                   // the stage this peer runs
  std::vector<net::PeerId> peers;  // the peer running each stage
  bool one_f_one_b = true;         // "1f1b" (true) or "gpipe"
  int64_t extra_warmup = 0;        // 1f1b: forwards ahead beyond stages - 1 - stage (not last)
  int64_t batch = 1, seq_len = 1;  // a micro-batch's shape (for checking what arrives)
  c10::ScalarType autocast = c10::ScalarType::Float;
  int64_t micro_batches = 1;  // per step (train.grad_accum): where align() moves the loader
  // What crosses the links in training (pipeline.compression and its keys): "none", "int8",
  // "int4", "topk" or "adatopk".
  std::string compression = "none";
  double topk_ratio = 0.1, adatopk_min_ratio = 0.01, adatopk_topk_beyond = 2.0;
  std::string compress_activations = "int8";  // "int8", "topk" or "none"
  bool error_feedback = true;
  // With replicas: this stage's part in admitting a waiting pipeline (pipeline_admission.h).
  PipelineAdmission* admission = nullptr;
};

class PipelineStepRunner : public train::StepRunner {
 public:
  PipelineStepRunner(net::Node& node, PipelineLayout layout, PipelineRunnerOptions options,
                     graph::Executor& executor, graph::OpDag& dag, train::AdamW& optimizer,
                     data::TokenLoader& loader, c10::Device device);

  at::Tensor run(int64_t micro_batches, double loss_scale) override;
  at::Tensor update(double lr, double max_norm, bool skip) override;
  // This stage's parameters, in one piece (for an exchange with its counterparts in other
  // pipeline replicas).
  void visit_gradients(const GradientVisitor& visit) override;
  // This stage's parameters, a tied one last unless this stage counts it in the norm.
  std::optional<ModelPart> trained_params() const override;
  // Sums over the stages of this pipeline.
  void sum_over_model(at::Tensor& t) override;
  at::Tensor evaluation_loss(graph::Executor& executor,
                             const std::vector<at::Tensor>& batch) override;
  // Stages in the pipeline, bytes this peer sent, time spent waiting for other stages.
  std::optional<train::StrategyReport> network_report() const override;
  std::string report() const override;
  // Moves the loader to `step` (every stage of a pipeline that adopted a step draws the same
  // micro-batches from it on).
  void align(int64_t step) override;
  // Whether every stage of this pipeline voted, in the last step's sum, that a waiting pipeline
  // can be admitted; admit_waiting() admits this stage's waiting counterparts.
  bool admission_ready() const override { return admission_ready_; }
  void admit_waiting() override;
  // After a strategy's round: the copies of each shared parameter on the stages that read it are
  // compared by checksum, and where they differ in any bit the first stage's copy replaces the
  // others (shared_copies.h says why they can). Every stage that reads a shared parameter must
  // call it at the same step.
  void align_shared_copies();

 private:
  struct InFlight;  // one micro-batch between its forward and its backward
  // `training` false (evaluation): no autograd graph, and the micro-batch cannot run backward.
  void forward(InFlight& f, const std::vector<at::Tensor>& batch, bool training);
  void backward(InFlight& f, double seed);
  // Sends `t` whole, or its top entries while training with compression. The transfer completes
  // once the node has queued the message for the wire.
  net::Transfer send(int stage, const TensorLabel& label, const at::Tensor& t);
  net::Transfer post(int stage, TensorKind kind, int node);
  // Waits for a posted receive; with adatopk also for its mark, and measures the link's rate.
  at::Tensor receive(net::Transfer& t, int stage, const TensorExpectation& expect);
  // adatopk: a tiny message sent just before each tensor, so the receiver can time the tensor's
  // own transfer (from the mark's arrival to the tensor's) and tell the sender the link's rate.
  bool marked(TensorKind kind) const;
  // After a step's sums: the fraction of entries the next step keeps, and what it quantizes.
  void choose_keep_ratio(const std::vector<double>& compute_per_micro_batch);
  // "topk", "int8" and "int4": the same compression every step.
  void fixed_compression();
  // What crosses the link to `stage` this step.
  const compress::StageCompression& compression_to(int stage) const;
  // The report's figures over the links' choices: the least keep ratio, whether any quantizes.
  void summarize(const std::vector<compress::StageCompression>& links);
  // Entries this stage sends per micro-batch to each other stage: activations forward, gradients
  // back.
  std::map<int, std::pair<double, double>> entries_sent_per_micro_batch() const;
  // The step's mean loss: the last stage sends it to the others, which receive it.
  at::Tensor share_loss(const at::Tensor& loss);
  std::vector<int64_t> shape_of(int node) const;
  std::string peer_name(int stage) const;
  // " (stage 1 (peer ab12cd34) is gone; stage 2 (peer 5df613e6) left)": the stages whose peers
  // the membership counts as dead, then those that left. Waits up to 10 s for a dead one to show
  // (a stage that left usually did so because another died); "" when all stay alive.
  std::string gone_stages() const;
  // Sums a tensor over the peers of `stages` (a collective on the stages' group); NetError when
  // one of them is gone or did not take part.
  void all_reduce(at::Tensor& t, const std::vector<int>& stages, uint64_t tag);

  net::Node& node_;
  PipelineLayout layout_;
  PipelineRunnerOptions options_;
  graph::Executor& executor_;
  graph::OpDag& dag_;
  train::AdamW& optimizer_;
  data::TokenLoader& loader_;
  c10::Device device_;
  std::vector<c10::ScalarType> dtypes_;  // what activations and gradients may arrive as
  std::vector<int> own_;                 // ParamStore indices of this stage's parameters, ascending
  std::vector<bool> counted_;            // per own_ entry: this stage counts it in model-wide sums
  int64_t round_ = 0;                    // steps and evaluation batches so far (message labels)
  uint64_t bytes_sent_ = 0;
  double wait_s_ = 0;     // receiving from other stages
  double compute_s_ = 0;  // this stage's forward and backward
  int64_t steps_ = 0;
  bool admission_ready_ = false;
  int64_t aligned_ = 0;  // shared copies align_shared_copies() found apart and realigned
  // Compression.
  bool training_ = false;                               // inside run(): compression applies
  compress::StageCompression fixed_;                    // "topk", "int8", "int4": every link alike
  std::map<int, compress::StageCompression> per_link_;  // "adatopk": per destination stage
  // Over the links, for reports: the least fraction of entries sent, and whether any link
  // quantizes activations or gradients this step.
  double keep_ratio_ = 1.0;
  bool quantize_activations_ = false;
  bool quantize_gradients_ = false;
  bool int4_activations_ = false;
  bool int4_gradients_ = false;
  compress::ErrorFeedback feedback_;  // per (reader stage, node) activation gradient
  uint64_t whole_bytes_ = 0;          // what bytes_sent_ would be without compression
  double step_compute_s_ = 0;         // this step's forward and backward time
  std::map<std::pair<int, uint64_t>, std::deque<net::Transfer>> marks_;  // (stage, tag)
  std::map<int, double> measured_mbit_;  // per sending stage: its link to this one (average)
};

}  // namespace starling::strategy
