#include "starling/model/build.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>

#include "starling/model/ops/attention.h"
#include "starling/model/ops/embedding.h"
#include "starling/model/ops/head.h"
#include "starling/model/ops/loss.h"
#include "starling/model/ops/mlp.h"
#include "starling/model/ops/norm.h"

namespace starling::model {
namespace {

// Creates parameters in a fixed order from one seeded generator.
class Initializer {
 public:
  Initializer(graph::ParamStore& store, uint64_t seed, c10::Device device)
      : store_(store), gen_(at::make_generator<at::CPUGeneratorImpl>(seed)), device_(device) {}

  at::Tensor normal(const std::string& name, at::IntArrayRef shape, double std) {
    at::Tensor t = at::empty(shape, at::kFloat);
    t.normal_(0.0, std, gen_);
    return store_.add(name, t.to(device_), /*decay=*/true);
  }
  at::Tensor constant(const std::string& name, at::IntArrayRef shape, double value) {
    // Norm gains and biases: no weight decay.
    return store_.add(name, at::full(shape, value, at::TensorOptions(at::kFloat).device(device_)),
                      /*decay=*/false);
  }

 private:
  graph::ParamStore& store_;
  at::Generator gen_;
  c10::Device device_;
};

NormWeights make_norm(Initializer& init, const ModelConfig& c, const std::string& prefix) {
  NormWeights w;
  w.weight_name = prefix + ".weight";
  w.weight = init.constant(w.weight_name, {c.d_model}, 1.0);
  if (c.arch == Arch::kGpt2) {
    w.bias_name = prefix + ".bias";
    w.bias = init.constant(w.bias_name, {c.d_model}, 0.0);
  }
  return w;
}

}  // namespace

std::unique_ptr<graph::OpDag> build_model(const ModelConfig& c, uint64_t seed, c10::Device device) {
  c.validate();
  using graph::Source;
  auto dag = std::make_unique<graph::OpDag>(std::vector<std::string>{"tokens", "targets"});
  Initializer init(dag->params(), seed, device);
  const bool gpt2 = c.arch == Arch::kGpt2;
  const double std = c.init_std;
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  const int64_t d = c.d_model, f = c.ff_dim(), hd = c.head_dim();

  at::Tensor tok = init.normal("embed.tok.weight", {c.vocab_size, d}, std);
  at::Tensor pos;
  if (gpt2) pos = init.normal("embed.pos.weight", {c.seq_len, d}, std);
  int prev = dag->add_node("embed",
                           std::make_unique<EmbeddingOp>(c, "embed.tok.weight", tok,
                                                         gpt2 ? "embed.pos.weight" : "", pos),
                           {{Source::Kind::kGraphInput, kTokensInput}});

  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string layer = "layers." + std::to_string(i);
    AttentionWeights a;
    a.norm = make_norm(init, c, layer + ".attn.norm");
    a.qkv_name = layer + ".attn.qkv.weight";
    a.qkv = init.normal(a.qkv_name, {(c.n_head + 2 * c.kv_heads()) * hd, d}, std);
    a.proj_name = layer + ".attn.proj.weight";
    a.proj = init.normal(a.proj_name, {d, c.n_head * hd}, out_std);
    if (gpt2) {
      a.qkv_bias_name = layer + ".attn.qkv.bias";
      a.qkv_bias = init.constant(a.qkv_bias_name, {3 * d}, 0.0);
      a.proj_bias_name = layer + ".attn.proj.bias";
      a.proj_bias = init.constant(a.proj_bias_name, {d}, 0.0);
    }
    prev = dag->add_node(layer + ".attn", std::make_unique<AttentionOp>(c, std::move(a)),
                         {{Source::Kind::kNode, prev}});

    MlpWeights m;
    m.norm = make_norm(init, c, layer + ".mlp.norm");
    m.fc_name = layer + ".mlp.fc.weight";
    m.fc = init.normal(m.fc_name, {gpt2 ? f : 2 * f, d}, std);
    m.proj_name = layer + ".mlp.proj.weight";
    m.proj = init.normal(m.proj_name, {d, f}, out_std);
    if (gpt2) {
      m.fc_bias_name = layer + ".mlp.fc.bias";
      m.fc_bias = init.constant(m.fc_bias_name, {f}, 0.0);
      m.proj_bias_name = layer + ".mlp.proj.bias";
      m.proj_bias = init.constant(m.proj_bias_name, {d}, 0.0);
    }
    prev = dag->add_node(layer + ".mlp", std::make_unique<MlpOp>(c, std::move(m)),
                         {{Source::Kind::kNode, prev}});
  }

  prev = dag->add_node("final_norm",
                       std::make_unique<FinalNormOp>(c, make_norm(init, c, "final_norm")),
                       {{Source::Kind::kNode, prev}});
  std::string head_name = "embed.tok.weight";
  at::Tensor head = tok;
  if (!c.tie_embeddings) {
    head_name = "head.weight";
    head = init.normal(head_name, {c.vocab_size, d}, std);
  }
  prev = dag->add_node("head", std::make_unique<HeadOp>(c, head_name, head),
                       {{Source::Kind::kNode, prev}});
  dag->add_node("loss", std::make_unique<LossOp>(c),
                {{Source::Kind::kNode, prev}, {Source::Kind::kGraphInput, kTargetsInput}});
  return dag;
}

int logits_node(const graph::OpDag& dag) {
  const int i = dag.find("head");
  if (i < 0) throw std::logic_error("model has no head node");
  return i;
}

}  // namespace starling::model
