#include <iostream>

#include "starling/cli/commands.h"
#include "starling/common/cpu_runtime.h"
#include "starling/train/export_checkpoint.h"

namespace starling::cli {

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "write a checkpoint's model for another framework (Hugging Face transformers)");
  auto ckpt = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("hf");
  cmd->add_option("--checkpoint", *ckpt, "run directory or checkpoint directory")->required();
  cmd->add_option("--out", *out, "directory to write (created)")->required();
  cmd->add_option("--format", *format,
                  "hf: model.safetensors + config.json for GPT2LMHeadModel / LlamaForCausalLM")
      ->capture_default_str();
  cmd->callback([ckpt, out, format] {
    setup_cpu_runtime(0);
    std::cout << train::export_checkpoint(*ckpt, *out, *format) << "\n";
  });
}

}  // namespace starling::cli
