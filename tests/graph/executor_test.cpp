// The executor's node-by-node autodiff must give exactly what one monolithic autograd pass over
// the same ops gives, with and without recomputation, for both architectures.
#include "starling/graph/executor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "starling/model/build.h"
#include "starling/train/sampler.h"

namespace starling {
namespace {

model::ModelConfig tiny(model::Arch arch) {
  auto c = model::preset(arch == model::Arch::kGpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.seq_len = 16;
  return c;
}

std::vector<at::Tensor> batch(const model::ModelConfig& c, int64_t b, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = at::randint(c.vocab_size, {b, c.seq_len + 1}, gen, at::kLong);
  return {tokens.narrow(1, 0, c.seq_len).contiguous(), tokens.narrow(1, 1, c.seq_len).contiguous()};
}

// Runs every op on undetached tensors: one autograd graph through the whole model.
double monolithic(graph::OpDag& dag, const std::vector<at::Tensor>& in) {
  std::vector<at::Tensor> out(dag.size());
  for (int i = 0; i < dag.size(); ++i) {
    std::vector<at::Tensor> args;
    for (const auto& s : dag.nodes()[i].inputs)
      args.push_back(s.kind == graph::Source::Kind::kNode ? out[s.index] : in[s.index]);
    std::vector<at::Tensor> params;
    for (const auto& name : dag.nodes()[i].op->param_names())
      params.push_back(dag.params().get(name).value);
    out[i] = dag.nodes()[i].op->forward(args, params);
  }
  out.back().backward();
  return out.back().item<double>();
}

std::vector<at::Tensor> grads(graph::OpDag& dag) {
  std::vector<at::Tensor> g;
  for (auto& p : dag.params().params()) g.push_back(p.value.grad().clone());
  return g;
}

void expect_same_grads(graph::OpDag& got, const std::vector<at::Tensor>& want,
                       const std::string& what) {
  const auto g = grads(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_TRUE(at::allclose(g[i], want[i], 1e-5, 1e-7))
        << what << ": " << got.params().params()[i].name << " max diff "
        << (g[i] - want[i]).abs().max().item<double>();
}

class ExecutorTest : public ::testing::TestWithParam<std::tuple<model::Arch, bool>> {};

TEST_P(ExecutorTest, MatchesMonolithicAutograd) {
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto in = batch(c, 3, 7);

  auto reference = model::build_model(c, 42);
  const double ref_loss = monolithic(*reference, in);
  auto ref_grads = grads(*reference);

  auto dag = model::build_model(c, 42);
  graph::Executor exec(*dag, {.recompute = recompute});
  const double loss = exec.forward_backward(in).item<double>();
  EXPECT_NEAR(loss, ref_loss, 1e-6);
  expect_same_grads(*dag, ref_grads, "node by node");
}

TEST_P(ExecutorTest, LossScaleScalesGradientsAndAccumulates) {
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto in = batch(c, 2, 9);
  auto dag = model::build_model(c, 1);
  graph::Executor exec(*dag, {.recompute = recompute});
  exec.forward_backward(in, 1.0);
  auto once = grads(*dag);
  dag->params().zero_grad();
  exec.forward_backward(in, 0.5);
  exec.forward_backward(in, 0.5);
  expect_same_grads(*dag, once, "two halves");
}

TEST_P(ExecutorTest, StagesRunAloneGiveTheWholeDagsGradients) {
  // A two-stage pipeline in one process: stage A's outputs are stage B's incoming activations,
  // and the gradients B hands back are A's output gradients.
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto in = batch(c, 2, 11);
  auto whole = model::build_model(c, 3);
  graph::Executor reference(*whole, {.recompute = recompute});
  const double want_loss = reference.forward_backward(in).item<double>();
  const auto want = grads(*whole);
  const int n = whole->size();
  for (int cut : {1, n / 2, n - 1}) {
    auto dag = model::build_model(c, 3);
    graph::Executor exec(*dag, {.recompute = recompute});
    graph::MicroBatch a = exec.forward_stage(in, {0, cut - 1});
    graph::MicroBatch b = exec.forward_stage(in, {cut, n - 1}, a.outputs());
    EXPECT_NEAR(b.outputs().at(n - 1).item<double>(), want_loss, 1e-6) << "cut " << cut;
    const graph::EdgeTensors back = exec.backward_stage(b, {{n - 1, at::ones({})}});
    for (const auto& [producer, t] : a.outputs())
      EXPECT_TRUE(back.count(producer)) << "no gradient for the activation of node " << producer;
    EXPECT_TRUE(exec.backward_stage(a, back).empty());  // the first stage has no incoming edges
    expect_same_grads(*dag, want, "cut " + std::to_string(cut));
  }
}

TEST_P(ExecutorTest, ForwardOnlyStagesBuildNoGraphAndRefuseBackward) {
  // Evaluation through stages: the same outputs as a training forward, no autograd history.
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto in = batch(c, 2, 5);
  auto dag = model::build_model(c, 3);
  graph::Executor exec(*dag, {.recompute = recompute});
  const int n = dag->size(), cut = n / 2;
  graph::MicroBatch a = exec.forward_stage(in, {0, cut - 1}, {}, /*for_backward=*/false);
  graph::MicroBatch b = exec.forward_stage(in, {cut, n - 1}, a.outputs(), false);
  graph::MicroBatch ta = exec.forward_stage(in, {0, cut - 1});
  graph::MicroBatch tb = exec.forward_stage(in, {cut, n - 1}, ta.outputs());
  // Kernels may differ without autograd (a fused attention), so fp32 rounding is allowed.
  EXPECT_TRUE(at::allclose(b.outputs().at(n - 1), tb.outputs().at(n - 1), 1e-5, 1e-6));
  for (const auto& [node, t] : a.outputs()) {
    EXPECT_TRUE(at::allclose(t, ta.outputs().at(node), 1e-5, 1e-6));
    EXPECT_FALSE(t.requires_grad());
  }
  EXPECT_THROW(exec.backward_stage(b, {{n - 1, at::ones({})}}), std::logic_error);
}

TEST_P(ExecutorTest, TwoMicroBatchesInFlight) {
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto in1 = batch(c, 2, 21), in2 = batch(c, 2, 22);
  auto sequential = model::build_model(c, 4);
  graph::Executor one_by_one(*sequential, {.recompute = recompute});
  one_by_one.forward_backward(in1, 0.5);
  one_by_one.forward_backward(in2, 0.5);
  const auto want = grads(*sequential);

  auto dag = model::build_model(c, 4);
  graph::Executor exec(*dag, {.recompute = recompute});
  const int last = dag->size() - 1;
  graph::MicroBatch m1 = exec.forward_stage(in1, {});
  graph::MicroBatch m2 = exec.forward_stage(in2, {});
  exec.backward_stage(m2, {{last, at::full({}, 0.5)}});  // in the other order: 1F1B's cool-down
  exec.backward_stage(m1, {{last, at::full({}, 0.5)}});
  expect_same_grads(*dag, want, "two in flight");
  EXPECT_THROW(exec.backward_stage(m1, {{last, at::ones({})}}), std::logic_error);
}

struct Recorder : graph::NodeObserver {
  std::vector<std::string> events;
  void before(int node, graph::Phase p) override { add("+", node, p); }
  void after(int node, graph::Phase p) override { add("-", node, p); }
  void add(const char* edge, int node, graph::Phase p) {
    events.push_back(std::string(edge) + graph::phase_name(p) + " " + std::to_string(node));
  }
};

TEST_P(ExecutorTest, ObserverSeesEveryEventInOrder) {
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto dag = model::build_model(c, 5);
  graph::Executor exec(*dag, {.recompute = recompute});
  Recorder r;
  exec.add_observer(&r);
  exec.forward_backward(batch(c, 1, 2));
  std::vector<std::string> want;
  auto both = [&](const char* phase, int i) {
    want.push_back(std::string("+") + phase + " " + std::to_string(i));
    want.push_back(std::string("-") + phase + " " + std::to_string(i));
  };
  for (int i = 0; i < dag->size(); ++i) both("forward", i);
  for (int i = dag->size() - 1; i >= 0; --i) {
    if (recompute) both("recompute", i);
    both("backward", i);
  }
  EXPECT_EQ(r.events, want);
}

TEST(Executor, StageInputsMustBeHandedIn) {
  const auto c = tiny(model::Arch::kGpt2);
  auto dag = model::build_model(c, 5);
  graph::Executor exec(*dag);
  EXPECT_THROW(exec.forward_stage(batch(c, 1, 2), {2, -1}), std::invalid_argument);
  EXPECT_THROW(exec.forward_stage(batch(c, 1, 2), {3, 1}), std::out_of_range);
  EXPECT_THROW(exec.forward_stage({batch(c, 1, 2)[0]}, {}), std::invalid_argument);  // no targets
}

INSTANTIATE_TEST_SUITE_P(Archs, ExecutorTest,
                         ::testing::Combine(::testing::Values(model::Arch::kGpt2,
                                                              model::Arch::kLlama),
                                            ::testing::Bool()));

TEST(Executor, ForwardMatchesTrainingLoss) {
  const auto c = tiny(model::Arch::kGpt2);
  auto in = batch(c, 2, 3);
  auto dag = model::build_model(c, 5);
  graph::Executor exec(*dag);
  const double eval = exec.forward(in).item<double>();
  const double train = exec.forward_backward(in).item<double>();
  EXPECT_NEAR(eval, train, 1e-6);
  auto logits = exec.forward({in[0], at::Tensor()}, model::logits_node(*dag));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{2, c.seq_len, c.vocab_size}));
}

// A KV cache gives the logits a whole-sequence forward gives, position for position: a prompt,
// then tokens one at a time, then a chunk of several, for GPT-2 (learned positions) and LLaMA
// (rotary positions, grouped-query attention). Clearing the cache starts a sequence afresh.
TEST(Executor, ForwardCachedMatchesTheWholeSequence) {
  for (const auto arch : {model::Arch::kGpt2, model::Arch::kLlama}) {
    auto c = tiny(arch);
    if (arch == model::Arch::kLlama) c.n_kv_head = 2;  // grouped-query attention
    auto dag = model::build_model(c, 9);
    graph::Executor exec(*dag);
    const int head = model::logits_node(*dag);
    const auto tokens = batch(c, 1, 4)[0];  // [1, seq_len]
    const at::Tensor whole = exec.forward({tokens, at::Tensor()}, head);
    graph::DecodeCache cache;
    std::vector<at::Tensor> parts;
    for (const auto& [from, n] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 5}, {5, 1}, {6, 1}, {7, 4}, {11, 1}, {12, c.seq_len - 12}}) {
      parts.push_back(exec.forward_cached({tokens.narrow(1, from, n), at::Tensor()}, cache, head));
      EXPECT_EQ(cache.position(), from + n);
    }
    const at::Tensor cached = at::cat(parts, 1);
    ASSERT_EQ(cached.sizes(), whole.sizes());
    EXPECT_TRUE(at::allclose(cached, whole, 1e-4, 1e-5))
        << (arch == model::Arch::kGpt2 ? "gpt2" : "llama") << ": max diff "
        << (cached - whole).abs().max().item<double>();
    // The prompt's own positions are forward()'s, bit for bit: the same attention kernel.
    cache.clear();
    const at::Tensor again =
        exec.forward_cached({tokens.narrow(1, 0, 5), at::Tensor()}, cache, head);
    EXPECT_TRUE(at::equal(again, parts[0]));
    // Past model.seq_len the positions run out: a clear error, not a wrong answer.
    cache.clear();
    exec.forward_cached({tokens, at::Tensor()}, cache, head);
    EXPECT_THROW(exec.forward_cached({tokens.narrow(1, 0, 1), at::Tensor()}, cache, head),
                 std::invalid_argument);
  }
}

