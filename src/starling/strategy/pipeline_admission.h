// Letting a replacement pipeline into a swarm of pipeline replicas at one step. When a stage peer
// dies, the other stages of its pipeline leave and rejoin inactive, and a replacement started with
// the dead peer's key joins inactive too; together they are a whole pipeline waiting. They must
// enter every stage group's collectives at the same step: a waiting stage that entered its group
// earlier than its partner would hold its healthy counterpart in a collective while it waits for
// that partner's activations, and the counterpart's own pipeline would stall behind it.
//
// So the healthy stages decide together. Each votes in its pipeline's per-step sum
// (PipelineStepRunner::update) whether it sees a whole replica waiting (can_admit below); a
// pipeline that counts every stage's vote is ready, and the strategy's round agreement adds the
// ready pipelines up across every stage group (StepRunner::admission_ready). When all agree, each
// healthy stage marks its waiting counterparts active (net::Node::admit) and sends each an
// admission; the waiting stages then activate and take their counterparts' state in their first
// agreement (SwarmStrategy::agree), and their loaders move to the adopted step
// (StepRunner::align).
#pragma once

#include <chrono>
#include <vector>

#include "starling/net/node.h"
#include "starling/strategy/pipeline_peer.h"

namespace starling::strategy {

// Whether a swarm of pipelines, as `members` (one peer's view) shows it, holds a replica that
// waits to be admitted and can be: every place of `grid` is held by an alive member, every
// replica is wholly active or wholly inactive, and at least one is inactive. A replica part
// active, part inactive (a stage that lost its partner and has not rejoined yet) holds the
// admission back, so that a waiting pipeline is admitted whole.
bool can_admit(const std::vector<net::MemberView>& members, const PipelineGrid& grid);

// A healthy stage's side.
class PipelineAdmission {
 public:
  // The mailbox tag of an admission.
  static constexpr uint64_t kTag = 0x706970656164'6d74;  // "pipeadmt"

  PipelineAdmission(net::Node& node, PipelineGrid grid, int stage);

  // can_admit on this peer's view of the members.
  bool vote() const;
  // Marks this stage's waiting counterparts (alive, inactive) active and sends each an admission;
  // returns how many it admitted.
  int admit();

 private:
  net::Node& node_;
  PipelineGrid grid_;
  int stage_;
};

// A waiting stage's side: waits until a counterpart of `place` in another replica admits this
// peer. NetError after `timeout`, naming the places that were not yet held or waiting.
void wait_for_admission(net::Node& node, const PipelineGrid& grid, const PipelinePlace& place,
                        std::chrono::milliseconds timeout);

}  // namespace starling::strategy
