// One operator of an OP-DAG: a node that maps input tensors to one output tensor with its own
// parameters. The executor runs each op under local autograd, so an op is written as plain
// differentiable tensor code; it never sees the gradients of its neighbours.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace starling::graph {

class Op {
 public:
  virtual ~Op() = default;

  // Short category used by estimators and printouts: "embedding", "attention", "mlp", "norm",
  // "head", "loss".
  virtual std::string kind() const = 0;

  // Computes the output. Inputs arrive in the order of the node's edges; `params` are the
  // parameters named by param_names(), in that order, as they are placed when the node runs: the
  // executor looks them up in the ParamStore at that moment, so where a parameter lives (which
  // device, or brought in from the host or disk just before) is decided outside the op. An op
  // holds no parameter tensors. Must be deterministic: recomputation and resumed runs depend on
  // it.
  virtual at::Tensor forward(const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& params) = 0;

  // Names (in the DAG's ParamStore) of the parameters this op reads. A parameter may be read by
  // more than one op (tied embeddings); its gradient is then the sum over readers.
  virtual std::vector<std::string> param_names() const = 0;

  // Incremental decoding (a KV cache): `inputs` hold only positions [start, start + t) of one
  // sequence whose positions [0, start) ran before through the same `state` (empty at start 0).
  // The result equals forward()'s output at those positions for the whole sequence. Ops that
  // act on each position alone need not override; ops that mix positions keep what later
  // positions need in `state` (attention: its keys and values), ops that depend on the position
  // use `start`. No autograd.
  virtual at::Tensor forward_cached(const std::vector<at::Tensor>& inputs,
                                    const std::vector<at::Tensor>& params, int64_t start,
                                    std::vector<at::Tensor>& state) {
    (void)start;
    (void)state;
    return forward(inputs, params);
  }

  // A parameter of which a forward reads only some rows (a table lookup: the token embedding),
  // for a swapper that brings just those rows up to date before the node runs and the rest of
  // the table while later nodes compute. reads_rows(k): whether parameter k (param_names()
  // order) is such a table, rows of its first dimension; rows_read(k, inputs): the rows this
  // forward reads from it (1-D int64, any order, repeats allowed).
  virtual bool reads_rows(size_t /*param*/) const { return false; }
  virtual at::Tensor rows_read(size_t /*param*/, const std::vector<at::Tensor>& /*inputs*/) const {
    return {};
  }

  // Forward FLOPs per token at this context length (backward is about twice this).
  virtual double forward_flops_per_token(int64_t seq_len) const = 0;

  // Output shape for a micro-batch of `batch` sequences of `seq_len` tokens.
  virtual std::vector<int64_t> output_shape(int64_t batch, int64_t seq_len) const = 0;
};

// Reads an op's `params` in param_names() order, where some parameters are optional (biases a
// model variant lacks): next() for one that is always there, next_if(present) for an optional one
// (an undefined tensor when absent). The op's param_names() must list them in the same order.
class ParamReader {
 public:
  explicit ParamReader(const std::vector<at::Tensor>& params) : params_(params) {}
  const at::Tensor& next() { return params_.at(next_++); }
  at::Tensor next_if(bool present) { return present ? next() : at::Tensor(); }

 private:
  const std::vector<at::Tensor>& params_;
  size_t next_ = 0;
};

}  // namespace starling::graph
