// Where a model's parameters are created: all on the compute device (OnDevice), or decided per
// parameter by a policy (a swapping runner keeps layer groups in host memory and brings each in
// while its nodes run). Ops never decide it: they receive their parameters when they run (op.h),
// so moving a parameter is replacing its tensor in the ParamStore.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace starling::graph {

class Placement {
 public:
  virtual ~Placement() = default;
  // The device the parameter called `name` is created on.
  virtual c10::Device device_of(const std::string& name) const = 0;
  // Whether this peer holds the parameter at all; false for the parameters of another peer's part
  // of the model (a pipeline's other stages), which are then only named
  // (ParamStore::add_elsewhere).
  virtual bool holds(const std::string& /*name*/) const { return true; }
};

class OnDevice final : public Placement {
 public:
  explicit OnDevice(c10::Device device) : device_(device) {}
  c10::Device device_of(const std::string&) const override { return device_; }

 private:
  c10::Device device_;
};

}  // namespace starling::graph
