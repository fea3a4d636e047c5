// Builds a model as an OpDag with freshly initialised weights.
//
// Graph inputs: 0 = "tokens" [B, T] int64, 1 = "targets" [B, T] int64.
// Nodes, in order: "embed", then per layer i "layers.<i>.attn" and "layers.<i>.mlp",
// "final_norm", "head" (logits), "loss" (scalar).
// Parameter names: embed.tok.weight, embed.pos.weight (gpt2); layers.<i>.attn.{norm,qkv,proj}.*,
// layers.<i>.mlp.{norm,fc,proj}.* (".weight", and ".bias" for gpt2); final_norm.weight(/.bias);
// head.weight when embeddings are untied. Layouts are documented in ops/*.h.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "starling/graph/dag.h"
#include "starling/graph/executor.h"
#include "starling/graph/placement.h"
#include "starling/model/config.h"

namespace starling::model {

inline constexpr int kTokensInput = 0;
inline constexpr int kTargetsInput = 1;

// Weights: normal(0, init_std) for matrices and embeddings, output projections scaled by
// 1/sqrt(2*n_layer), zero biases, unit norm gains; drawn from a generator seeded with `seed` so
// the same (config, seed) always gives the same model, wherever `placement` puts each parameter
// (values are drawn on the host, then moved).
std::unique_ptr<graph::OpDag> build_model(const ModelConfig& config, uint64_t seed,
                                          const graph::Placement& placement);
// Every parameter on `device`.
std::unique_ptr<graph::OpDag> build_model(const ModelConfig& config, uint64_t seed,
                                          c10::Device device = c10::kCPU);

// The nodes a peer runs, chosen from the whole model's DAG (which has no weights when it is asked).
using NodesOf = std::function<graph::StageRange(const graph::OpDag& whole)>;
// The whole DAG, holding on `device` only the parameters that the nodes `part` picks read (a
// pipeline stage's); the others are named (ParamStore::held_elsewhere) but take no memory. The
// held values equal build_model's for the same (config, seed): the skipped parameters' draws are
// still made, in order, up to the last held one.
std::unique_ptr<graph::OpDag> build_model_part(const ModelConfig& config, uint64_t seed,
                                               c10::Device device, const NodesOf& part);

// Index of the node that produces logits ("head").
int logits_node(const graph::OpDag& dag);

}  // namespace starling::model