// Sampling with the cache picks the tokens rerunning the whole window picks, greedy and seeded,
// past model.seq_len too, whatever the window's slide.
TEST(Sampler, TheCacheGivesTheTokensOfRerunningTheContext) {
  for (const auto arch : {model::Arch::kGpt2, model::Arch::kLlama}) {
    const auto c = tiny(arch);
    auto dag = model::build_model(c, 11);
    for (const int64_t slide : {int64_t{1}, int64_t{0}, int64_t{3}})
      for (const double temperature : {0.0, 1.0}) {
        train::SampleConfig o;
        o.max_tokens = 2 * c.seq_len + 5;  // through the end of the context and twice beyond
        o.temperature = temperature;
        o.top_k = 0;
        o.seed = 3;
        o.slide = slide;
        const std::vector<uint32_t> prompt = {1, 2, 3};
        o.cache = true;
        const auto cached = train::generate(*dag, c, prompt, o);
        o.cache = false;
        const auto rerun = train::generate(*dag, c, prompt, o);
        EXPECT_EQ(cached, rerun) << "temperature " << temperature << ", slide " << slide;
        EXPECT_EQ(cached.size(), prompt.size() + static_cast<size_t>(o.max_tokens));
      }
  }
}

// Past seq_len the window moves on by `slide` tokens at once: each greedy token is the argmax of
// a whole forward over the window the header describes, computed here from scratch.
TEST(Sampler, TheWindowMovesOnBySlideTokensPastTheContext) {
  const auto c = tiny(model::Arch::kGpt2);
  auto dag = model::build_model(c, 12);
  graph::Executor exec(*dag);
  const int head = model::logits_node(*dag);
  const auto len = static_cast<size_t>(c.seq_len);
  for (const int64_t slide : {int64_t{1}, int64_t{0}, int64_t{3}, c.seq_len, 10 * c.seq_len}) {
    train::SampleConfig o;
    o.max_tokens = 2 * c.seq_len + 3;
    o.temperature = 0;
    o.slide = slide;
    const size_t step = slide == 0 ? len / 2 : std::min(static_cast<size_t>(slide), len);
    EXPECT_EQ(train::window_slide(o, c), step);
    std::vector<uint32_t> prompt(len + 2);  // longer than the context: cut to its last seq_len
    for (size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = static_cast<uint32_t>(i * 7 % c.vocab_size);
    const auto got = train::generate(*dag, c, prompt, o);
    ASSERT_EQ(got.size(), prompt.size() + static_cast<size_t>(o.max_tokens));
    size_t start = prompt.size() - len, shortest = len;
    for (size_t end = prompt.size(); end < got.size(); ++end) {
      if (end - start > len) start += step;
      shortest = std::min(shortest, end - start);
      std::vector<int64_t> window(got.begin() + static_cast<std::ptrdiff_t>(start),
                                  got.begin() + static_cast<std::ptrdiff_t>(end));
      const auto n = static_cast<int64_t>(window.size());
      const at::Tensor logits =
          exec.forward({at::tensor(window, at::kLong).view({1, n}), at::Tensor()}, head);
      ASSERT_EQ(static_cast<uint32_t>(logits[0][-1].argmax().item<int64_t>()), got[end])
          << "slide " << slide << ", token " << end;
    }
    EXPECT_EQ(shortest, len - step + 1) << "the shortest window a token saw, slide " << slide;
  }
}

// Ops hold no parameters: the executor hands each node the ParamStore's tensors as they are when
// the node runs, so replacing a parameter's tensor (what a swapping runner does when it brings a
// layer in) is all it takes to move it.
TEST(Executor, ParametersAreReadWhenNodesRun) {
  const auto c = tiny(model::Arch::kGpt2);
  auto in = batch(c, 2, 3);
  auto dag = model::build_model(c, 5);
  graph::Executor exec(*dag);
  const double before = exec.forward(in).item<double>();
  graph::Param& p = dag->params().get("layers.1.mlp.fc.weight");
  const at::Tensor old = p.value;
  p.value = (old.detach() * 3).requires_grad_(true);  // a new tensor, not an in-place change
  const double after = exec.forward_backward(in).item<double>();
  EXPECT_NE(after, before);
  EXPECT_TRUE(p.value.grad().defined()) << "the gradient lands on the tensor that ran";
  EXPECT_FALSE(old.grad().defined());
  // The same values in a model built with them from the start give the same loss.
  auto same = model::build_model(c, 5);
  {
    at::NoGradGuard no_grad;
    same->params().get("layers.1.mlp.fc.weight").value.mul_(3);
  }
  EXPECT_NEAR(graph::Executor(*same).forward(in).item<double>(), after, 1e-6);
}

// The placement policy is asked for every parameter, by name, in creation order; the values do
// not depend on it.
TEST(Executor, PlacementDecidesWhereEachParameterIsCreated) {
  struct Recording : graph::Placement {
    mutable std::vector<std::string> asked;
    c10::Device device_of(const std::string& name) const override {
      asked.push_back(name);
      return c10::kCPU;
    }
  } placement;
  const auto c = tiny(model::Arch::kLlama);
  auto placed = model::build_model(c, 5, placement);
  auto plain = model::build_model(c, 5);
  std::vector<std::string> names;
  for (const auto& p : plain->params().params()) names.push_back(p.name);
  EXPECT_EQ(placement.asked, names);
  for (const auto& p : plain->params().params())
    EXPECT_TRUE(at::equal(placed->params().get(p.name).value, p.value)) << p.name;
}

TEST(Executor, TiedEmbeddingGetsGradientFromBothReaders) {
  const auto c = tiny(model::Arch::kGpt2);
  auto dag = model::build_model(c, 5);
  EXPECT_FALSE(dag->params().contains("head.weight"));
  const int embed = dag->find("embed"), head = dag->find("head");
  EXPECT_EQ(dag->nodes()[embed].op->param_names()[0], "embed.tok.weight");
  EXPECT_EQ(dag->nodes()[head].op->param_names()[0], "embed.tok.weight");
  const auto tied = dag->tied_params();
  ASSERT_EQ(tied.size(), 1u);
  EXPECT_EQ(tied[0].name, "embed.tok.weight");
  EXPECT_EQ(tied[0].nodes, (std::vector<int>{embed, head}));
  EXPECT_TRUE(model::build_model(tiny(model::Arch::kLlama), 5)->tied_params().empty());
}

// The pieces peers exchange gradients in where one is swapped: one per node that reads a
// parameter first, in node order, every parameter in exactly one, a tied table in its first
// reader's (GPT-2's head reads the embedding's table and has no piece of its own).
TEST(Executor, ParametersArePiecedByTheirFirstReader) {
  for (const auto arch : {model::Arch::kGpt2, model::Arch::kLlama}) {
    auto dag = model::build_model(tiny(arch), 5);
    const auto pieces = dag->params_by_first_reader();
    std::vector<int> seen(dag->params().params().size(), 0);
    int last_node = -1;
    for (const auto& piece : pieces) {
      ASSERT_FALSE(piece.empty());
      // Every parameter of a piece is first read by the same node, later than the last piece's.
      int node = -1;
      for (int i = 0; i < dag->size() && node < 0; ++i)
        for (const auto& name : dag->nodes()[i].op->param_names())
          if (name == dag->params().params()[piece.front()].name) node = i;
      EXPECT_GT(node, last_node);
      last_node = node;
      for (size_t k = 0; k < piece.size(); ++k) {
        ++seen[piece[k]];
        if (k > 0) {
          EXPECT_LT(piece[k - 1], piece[k]);
        }
        const auto names = dag->nodes()[node].op->param_names();
        EXPECT_NE(std::find(names.begin(), names.end(), dag->params().params()[piece[k]].name),
                  names.end());
      }
    }
    EXPECT_EQ(seen, std::vector<int>(seen.size(), 1));
  }
  auto gpt2 = model::build_model(tiny(model::Arch::kGpt2), 5);
  const int embed = gpt2->find("embed");
  const auto pieces = gpt2->params_by_first_reader();
  const auto& params = gpt2->params().params();
  EXPECT_EQ(params[pieces.front().front()].name, gpt2->nodes()[embed].op->param_names()[0]);
  // The head reads only the table: the last piece is the final norm's.
  EXPECT_EQ(params[pieces.back().front()].name.rfind("final_norm.", 0), 0u)
      << params[pieces.back().front()].name;
}

}  // namespace
}  // namespace starling
