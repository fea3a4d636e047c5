#include "starling/model/build.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <set>
#include <stdexcept>

#include "starling/model/ops/attention.h"
#include "starling/model/ops/embedding.h"
#include "starling/model/ops/head.h"
#include "starling/model/ops/loss.h"
#include "starling/model/ops/mlp.h"
#include "starling/model/ops/norm.h"

namespace starling::model {
namespace {

// Creates parameters in a fixed order from one seeded generator, each where the placement says.
// A parameter the placement does not hold is only named; its draw is owed, and made (into scratch
// memory) before the next held parameter's, so every held value is the one the whole model gets.
class Initializer {
 public:
  Initializer(graph::ParamStore& store, uint64_t seed, const graph::Placement& placement)
      : store_(store),
        gen_(at::make_generator<at::CPUGeneratorImpl>(seed)),
        placement_(placement) {}

  std::string normal(const std::string& name, at::IntArrayRef shape, double std) {
    if (!placement_.holds(name)) {
      owed_.push_back({shape.vec(), std});
      store_.add_elsewhere(name);
      return name;
    }
    pay_owed_draws();
    at::Tensor t = at::empty(shape, at::kFloat);
    t.normal_(0.0, std, gen_);
    store_.add(name, t.to(placement_.device_of(name)), /*decay=*/true);
    return name;
  }
  std::string constant(const std::string& name, at::IntArrayRef shape, double value) {
    if (!placement_.holds(name)) {
      store_.add_elsewhere(name);
      return name;
    }
    // Norm gains and biases: no weight decay.
    store_.add(
        name,
        at::full(shape, value, at::TensorOptions(at::kFloat).device(placement_.device_of(name))),
        /*decay=*/false);
    return name;
  }

 private:
  struct Draw {
    std::vector<int64_t> shape;
    double std;
  };
  // The same draws into one reused buffer: a tensor of the same shape, contiguous, takes the same
  // numbers from the generator as the parameter would have.
  void pay_owed_draws() {
    for (const Draw& d : owed_) {
      int64_t n = 1;
      for (const int64_t k : d.shape) n *= k;
      if (scratch_.numel() < n) scratch_ = at::empty({n}, at::kFloat);
      scratch_.narrow(0, 0, n).view(d.shape).normal_(0.0, d.std, gen_);
    }
    owed_.clear();
  }

  graph::ParamStore& store_;
  at::Generator gen_;
  const graph::Placement& placement_;
  std::vector<Draw> owed_;
  at::Tensor scratch_ = at::empty({0}, at::kFloat);
};

// Holds the named parameters on one device, and no others.
class HoldsOnly final : public graph::Placement {
 public:
  HoldsOnly(c10::Device device, std::set<std::string> names)
      : device_(device), names_(std::move(names)) {}
  c10::Device device_of(const std::string&) const override { return device_; }
  bool holds(const std::string& name) const override { return names_.count(name) > 0; }

