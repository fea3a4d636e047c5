#include <cmath>
#include <cstdlib>
#include <iostream>

#include "starling/cli/commands.h"
#include "starling/common/cpu_runtime.h"
#include "starling/common/error.h"
#include "starling/train/metrics.h"
#include "starling/train/sample_checkpoint.h"

namespace starling::cli {

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "generate text from a checkpoint");
  auto ckpt = std::make_shared<std::string>();
  auto opts = std::make_shared<train::SampleConfig>();
  cmd->add_option("--checkpoint", *ckpt, "run directory or checkpoint directory")->required();
  cmd->add_option("--prompt", opts->prompt, "text to continue")->capture_default_str();
  cmd->add_option("--max-tokens", opts->max_tokens, "tokens to generate")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "0 = greedy")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // strtod, not stod: a value too small for a double (1e-400) is 0, not an error.
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            const bool number = !text.empty() && end == text.c_str() + text.size();
            return number && v >= 0 && std::isfinite(v)
                       ? ""
                       : "must be a finite number >= 0, got " + text;
          },
          ">= 0"))
      ->capture_default_str();
  cmd->add_option("--top-k", opts->top_k, "sample among the k likeliest tokens; 0 = all")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-p", opts->top_p,
                  "sample among the likeliest tokens holding this probability; 1 = off")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // CLI::Range would say "not in range 0.000000 to 1.000000" and take 0.
            double v = 0;
            try {
              v = std::stod(text);
            } catch (const std::exception&) {
              return "must be a number in (0, 1], got " + text;
            }
            return v > 0 && v <= 1 ? "" : "must be in (0, 1], got " + text;
          },
          "(0, 1]"))
      ->capture_default_str();
  cmd->add_option("--stop", opts->stop, "text that ends the sample (repeatable)");
  cmd->add_option("--seed", opts->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--slide", opts->slide,
                  "past the model's context, how many tokens its window moves on at once; "
                  "1 = token by token (each token reruns the whole window); 0 = half of it")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  auto threads = std::make_shared<int>(0);
  cmd->add_option("--threads", *threads,
                  "intra-op threads on the CPU; 0 = physical cores (within a CPU limit)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  auto no_cache = std::make_shared<bool>(false), timing = std::make_shared<bool>(false);
  cmd->add_flag("--no-cache", *no_cache,
                "rerun the whole context for every token instead of keeping each layer's keys "
                "and values (sample.cache = false)");
  cmd->add_flag("--timing", *timing,
                "print the tokens generated per second on stderr (the model's loading excluded)");
  cmd->callback([ckpt, opts, threads, no_cache, timing] {
    opts->cache = !*no_cache;
    setup_cpu_runtime(*threads);
    train::SampleTiming t;
    std::cout << train::sample_from_checkpoint(*ckpt, *opts, *timing ? &t : nullptr) << "\n";
    if (*timing)
      std::cerr << "sample: " << t.tokens << " tokens in " << train::fmt("%.3f", t.seconds)
                << " s, " << train::fmt("%.1f", t.tokens / std::max(t.seconds, 1e-9))
                << " tokens/s (" << (opts->cache ? "KV cache" : "no cache") << ")\n";
  });
}

}  // namespace starling::cli
