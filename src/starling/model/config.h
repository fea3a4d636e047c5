// Model shape: the architecture and its sizes. Presets carry the published sizes; every field can
// be overridden from the [model] table of a config. Torch-free so configs parse without libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "starling/config/keys_fwd.h"

namespace starling::model {

enum class Arch {
  kGpt2,   // learned positions, LayerNorm with bias, GELU (tanh), tied embeddings
  kLlama,  // RMSNorm, rotary positions, SwiGLU, untied head, no biases, grouped-query attention
};

std::string to_string(Arch arch);
// ConfigError for anything but "gpt2" or "llama".
Arch parse_arch(const std::string& name);

struct ModelConfig {
  std::string name = "custom";
  Arch arch = Arch::kGpt2;
  int64_t vocab_size = 256;
  int64_t seq_len = 256;  // context length; also the number of learned positions (gpt2)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 0;  // llama: key/value heads (grouped-query attention); 0 = n_head
  int64_t d_model = 128;
  int64_t d_ff = 0;  // hidden width of the MLP; 0 = 4*d_model (gpt2), 8/3*d_model rounded up to
                     // a multiple of 64 (llama)
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;  // llama only
  bool tie_embeddings = true;   // share the token embedding with the LM head
  double init_std = 0.02;       // std of weight init; output projections are scaled by
                                // 1/sqrt(2*n_layer) as in GPT-2

  int64_t head_dim() const { return d_model / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t ff_dim() const;
  // Throws ConfigError naming the first field that is out of range or inconsistent
  // (e.g. d_model not divisible by n_head).
  void validate() const;
  // Parameter count of the whole model (tied weights counted once).
  int64_t num_params() const;
  // Forward+backward FLOPs per trained token (6*N plus attention), used for MFU.
  double train_flops_per_token() const;
};

// The preset of that name; ConfigError listing the known names otherwise.
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// Appends the [model] keys bound to `c`'s fields (model.preset is read first, by the run config,
// because it resets the whole shape the other keys refine).
void add_config_keys(ModelConfig& c, config::Keys& keys);

}  // namespace starling::model
