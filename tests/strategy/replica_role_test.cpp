// The replica role: equal for configs whose replicas can exchange, whatever each peer may set
// apart; unequal, naming the config keys, for another model shape or strategy.
#include "starling/strategy/replica_role.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace starling::strategy {
namespace {

train::RunConfig config(const std::vector<std::string>& sets) {
  return train::parse_run_config(
      "[model]\npreset = \"gpt2-tiny\"\n[data]\ndir = \"-\"\n[strategy]\nkind = \"co2\"\n", "test",
      sets);
}

TEST(ReplicaRole, WhatAPeerMaySetApartLeavesItAlone) {
  const std::string role = replica_role(config({}));
  EXPECT_TRUE(is_replica_role(role));
  EXPECT_LE(role.size(), 128u) << role;
  for (const std::string set :
       {"train.threads=2", "optim.lr=1e-3", "train.steps=7", "model.init_std=0.05",
        "strategy.outer_lr=0.5", "swap.budget=\"1MB\"", "model.d_ff=512"})
    EXPECT_EQ(replica_role(config({set})), role) << set;  // d_ff 512 is gpt2-tiny's default
  EXPECT_FALSE(is_replica_role("pipeline stage 0 replica 0"));
  EXPECT_FALSE(is_replica_role(""));
}

TEST(ReplicaRole, AnotherShapeOrStrategyIsNamedByItsKey) {
  const std::string mine = replica_role(config({}));
  const auto differ = [&](const std::string& set, const std::string& says) {
    const auto d = replica_role_differences(mine, replica_role(config({set})));
    ASSERT_FALSE(d.empty()) << set;
    EXPECT_NE(d[0].find(says), std::string::npos) << d[0];
  };
  differ("model.d_model=64", "model.d_model: this peer's 128, theirs 64");  // and d_ff, 4x it
  differ("model.seq_len=16", "model.seq_len: this peer's 128, theirs 16");
  differ("model.vocab_size=300", "model.vocab_size");
  differ("model.n_layer=2", "model.n_layer");
  differ("model.tie_embeddings=false", "model.tie_embeddings: this peer's 1, theirs 0");
  differ("strategy.local_steps=4", "strategy.local_steps: this peer's 16, theirs 4");
  // ddp has no rounds: the kind differs, and co2's local_steps has nothing to meet.
  const auto d = replica_role_differences(mine, replica_role(config({"strategy.kind=\"ddp\""})));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], "strategy.kind: this peer's co2, theirs ddp");
  EXPECT_EQ(d[1], "strategy.local_steps: this peer's 16, theirs (none)");
  EXPECT_TRUE(replica_role_differences(mine, mine).empty());
}

}  // namespace
}  // namespace starling::strategy
