// Where each of Starling's parameters lives in a Hugging Face checkpoint (GPT2LMHeadModel,
// LlamaForCausalLM), for import and export alike. One HF tensor is a block of rows of one of our
// parameters: LLaMA's q_proj/k_proj/v_proj are stacked in our attn.qkv.weight (q, k, v in that
// order) and gate_proj/up_proj in our mlp.fc.weight (gate first). GPT-2's Conv1D weights are stored
// [in, out], transposed against our [out, in]. The conventions that need no conversion: HF's
// LLaMA applies rotary positions by rotate-half with cos/sin of cat(freqs, freqs) and repeats each
// key/value head for consecutive query heads, as we do; HF's GPT-2 uses tanh GELU ("gelu_new").
// Torch-free.
#pragma once

#include <string>
#include <vector>

#include "starling/model/config.h"

namespace starling::model {

struct HfTensor {
  std::string hf;    // HF name as the official checkpoints spell it ("h.0.ln_1.weight",
                     // "model.layers.0.self_attn.q_proj.weight", "lm_head.weight")
  std::string ours;  // our parameter
  int64_t begin = 0,
          rows = -1;       // the block [begin, begin + rows) of ours' first dimension; -1: all
  bool transpose = false;  // stored [in, out] (GPT-2's Conv1D)
};

// Every HF tensor of a model of `config`, in HF's order. A tied LM head has no entry of its own
// (HF ties it to the embedding).
std::vector<HfTensor> hf_layout(const ModelConfig& config);

// An HF tensor name without the wrapper prefixes some exports add ("transformer." for GPT-2's
// LMHeadModel): the name hf_layout() uses.
std::string hf_canonical_name(const ModelConfig& config, const std::string& name);

// Names some HF exports carry that are buffers, not parameters (GPT-2's attn.bias masks, LLaMA's
// rotary inv_freq), and a tied model's copy of the head: an importer skips them.
bool hf_ignorable(const ModelConfig& config, const std::string& canonical_name);

}  // namespace starling::model