 private:
  c10::Device device_;
  std::set<std::string> names_;
};

NormParams make_norm(Initializer& init, const ModelConfig& c, const std::string& prefix) {
  NormParams p;
  p.weight_name = init.constant(prefix + ".weight", {c.d_model}, 1.0);
  if (c.arch == Arch::kGpt2) p.bias_name = init.constant(prefix + ".bias", {c.d_model}, 0.0);
  return p;
}

}  // namespace

std::unique_ptr<graph::OpDag> build_model(const ModelConfig& c, uint64_t seed, c10::Device device) {
  return build_model(c, seed, graph::OnDevice(device));
}

std::unique_ptr<graph::OpDag> build_model(const ModelConfig& c, uint64_t seed,
                                          const graph::Placement& placement) {
  c.validate();
  using graph::Source;
  auto dag = std::make_unique<graph::OpDag>(std::vector<std::string>{"tokens", "targets"});
  Initializer init(dag->params(), seed, placement);
  const bool gpt2 = c.arch == Arch::kGpt2;
  const double std = c.init_std;
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  const int64_t d = c.d_model, f = c.ff_dim(), hd = c.head_dim();

  const std::string tok = init.normal("embed.tok.weight", {c.vocab_size, d}, std);
  const std::string pos = gpt2 ? init.normal("embed.pos.weight", {c.seq_len, d}, std) : "";
  int prev = dag->add_node("embed", std::make_unique<EmbeddingOp>(c, tok, pos),
                           {{Source::Kind::kGraphInput, kTokensInput}});

  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string layer = "layers." + std::to_string(i);
    AttentionParams a;
    a.norm = make_norm(init, c, layer + ".attn.norm");
    a.qkv_name =
        init.normal(layer + ".attn.qkv.weight", {(c.n_head + 2 * c.kv_heads()) * hd, d}, std);
    a.proj_name = init.normal(layer + ".attn.proj.weight", {d, c.n_head * hd}, out_std);
    if (gpt2) {
      a.qkv_bias_name = init.constant(layer + ".attn.qkv.bias", {3 * d}, 0.0);
      a.proj_bias_name = init.constant(layer + ".attn.proj.bias", {d}, 0.0);
    }
    prev = dag->add_node(layer + ".attn", std::make_unique<AttentionOp>(c, std::move(a)),
                         {{Source::Kind::kNode, prev}});

    MlpParams m;
    m.norm = make_norm(init, c, layer + ".mlp.norm");
    m.fc_name = init.normal(layer + ".mlp.fc.weight", {gpt2 ? f : 2 * f, d}, std);
    m.proj_name = init.normal(layer + ".mlp.proj.weight", {d, f}, out_std);
    if (gpt2) {
      m.fc_bias_name = init.constant(layer + ".mlp.fc.bias", {f}, 0.0);
      m.proj_bias_name = init.constant(layer + ".mlp.proj.bias", {d}, 0.0);
    }
    prev = dag->add_node(layer + ".mlp", std::make_unique<MlpOp>(c, std::move(m)),
                         {{Source::Kind::kNode, prev}});
  }

  prev = dag->add_node("final_norm",
                       std::make_unique<FinalNormOp>(c, make_norm(init, c, "final_norm")),
                       {{Source::Kind::kNode, prev}});
  const std::string head =
      c.tie_embeddings ? tok : init.normal("head.weight", {c.vocab_size, d}, std);
  prev = dag->add_node("head", std::make_unique<HeadOp>(c, head), {{Source::Kind::kNode, prev}});
  dag->add_node("loss", std::make_unique<LossOp>(c),
                {{Source::Kind::kNode, prev}, {Source::Kind::kGraphInput, kTargetsInput}});
  return dag;
}

std::unique_ptr<graph::OpDag> build_model_part(const ModelConfig& c, uint64_t seed,
                                               c10::Device device, const NodesOf& part) {
  // The structure first, with no weights and no draws, to learn what the part's nodes read.
  const auto skeleton = build_model(c, seed, HoldsOnly(device, {}));
  graph::StageRange range = part(*skeleton);
  if (range.last < 0) range.last = skeleton->size() - 1;
  if (range.first < 0 || range.first > range.last || range.last >= skeleton->size())
    throw std::out_of_range("build_model_part: nodes [" + std::to_string(range.first) + ", " +
                            std::to_string(range.last) + "] are not a range of a " +
                            std::to_string(skeleton->size()) + "-node model");
  std::set<std::string> read;
  for (int i = range.first; i <= range.last; ++i)
    for (const auto& name : skeleton->nodes()[static_cast<size_t>(i)].op->param_names())
      read.insert(name);
  return build_model(c, seed, HoldsOnly(device, std::move(read)));
}

int logits_node(const graph::OpDag& dag) {
  const int i = dag.find("head");
  if (i < 0) throw std::logic_error("model has no head node");
  return i;
}

}  // namespace starling::model
