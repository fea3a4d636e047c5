#include "starling/strategy/pipeline_runner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <utility>

#include "starling/common/error.h"
#include "starling/compress/ada_topk.h"
#include "starling/compress/wire_codec.h"
#include "starling/data/loader.h"
#include "starling/graph/param_store.h"
#include "starling/strategy/pipeline_admission.h"
#include "starling/strategy/shared_copies.h"
#include "starling/train/adamw.h"
#include "starling/train/metrics.h"

namespace starling::strategy {
namespace {

// Message tags: one per (kind, producer node); messages of one tag from one peer arrive in the
// order they were sent, and every stage sends and receives micro-batches in the same order.
constexpr uint64_t kMessageTag = 0x7069706500000000;     // "pipe"
constexpr uint64_t kCollectiveTag = 0x7069706300000000;  // "pipc"
constexpr uint64_t kNormTag = kCollectiveTag | 0xffffffff;
constexpr uint64_t kModelSumTag = kCollectiveTag | 0xfffffffe;  // sums a strategy asks for
// Aligning the copies of a shared parameter: its checksums, then (if they differ) its value.
constexpr uint64_t kAlignTag = 0x7069706100000000;  // "pipa"
constexpr uint64_t kAlignValueBit = uint64_t{1} << 31;

uint64_t tag_of(TensorKind kind, int node) {
  return kMessageTag | (static_cast<uint64_t>(kind) << 24) | static_cast<uint64_t>(node);
}
constexpr uint64_t kMarkBit = uint64_t{1} << 23;  // above any node index

// Tensors smaller than this cross whole: their index overhead and top-k cost buy nothing.
constexpr int64_t kMinCompressed = 1024;
// A transfer shorter than this says more about latency than about the link's rate.
constexpr size_t kMinTimedBytes = 16 * 1024;

}  // namespace

struct PipelineStepRunner::InFlight {
  int32_t index = 0;
  graph::MicroBatch mb;
  std::map<int, net::Transfer> activations;                // producer -> its receive
  std::map<std::pair<int, int>, net::Transfer> gradients;  // (output, reader stage) -> receive
  at::Tensor loss;                                         // last stage: this micro-batch's loss
};

PipelineStepRunner::PipelineStepRunner(net::Node& node, PipelineLayout layout,
                                       PipelineRunnerOptions options, graph::Executor& executor,
                                       graph::OpDag& dag, train::AdamW& optimizer,
                                       data::TokenLoader& loader, c10::Device device)
    : node_(node),
      layout_(std::move(layout)),
      options_(std::move(options)),
      executor_(executor),
      dag_(dag),
      optimizer_(optimizer),
      loader_(loader),
      device_(device) {
  if (static_cast<int>(options_.peers.size()) != layout_.stages())
    throw std::invalid_argument("PipelineStepRunner: one peer per stage");
  dtypes_ = {c10::ScalarType::Float};
  if (options_.autocast != c10::ScalarType::Float) dtypes_.push_back(options_.autocast);
  // This stage's parameters as ParamStore indices, in the store's order (the order every
  // counterpart in another replica uses too).
  const auto& held = dag_.params().params();
  for (const std::string& name : layout_.stage(options_.stage).params) {
    if (!dag_.params().contains(name))
      throw std::invalid_argument("PipelineStepRunner: stage " + std::to_string(options_.stage) +
                                  " reads parameter " + name + ", which this peer does not hold");
    const auto it = std::find_if(held.begin(), held.end(),
                                 [&](const graph::Param& p) { return p.name == name; });
    own_.push_back(static_cast<int>(it - held.begin()));
  }
  std::sort(own_.begin(), own_.end());
  for (const int p : own_)
    counted_.push_back(layout_.counts_in_norm(options_.stage, held[static_cast<size_t>(p)].name));
}

std::vector<int64_t> PipelineStepRunner::shape_of(int node) const {
  return dag_.nodes()
      .at(static_cast<size_t>(node))
      .op->output_shape(options_.batch, options_.seq_len);
}

std::string PipelineStepRunner::peer_name(int stage) const {
  return "stage " + std::to_string(stage) + " (peer " +
         net::short_peer_id(options_.peers.at(static_cast<size_t>(stage))) + ")";
}

bool PipelineStepRunner::marked(TensorKind kind) const {
  return options_.compression == "adatopk" && kind != TensorKind::loss;
}

net::Transfer PipelineStepRunner::send(int stage, const TensorLabel& label, const at::Tensor& t) {
  std::vector<uint8_t> bytes;
  const bool compressible = training_ && options_.compression != "none" &&
                            label.kind != TensorKind::loss && t.numel() >= kMinCompressed;
  const bool activation = label.kind == TensorKind::activation;
  const std::string& acts = options_.compress_activations;
  const size_t whole = encoded_tensor_bytes(t);
  const compress::StageCompression& c = compression_to(stage);
  const bool quantized = activation ? c.int8_activations : c.int8_gradients;
  const bool int4 = activation ? c.int4_activations : c.int4_gradients;
  if (compressible && int4) {
    bytes = encode_int4_tensor(label, t);
  } else if (compressible && quantized) {
    bytes = encode_int8_tensor(label, t);
  } else if (compressible && c.keep_ratio < 1.0 && (!activation || acts == "topk")) {
    const int64_t k = compress::kept_entries(t.numel(), c.keep_ratio);
    const compress::TopK kept =
        label.kind == TensorKind::gradient && options_.error_feedback
            ? feedback_.compress(
                  (static_cast<uint64_t>(stage) << 32) | static_cast<uint32_t>(label.node), t, k)
            : compress::top_k(t, k);
    bytes = encode_sparse_tensor(label, t.sizes(), kept);
  } else {
    bytes = encode_tensor(label, t);
  }
  bytes_sent_ += bytes.size();
  whole_bytes_ += whole;
  const net::PeerId peer = options_.peers.at(static_cast<size_t>(stage));
  const uint64_t tag = tag_of(label.kind, label.node);
  if (marked(label.kind)) node_.send(peer, tag | kMarkBit, {0});
  // A send completes once queued: the bytes go out while this stage computes on. It fails at
  // once when the peer is gone; the receive that waits for its answer then names it too.
  return node_.send(peer, tag, std::move(bytes));
}

net::Transfer PipelineStepRunner::post(int stage, TensorKind kind, int node) {
  const net::PeerId peer = options_.peers.at(static_cast<size_t>(stage));
  const uint64_t tag = tag_of(kind, node);
  if (marked(kind)) marks_[{stage, tag}].push_back(node_.recv(peer, tag | kMarkBit));
  return node_.recv(peer, tag);
}

at::Tensor PipelineStepRunner::receive(net::Transfer& t, int stage,
                                       const TensorExpectation& expect) {
  const double t0 = train::now_s();
  std::vector<uint8_t> bytes;
  try {
    bytes = t.wait();
  } catch (const NetError& e) {
    throw NetError("pipeline stage " + std::to_string(options_.stage) + ": waiting for the " +
                   tensor_kind_name(expect.label.kind) + " of node " +
                   std::to_string(expect.label.node) + " from " + peer_name(stage) + ": " +
                   e.what());
  }
  wait_s_ += train::now_s() - t0;
  if (marked(expect.label.kind)) {
    // Messages of one tag are received in the order they were posted, marks likewise.
    auto& queue = marks_[{stage, tag_of(expect.label.kind, expect.label.node)}];
    if (!queue.empty()) {
      net::Transfer mark = std::move(queue.front());
      queue.pop_front();
      // The mark left just before the tensor, on the same connection, so it is here.
      if (mark.wait_for(std::chrono::milliseconds(0)) && bytes.size() >= kMinTimedBytes) {
        const double dt =
            std::chrono::duration<double>(t.finished_at() - mark.finished_at()).count();
        if (dt > 0) {
          const double mbit = static_cast<double>(bytes.size()) * 8 / dt / 1e6;
          auto [it, fresh] = measured_mbit_.emplace(stage, mbit);
          if (!fresh) it->second = 0.7 * it->second + 0.3 * mbit;
          node_.note_link_rate(options_.peers.at(static_cast<size_t>(stage)), it->second);
        }
      }
    }
  }
  return decode_tensor(bytes, expect, peer_name(stage)).to(device_);
}

void PipelineStepRunner::fixed_compression() {
  if (options_.compression == "topk") {
    fixed_ = {.int8_activations = options_.compress_activations == "int8",
              .keep_ratio = options_.topk_ratio};
  } else if (options_.compression == "int8") {
    fixed_ = {.int8_activations = true, .int8_gradients = true};
  } else if (options_.compression == "int4") {
    fixed_ = {.int4_activations = true, .int4_gradients = true};
  }
  summarize({fixed_});
}

const compress::StageCompression& PipelineStepRunner::compression_to(int stage) const {
  static const compress::StageCompression whole;
  if (options_.compression != "adatopk") return fixed_;
  const auto it = per_link_.find(stage);
  return it == per_link_.end() ? whole : it->second;
}

void PipelineStepRunner::summarize(const std::vector<compress::StageCompression>& links) {
  keep_ratio_ = 1.0;
  quantize_activations_ = quantize_gradients_ = false;
  int4_activations_ = int4_gradients_ = false;
  for (const auto& c : links) {
    keep_ratio_ = std::min(keep_ratio_, c.keep_ratio);
    quantize_activations_ = quantize_activations_ || c.int8_activations;
    quantize_gradients_ = quantize_gradients_ || c.int8_gradients;
    int4_activations_ = int4_activations_ || c.int4_activations;
    int4_gradients_ = int4_gradients_ || c.int4_gradients;
  }
}

std::map<int, std::pair<double, double>> PipelineStepRunner::entries_sent_per_micro_batch() const {
  const StageLayout& st = layout_.stage(options_.stage);
  std::map<int, std::pair<double, double>> to;
  const auto numel = [&](int node) {
    double e = 1;
    for (const int64_t d : shape_of(node)) e *= static_cast<double>(d);
    return e;
  };
  for (const auto& [node, readers] : st.sends)
    if (node != layout_.loss_node())
      for (const int r : readers) to[r].first += numel(node);
  for (const auto& [producer, from] : st.receives) to[from].second += numel(producer);
  return to;
}

void PipelineStepRunner::choose_keep_ratio(const std::vector<double>& compute_per_micro_batch) {
  if (options_.compression == "topk" || options_.compression == "int8" ||
      options_.compression == "int4") {
    fixed_compression();
    return;
  }
  if (options_.compression != "adatopk") return;
  const double critical =
      compute_per_micro_batch.empty()
          ? 0
          : *std::max_element(compute_per_micro_batch.begin(), compute_per_micro_batch.end());
  // Per link, as its receiver measured it: what this stage sends each other stage must cross
  // that stage's link within the slowest stage's compute time, and is compressed only as much as
  // that needs (a fast link of a stage whose other link is slow stays whole).
  per_link_.clear();
  std::vector<compress::StageCompression> chosen;
  for (const auto& [stage, entries] : entries_sent_per_micro_batch()) {
    const net::PeerId peer = options_.peers.at(static_cast<size_t>(stage));
    double rate = -1;
    for (const net::LinkView& l : node_.links())
      if (l.from == node_.id() && l.to == peer && l.stats.mbit_per_s > 0) rate = l.stats.mbit_per_s;
    const auto [activations, gradients] = entries;
    compress::StageCompression c;
    if (options_.compress_activations == "topk")
      c.keep_ratio = compress::adaptive_keep_ratio(
          {.seconds = critical, .mbit_per_s = rate, .elements = activations + gradients},
          options_.adatopk_min_ratio);
    else
      c = compress::adaptive_compression(critical, rate, activations, gradients,
                                         options_.compress_activations == "int8",
                                         options_.adatopk_min_ratio, options_.adatopk_topk_beyond);
    per_link_[stage] = c;
    chosen.push_back(c);
  }
  summarize(chosen);
}

void PipelineStepRunner::forward(InFlight& f, const std::vector<at::Tensor>& batch, bool training) {
  const StageLayout& st = layout_.stage(options_.stage);
  graph::EdgeTensors incoming;
  for (const auto& [producer, from] : st.receives)
    incoming[producer] = receive(f.activations.at(producer), from,
                                 {.label = {TensorKind::activation, round_, f.index, producer},
                                  .shape = shape_of(producer),
                                  .dtypes = dtypes_});
  const double t0 = train::now_s();
  f.mb = executor_.forward_stage(batch, st.range, incoming, /*for_backward=*/training);
  compute_s_ += train::now_s() - t0;
  if (training) step_compute_s_ += train::now_s() - t0;
  for (const auto& [node, t] : f.mb.outputs()) {
    if (node == layout_.loss_node()) {
      f.loss = t;
      continue;
    }
    for (const int to : st.sends.at(node))
      send(to, {TensorKind::activation, round_, f.index, node}, t);
  }
}

void PipelineStepRunner::backward(InFlight& f, double seed) {
  const StageLayout& st = layout_.stage(options_.stage);
  graph::EdgeTensors output_grads;
  if (f.loss.defined()) output_grads[layout_.loss_node()] = at::full({}, seed, f.loss.options());
  for (const auto& [node, readers] : st.sends) {
    at::Tensor sum;
    for (const int r : readers) {
      at::Tensor g = receive(f.gradients.at({node, r}), r,
                             {.label = {TensorKind::gradient, round_, f.index, node},
                              .shape = shape_of(node),
                              .dtypes = dtypes_});
      sum = sum.defined() ? sum + g : g;
    }
    output_grads[node] = sum;
  }
  const double t0 = train::now_s();
  graph::EdgeTensors input_grads = executor_.backward_stage(f.mb, output_grads);
  compute_s_ += train::now_s() - t0;
  step_compute_s_ += train::now_s() - t0;
  f.mb = graph::MicroBatch();  // frees the activations
  for (const auto& [producer, from] : st.receives) {
    auto it = input_grads.find(producer);
    // No gradient flowed to this input: its producer adds zeros, as a local backward would.
    const at::Tensor g =
        it != input_grads.end() && it->second.defined()
            ? it->second
            : at::zeros(shape_of(producer), at::TensorOptions(device_).dtype(at::kFloat));
    send(from, {TensorKind::gradient, round_, f.index, producer}, g);
  }
}

at::Tensor PipelineStepRunner::share_loss(const at::Tensor& loss) {
  const int last = layout_.stages() - 1;
  const TensorLabel label{TensorKind::loss, round_, 0, layout_.loss_node()};
  if (options_.stage == last) {
    std::vector<net::Transfer> sent;
    for (int s = 0; s < last; ++s) sent.push_back(send(s, label, loss.to(at::kFloat)));
    // The loss can be the last thing this stage sends before it leaves the swarm (after the final
    // evaluation): a message still waiting for the node's thread when it stops would be dropped,
    // and the other stages would wait for it in vain.
    for (auto& t : sent) t.wait();
    return loss;
  }
  net::Transfer t = post(last, TensorKind::loss, layout_.loss_node());
  return receive(t, last, {.label = label, .shape = {}, .dtypes = {c10::ScalarType::Float}});
}

at::Tensor PipelineStepRunner::run(int64_t micro_batches, double loss_scale) {
  const StageLayout& st = layout_.stage(options_.stage);
  dag_.params().zero_grad();
  const auto m_count = static_cast<int32_t>(micro_batches);
  // Every receive of the step is posted up front, so messages land in their buffers as they
  // arrive while this stage computes.
  std::vector<InFlight> f(static_cast<size_t>(m_count));
  for (int32_t m = 0; m < m_count; ++m) {
    f[static_cast<size_t>(m)].index = m;
    for (const auto& [producer, from] : st.receives)
      f[static_cast<size_t>(m)].activations.emplace(producer,
                                                    post(from, TensorKind::activation, producer));
    for (const auto& [node, readers] : st.sends)
      for (const int r : readers)
        f[static_cast<size_t>(m)].gradients.emplace(std::pair{node, r},
                                                    post(r, TensorKind::gradient, node));
  }
  const double seed = loss_scale / static_cast<double>(micro_batches);
  // Compression applies to this step's tensors only (not to the loss, nor to evaluation), also
  // when a receive throws.
  training_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{training_};
  if (steps_ == 0) fixed_compression();
  at::Tensor loss_sum;
  auto fwd = [&](int32_t m) {
    InFlight& x = f[static_cast<size_t>(m)];
    forward(x, train::to_device(loader_.next(), device_), true);
    if (x.loss.defined()) loss_sum = loss_sum.defined() ? loss_sum + x.loss : x.loss;
  };
  auto bwd = [&](int32_t m) { backward(f[static_cast<size_t>(m)], seed); };
  if (!options_.one_f_one_b) {
    for (int32_t m = 0; m < m_count; ++m) fwd(m);
    for (int32_t m = 0; m < m_count; ++m) bwd(m);
  } else {
    // Stage s runs stages - 1 - s forwards ahead, then alternates, so at most that many
    // micro-batches' activations are held at once (one on the last stage).
    // Every stage but the last may run extra_warmup more ahead: the warm-ups still fall from
    // stage to stage, so no stage waits for a forward its predecessor holds back.
    const int64_t extra = options_.stage < layout_.stages() - 1 ? options_.extra_warmup : 0;
    const auto warm = static_cast<int32_t>(
        std::min<int64_t>(layout_.stages() - 1 - options_.stage + extra, m_count));
    for (int32_t m = 0; m < warm; ++m) fwd(m);
    for (int32_t m = warm; m < m_count; ++m) {
      fwd(m);
      bwd(m - warm);
    }
    for (int32_t m = m_count - warm; m < m_count; ++m) bwd(m);
  }
  const at::Tensor loss =
      share_loss(loss_sum.defined() ? loss_sum / static_cast<double>(micro_batches) : loss_sum);
  ++round_;
  ++steps_;
  return loss;
}

std::string PipelineStepRunner::gone_stages() const {
  // A ring collective reports the neighbour it stopped hearing from, which need not be the peer
  // that died; the membership says which one did, once its timeout has passed. A stage that left
  // cleanly most often left because another died (a killed process is only declared dead after
  // the timeout), so its leave alone is not the answer: wait for a dead stage, and name the
  // stages that left too.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    std::string dead, left;
    const auto members = node_.members();
    for (int s = 0; s < layout_.stages(); ++s) {
      const net::PeerId id = options_.peers[static_cast<size_t>(s)];
      const auto it = std::find_if(members.begin(), members.end(),
                                   [&](const net::MemberView& m) { return m.info.id == id; });
      if (it == members.end() || it->state == net::MemberState::dead)
        dead += (dead.empty() ? "" : ", ") + peer_name(s);
      else if (it->state == net::MemberState::left)
        left += (left.empty() ? "" : ", ") + peer_name(s);
    }
    const bool late = std::chrono::steady_clock::now() > deadline;
    if (!dead.empty() || (late && !left.empty())) {
      std::string says = dead.empty() ? "" : dead + " is gone";
      if (!left.empty()) says += (says.empty() ? "" : "; ") + left + " left";
      return " (" + says + ")";
    }
    if (late) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void PipelineStepRunner::all_reduce(at::Tensor& t, const std::vector<int>& stages, uint64_t tag) {
  net::CollectiveOptions o;
  o.op = net::ReduceOp::sum;
  o.order = net::RingOrder::by_id;
  o.tag = tag;
  for (const int s : stages) o.group.push_back(options_.peers.at(static_cast<size_t>(s)));
  at::Tensor host = t.to(at::kCPU, at::kFloat).contiguous();
  const double t0 = train::now_s();
  net::CollectiveResult result;
  try {
    result = node_
                 .all_reduce(
                     std::span<float>(host.data_ptr<float>(), static_cast<size_t>(host.numel())), o)
                 .wait();
  } catch (const NetError& e) {
    throw NetError("pipeline stage " + std::to_string(options_.stage) +
                   ": summing across stages failed" + gone_stages() + ": " + e.what());
  }
  // A stage the membership no longer counts (dead, or not yet active) is left out of a sum; a
  // pipeline's sum without one of its stages is wrong, never a result.
  if (result.ring.size() != o.group.size()) {
    std::string missing;
    for (const int s : stages)
      if (std::find(result.ring.begin(), result.ring.end(),
                    options_.peers.at(static_cast<size_t>(s))) == result.ring.end())
        missing += (missing.empty() ? "" : ", ") + peer_name(s);
    throw NetError("pipeline stage " + std::to_string(options_.stage) + ": " + missing +
                   " took no part in a sum across stages" + gone_stages());
  }
  wait_s_ += train::now_s() - t0;
  if (!host.is_same(t)) t.copy_(host);
}

at::Tensor PipelineStepRunner::update(double lr, double max_norm, bool skip) {
  at::NoGradGuard no_grad;
  auto& params = dag_.params().params();
  // Parameters several stages read (a tied embedding and head): each holds its readers' part of
  // the gradient, and every one of those stages needs the sum to step its copy the same way.
  for (const SharedParam& sp : layout_.shared()) {
    if (std::find(sp.stages.begin(), sp.stages.end(), options_.stage) == sp.stages.end()) continue;
    at::Tensor& value = dag_.params().get(sp.name).value;
    if (!value.grad().defined()) value.mutable_grad() = at::zeros_like(value);
    at::Tensor g = value.grad();
    all_reduce(g, sp.stages, kCollectiveTag | static_cast<uint64_t>(sp.id));
  }
  // The global norm: each stage's sum of squares over the parameters it counts, added up; and,
  // in the same sum, each stage's vote to admit a waiting pipeline.
  at::Tensor sumsq = at::zeros({1}, at::TensorOptions(device_).dtype(at::kFloat));
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < own_.size(); ++i) {
    const at::Tensor& g = params[static_cast<size_t>(own_[i])].value.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (counted_[i]) sumsq += g.to(at::kFloat).pow(2).sum();
  }
  // And each stage's compute time per micro-batch of this step, in its own slot (AdaTopK sizes
  // what crosses the links by the slowest of them).
  const int stages = layout_.stages();
  const bool vote = options_.admission != nullptr && options_.admission->vote();
  at::Tensor extra = at::zeros({1 + stages}, at::kFloat);
  extra[0] = vote ? 1.f : 0.f;
  extra[1 + options_.stage] =
      static_cast<float>(step_compute_s_ / static_cast<double>(options_.micro_batches));
  step_compute_s_ = 0;
  at::Tensor summed = at::cat({sumsq.to(at::kCPU), extra});
  std::vector<int> all(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) all[static_cast<size_t>(s)] = s;
  all_reduce(summed, all, kNormTag);
  admission_ready_ = summed[1].item<float>() == static_cast<float>(stages);
  std::vector<double> compute(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) compute[static_cast<size_t>(s)] = summed[2 + s].item<float>();
  choose_keep_ratio(compute);
  const at::Tensor total = summed.narrow(0, 0, 1).to(device_).sqrt().reshape({});
  if (max_norm > 0) {
    const at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    for (auto& g : grads) g.mul_(coef);
  }
  if (!skip) optimizer_.step(lr);
  return total;
}

void PipelineStepRunner::align(int64_t step) {
  loader_.seek(static_cast<uint64_t>(step * options_.micro_batches));
}

void PipelineStepRunner::admit_waiting() {
  if (options_.admission != nullptr) options_.admission->admit();
  admission_ready_ = false;
}

std::optional<train::StepRunner::ModelPart> PipelineStepRunner::trained_params() const {
  ModelPart part;
  for (size_t i = 0; i < own_.size(); ++i)
    if (counted_[i]) part.params.push_back(own_[i]);
  part.counted = part.params.size();
  for (size_t i = 0; i < own_.size(); ++i)
    if (!counted_[i]) part.params.push_back(own_[i]);
  return part;
}

void PipelineStepRunner::align_shared_copies() {
  at::NoGradGuard no_grad;
  const int stages = layout_.stages();
  for (const SharedParam& sp : layout_.shared()) {
    if (std::find(sp.stages.begin(), sp.stages.end(), options_.stage) == sp.stages.end()) continue;
    at::Tensor& value = dag_.params().get(sp.name).value;
    // The copy's checksum, sent in 16-bit halves (each exact in fp32) in this stage's own slots.
    const uint32_t checksum = copy_checksum(value);
    at::Tensor sums = at::zeros({stages * 2}, at::kFloat);
    for (int k = 0; k < 2; ++k)
      sums[options_.stage * 2 + k] = static_cast<float>((checksum >> (16 * k)) & 0xffff);
    all_reduce(sums, sp.stages, kAlignTag | static_cast<uint64_t>(sp.id));
    const at::Tensor first = sums.narrow(0, sp.stages.front() * 2, 2);
    bool equal = true;
    for (const int s : sp.stages) equal = equal && at::equal(sums.narrow(0, s * 2, 2), first);
    if (equal) continue;
    // The first stage's copy, to all: the others add zeros, which leaves its bits as they are.
    at::Tensor v =
        options_.stage == sp.stages.front() ? value.detach().clone() : at::zeros_like(value);
    all_reduce(v, sp.stages, kAlignTag | kAlignValueBit | static_cast<uint64_t>(sp.id));
    value.detach().copy_(v);
    ++aligned_;
  }
}

void PipelineStepRunner::sum_over_model(at::Tensor& t) {
  std::vector<int> all(static_cast<size_t>(layout_.stages()));
  for (int s = 0; s < layout_.stages(); ++s) all[static_cast<size_t>(s)] = s;
  all_reduce(t, all, kModelSumTag);
}

void PipelineStepRunner::visit_gradients(const GradientVisitor& visit) {
  for (const int p : own_) {
    at::Tensor& value = dag_.params().params()[static_cast<size_t>(p)].value;
    if (!value.grad().defined()) value.mutable_grad() = at::zeros_like(value);
  }
  visit(own_);
}

at::Tensor PipelineStepRunner::evaluation_loss(graph::Executor& /*executor*/,
                                               const std::vector<at::Tensor>& batch) {
  const StageLayout& st = layout_.stage(options_.stage);
  InFlight f;
  for (const auto& [producer, from] : st.receives)
    f.activations.emplace(producer, post(from, TensorKind::activation, producer));
  forward(f, batch, false);
  f.mb = graph::MicroBatch();
  const at::Tensor loss = share_loss(f.loss);
  ++round_;
  return loss;
}

std::optional<train::StrategyReport> PipelineStepRunner::network_report() const {
  train::StrategyReport r;
  r.peers = layout_.stages();
  r.bytes_sent = static_cast<double>(node_.bytes_sent());
  r.net_wait_s = wait_s_;
  r.round = steps_;
  r.figures["stage"] = options_.stage;
  r.figures["compute_s"] = compute_s_;
  r.figures["pipeline_bytes"] = static_cast<double>(bytes_sent_);
  r.figures["pipeline_whole_bytes"] = static_cast<double>(whole_bytes_);
  r.figures["keep_ratio"] = keep_ratio_;
  return r;
}

std::string PipelineStepRunner::report() const {
  const StageLayout& st = layout_.stage(options_.stage);
  const double busy = compute_s_ + wait_s_;
  return "pipeline stage " + std::to_string(options_.stage) + " of " +
         std::to_string(layout_.stages()) + " (nodes " + std::to_string(st.range.first) + "-" +
         std::to_string(st.range.last) + "): computed " + train::fmt("%.1f", compute_s_) +
         " s, waited for other stages " + train::fmt("%.1f", wait_s_) + " s (" +
         train::fmt("%.0f", busy > 0 ? 100 * wait_s_ / busy : 0.0) + "%), sent " +
         train::fmt("%.1f", static_cast<double>(bytes_sent_) / 1e6) + " MB over " +
         std::to_string(steps_) + " steps" +
         (options_.compression == "none"
              ? std::string()
              : " (" + options_.compression + ": " +
                    train::fmt("%.1f", static_cast<double>(whole_bytes_) / 1e6) + " MB whole, " +
                    train::fmt("%.1fx", whole_bytes_ > 0 && bytes_sent_ > 0
                                            ? static_cast<double>(whole_bytes_) /
                                                  static_cast<double>(bytes_sent_)
                                            : 1.0) +
                    "; at the end keeping " + train::fmt("%.1f", 100 * keep_ratio_) + "% of " +
                    (options_.compress_activations == "topk" ? "entries" : "gradient entries") +
                    (int4_activations_       ? ", activations int4"
                     : quantize_activations_ ? ", activations int8"
                                             : "") +
                    (int4_gradients_       ? ", gradients int4"
                     : quantize_gradients_ ? ", gradients int8"
                                           : "") +
                    ")") +
         (aligned_ > 0 ? "; realigned its shared weights' copies " + std::to_string(aligned_) +
                             " times after a round"
                       : std::string());
}

}  // namespace starling::strategy
