// A whole-model vector that a strategy keeps beside the replica (diloco's and co2's anchor and
// outer momentum, co2's previous average and its own last delta): one flat tensor in the
// replica's memory, or, for a swapped replica, a tensor per parameter that the step runner keeps
// in its tier (StepRunner::keep_state), so the budget never holds it. Either way parts() cuts it
// alike, a tensor per parameter in the flat vector's order (views of the flat tensor in memory),
// so code that goes a tensor at a time, reading and writing each through the runner
// (StepRunner::read_state, write_state), serves both, and a state transfer sees the same
// elements in the same order whichever form each peer holds.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "starling/common/safetensors.h"
#include "starling/strategy/flat.h"

namespace starling::train {
class StepRunner;
}

namespace starling::strategy {

class OuterVector {
 public:
  enum class Start { zeros, parameters };

  OuterVector() = default;
  // Kept by `runner` when `keep` (the runner must keep state: std::logic_error otherwise),
  // otherwise a flat vector on flat.device(). Starts at zeros (which a kept vector never writes)
  // or at the parameters' values (read through the runner).
  OuterVector(const Flat& flat, graph::ParamStore& params, train::StepRunner* runner, bool keep,
              Start start);

  bool kept() const { return kept_; }
  // The vector in memory; undefined when kept.
  const at::Tensor& flat() const { return flat_; }
  // A tensor per parameter, in the flat vector's order, shaped like the parameter.
  const std::vector<at::Tensor>& parts() const { return parts_; }

  // Appends the vector's tensors to a state transfer's list (StateStream): the flat vector, or
  // its parts in order, the same elements either way.
  void append_to(std::vector<at::Tensor>& tensors) const;
  // Checkpoint entries: `name` for the flat vector; `name.<parameter>` for each part of a kept
  // one, which the checkpoint reads from the tier one at a time.
  void checkpoint(std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::string& name) const;
  // Reads either form of checkpoint entry into either form of vector (CheckpointError naming
  // the file and the tensor when it is missing or of another size), a tensor at a time through
  // `runner` when kept.
  void restore(const SafetensorsFile& file, const std::string& name, train::StepRunner* runner);

 private:
  bool kept_ = false;
  at::Tensor flat_;
  std::vector<at::Tensor> parts_;
  std::vector<std::string> names_;  // the parameters'
};

}  // namespace starling::strategy
