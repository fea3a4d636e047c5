// What every replica of a swarm must share, said in its node's role (MemberInfo::role), so that
// a peer started with another model or strategy finds out as it joins and refuses itself: two
// such peers used to retry their state transfer forever ("peers disagree: broadcast of 87938
// floats ..."), slowing the swarm they had joined. Only what breaks the exchanges is compared:
// the model's shape and the strategy with its rounds. What a peer may set apart (threads, device,
// swap budget) is not in it, nor what only changes the arithmetic (the schedule, the optimizer).
#pragma once

#include <string>
#include <vector>

#include "starling/train/config.h"

namespace starling::strategy {

// "replica1 co2/16 gpt2 L4 D128 H4 K4 F512 S128 V256 T1": at most about 90 characters, within
// a role's 128.
std::string replica_role(const train::RunConfig& config);

// Whether `role` is a replica's (of this format): a role of another kind (a pipeline stage's) or
// another format (a newer build's) is not compared.
bool is_replica_role(const std::string& role);

// The config keys two replica roles differ in, one line each: "model.d_model: this peer's 64,
// theirs 32". Empty when they are the same.
std::vector<std::string> replica_role_differences(const std::string& mine,
                                                  const std::string& theirs);

}  // namespace starling::strategy
