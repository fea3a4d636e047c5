// The local step runner's open-ended step (atom's): micro-batches of any size, each loss weighted
// by its sequences (StepRunner::accumulate), add up to the gradients of one micro-batch holding
// all of them. That is what lets an atom peer end a step on a smaller micro-batch and still
// contribute the sum over its samples that the exchange divides by the swarm's count.
#include "starling/train/step_runner.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "../data/test_util.h"
#include "starling/common/error.h"
#include "starling/data/loader.h"
#include "starling/data/shard.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/model/config.h"
#include "starling/train/adamw.h"

namespace {

using namespace starling;

model::ModelConfig small_model() {
  auto c = model::preset("gpt2-tiny");
  c.n_layer = 2;
  c.seq_len = 16;
  return c;
}

struct Replica {
  Replica(const model::ModelConfig& c, const std::filesystem::path& shard)
      : dag(model::build_model(c, 3)),
        adamw(dag->params(), {}),
        executor(*dag, {}),
        loader({shard}, options(c)),
        runner(executor, dag->params(), adamw, loader, c10::kCPU) {}

  static data::LoaderOptions options(const model::ModelConfig& c) {
    data::LoaderOptions o;
    o.seq_len = c.seq_len;
    o.batch = 4;
    o.seed = 9;
    return o;
  }

  // One open-ended step of micro-batches of `sizes` sequences; the losses' sample-weighted mean.
  double step(const std::vector<int64_t>& sizes) {
    runner.begin_accumulation();
    double sum = 0;
    int64_t samples = 0;
    for (const int64_t n : sizes) {
      sum += runner.accumulate(1.0, n).item<double>() * static_cast<double>(n);
      samples += n;
    }
    return sum / static_cast<double>(samples);
  }

  std::unique_ptr<graph::OpDag> dag;
  train::AdamW adamw;
  graph::Executor executor;
  data::TokenLoader loader;
  train::LocalStepRunner runner;
};

TEST(LocalStepRunner, ASmallerLastMicroBatchGivesTheSampleWeightedGradients) {
  const model::ModelConfig c = small_model();
  data::testing::TempDir dir;
  std::vector<uint16_t> tokens(4096);
  std::mt19937 gen(17);
  for (auto& t : tokens) t = static_cast<uint16_t>(gen() % static_cast<uint32_t>(c.vocab_size));
  data::write_shard(dir / "train_000.bin", tokens);

  // Two steps, so the second starts where a split first one left the loader.
  Replica whole(c, dir / "train_000.bin"), split(c, dir / "train_000.bin");
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{4, 3, 1}, {4, 2, 1, 1}}) {
    const double loss_whole = whole.step({8});
    const double loss_split = split.step(sizes);
    EXPECT_NEAR(loss_split, loss_whole, 1e-5);
    const auto& a = whole.dag->params().params();
    const auto& b = split.dag->params().params();
    for (size_t i = 0; i < a.size(); ++i) {
      const at::Tensor& ga = a[i].value.grad();
      const at::Tensor& gb = b[i].value.grad();
      ASSERT_TRUE(ga.defined() && gb.defined()) << a[i].name;
      EXPECT_TRUE(at::allclose(gb, ga, 1e-4, 1e-6))
          << a[i].name << ": max difference " << (gb - ga).abs().max().item<double>();
    }
  }
  EXPECT_EQ(split.loader.state().cursor, whole.loader.state().cursor);
  EXPECT_THROW(split.runner.accumulate(1.0, 0), ConfigError);
}

}  // namespace
