#include <filesystem>
#include <iostream>

#include "starling/cli/commands.h"
#include "starling/model/describe.h"
#include "starling/model/hf_config.h"
#include "starling/train/config.h"

namespace starling::cli {

void add_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("model", "inspect model presets and their OP-DAGs");
  cmd->require_subcommand(1);
  auto* presets = cmd->add_subcommand("presets", "list the presets with their sizes");
  presets->callback([] {
    for (const auto& name : model::preset_names()) {
      const auto c = model::preset(name);
      std::printf(
          "%-12s %-6s layers %-3lld d_model %-5lld heads %-3lld seq %-5lld vocab %-6lld %9.1fM "
          "params\n",
          name.c_str(), model::to_string(c.arch).c_str(), static_cast<long long>(c.n_layer),
          static_cast<long long>(c.d_model), static_cast<long long>(c.n_head),
          static_cast<long long>(c.seq_len), static_cast<long long>(c.vocab_size),
          static_cast<double>(c.num_params()) / 1e6);
    }
  });
  auto* show = cmd->add_subcommand("show", "print a model's OP-DAG: nodes, shapes, bytes, FLOPs");
  auto preset = std::make_shared<std::string>("gpt2-tiny");
  auto sets = std::make_shared<std::vector<std::string>>();
  auto batch = std::make_shared<int64_t>(1);
  show->add_option("--preset", *preset, "preset to start from")->capture_default_str();
  show->add_option("--set", *sets, "override a model key, e.g. --set model.n_layer=2");
  show->add_option("--batch", *batch, "micro-batch for the shapes")->capture_default_str();
  show->callback([preset, sets, batch] {
    std::string text = "[model]\npreset = \"" + *preset + "\"\n[data]\ndir = \"-\"\n";
    const auto config = train::parse_run_config(text, "--preset", *sets);
    std::cout << model::describe_model(config.model, *batch);
  });
  auto* from_hf = cmd->add_subcommand(
      "from-hf", "print the [model] table of a Hugging Face GPT-2 or LLaMA (its config.json)");
  auto hf_path = std::make_shared<std::string>();
  from_hf
      ->add_option("PATH", *hf_path,
                   "a model's config.json, or its directory (what train.init_from names)")
      ->required();
  from_hf->callback([hf_path] {
    const model::ModelConfig c = model::model_from_hf_config(*hf_path);
    // init_from names the weights: the model's directory, not its config.json.
    const std::filesystem::path dir = std::filesystem::is_directory(*hf_path)
                                          ? std::filesystem::path(*hf_path)
                                          : std::filesystem::path(*hf_path).parent_path();
    std::cout << "# " << *hf_path << ": " << static_cast<double>(c.num_params()) / 1e6
              << "M parameters; with train.init_from = \"" << dir.string() << "\"\n"
              << model::model_table(c);
  });
}

}  // namespace starling::cli
