// What the pipeline scheduler weighs (FusionLLM's workload estimate): per node of the model's
// OP-DAG, its time on a reference device and the bytes a cut right after it sends; per device, its
// speed against that reference; per pair of devices, the link's bandwidth and latency. One table,
// saved as JSON, that OP-Fence (op_fence.h) reads. Torch-free: the profiler that measures it lives
// with the model, this is only the numbers and their checks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace starling::sched {

struct NodeCost {
  std::string name;
  // Forward plus backward of one micro-batch on the reference device (speed 1).
  double compute_s = 0;
  int64_t param_bytes = 0;
  // Bytes of the activations a cut right after this node sends forward (the outputs of this and
  // earlier nodes that later nodes read); the same bytes of their gradients travel back. 0 for the
  // last node.
  int64_t cut_bytes = 0;
  // The forward's part of compute_s; < 0 when not measured (a table from before it was), taken
  // then as a third (a backward computes about twice a forward's work).
  double forward_s = -1;
};

struct DeviceCost {
  std::string name;
  double speed = 1;  // throughput against the reference device: a node takes compute_s / speed
  // One upload that everything the device sends shares, in bytes per second (a star network, such
  // as `--link-rate`'s, where a peer reaches every other through one shaped link); 0 = none: each
  // link of `links` is a path of its own.
  double egress_bytes_per_s = 0;
  // One download that everything the device receives shares, likewise (a star's link is shaped
  // both ways); 0 = none. Only the simulated step weighs it (pipeline_sim.h): in a chain a stage
  // receives the same bytes it sends, so its upload's part already bounds the cut.
  double ingress_bytes_per_s = 0;
};

struct LinkCost {
  double bytes_per_s = 0;  // 0 = no link
  double latency_s = 0;
};

// Rate that stands for an unshaped link (a lab's, or one a plan never uses) in cost tables:
// loopback's order of magnitude.
inline constexpr double kUnshapedBytesPerS = 1.25e9;

struct CostTable {
  std::vector<NodeCost> nodes;
  std::vector<DeviceCost> devices;
  // links[a][b]: from device a to device b (a != b); the diagonal is unused.
  std::vector<std::vector<LinkCost>> links;
  int64_t micro_batches = 1;  // per optimizer step
  // The order each stage runs its micro-batches in (pipeline.schedule, pipeline.extra_warmup):
  // 1F1B (true) or GPipe, and with 1F1B the forwards run ahead beyond its warm-up. Optional in the
  // JSON form ("schedule": "1f1b" or "gpipe", "extra_warmup"; defaults 1f1b and 0).
  bool one_f_one_b = true;
  int64_t extra_warmup = 0;
  // CPUs (intra-op threads) the reference device computed with when profiled: a lab's peer with
  // a quota of c CPUs runs at min(c, reference_cpus) / reference_cpus (lab_spec.h). Optional in
  // the JSON form (default 1).
  double reference_cpus = 1;

  // The link between two devices, either direction: the slower of the two measurements.
  LinkCost link(size_t a, size_t b) const;
  // The node's forward time on the reference device (forward_s, or a third of compute_s).
  double forward_s(size_t node) const;
  // ConfigError naming `where` and the field when the table is inconsistent: no nodes or devices,
  // a negative or non-finite time or size, a forward_s above compute_s, a speed <= 0, a negative
  // egress or ingress, a links matrix of the wrong size, a missing link between two devices, fewer
  // than one micro-batch.
  void validate(const std::string& where = "cost table") const;
  // Every cut's bytes times `fraction`: what a compression leaves of them on the wire.
  void scale_cuts(double fraction);
};

// A link rate as tc and `--link-rate` write it ("250kbit", "10mbit", "1gbit", "5MBps"; tc's
// decimal units in any case, a unit required) in bytes per second. ConfigError naming `what` on
// anything else, and on a rate above kMaxLinkBits.
inline constexpr double kMaxLinkBits = 1e14;  // bits per second: 100tbit
double parse_link_rate(const std::string& text, const std::string& what);

nlohmann::json to_json(const CostTable& t);
// ConfigError naming `where` and the field on anything missing, mistyped or inconsistent.
CostTable cost_table_from_json(const nlohmann::json& j, const std::string& where);
CostTable read_cost_table(const std::filesystem::path& file);
void write_cost_table(const std::filesystem::path& file, const CostTable& t);

// The whole model's forward and backward time on the table's reference device: the sum of every
// node's compute_s.
double total_compute_s(const CostTable& t);

}  // namespace starling::sched
