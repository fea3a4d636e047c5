#include <cstdio>
#include <iostream>

#include "starling/cli/commands.h"
#include "starling/common/cpu_runtime.h"
#include "starling/train/compute_bench.h"
#include "starling/train/config.h"

namespace starling::cli {

void add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "measure this machine (see bench/ for comparisons)");
  cmd->require_subcommand(1);
  auto* compute = cmd->add_subcommand(
      "compute", "tokens/s and MFU of training steps (forward, backward, AdamW) on random tokens");
  struct Args {
    std::string preset = "gpt2-mini";
    std::string device = "cpu";
    std::vector<std::string> sets;
    int64_t batch = 8, steps = 10, warmup = 3;
    int threads = 0;
    bool recompute = false, json = false, system_allocator = false;
  };
  auto a = std::make_shared<Args>();
  compute->add_option("--preset", a->preset, "model preset")->capture_default_str();
  compute->add_option("--set", a->sets, "override a model key, e.g. --set model.seq_len=128");
  compute->add_option("--batch", a->batch, "sequences per step")->capture_default_str();
  compute->add_option("--steps", a->steps, "timed steps")->capture_default_str();
  compute->add_option("--warmup", a->warmup, "untimed steps first")->capture_default_str();
  compute->add_option("--threads", a->threads, "intra-op threads; 0 = physical cores")
      ->capture_default_str();
  compute->add_flag("--recompute", a->recompute, "per-node activation recomputation");
  compute->add_option("--device", a->device, "cpu, cuda or cuda:N")->capture_default_str();
  compute->add_flag("--json", a->json, "print one JSON line");
  compute->add_flag("--system-allocator", a->system_allocator,
                    "libtorch's default CPU allocator instead of Starling's caching one");
  compute->callback([a] {
    const int threads = setup_cpu_runtime(a->threads, a->system_allocator);
    std::string text = "[model]\npreset = \"" + a->preset + "\"\n[data]\ndir = \"-\"\n";
    const auto config = train::parse_run_config(text, "--preset", a->sets);
    const auto r = train::run_compute_bench(config.model, a->batch, a->steps, a->warmup,
                                            a->recompute, a->device);
    if (a->json) {
      std::printf(
          "{\"impl\": \"starling\", \"preset\": \"%s\", \"batch\": %lld, \"seq_len\": %lld, "
          "\"device\": \"%s\", \"allocator\": \"%s\", \"threads\": %d, \"tokens_per_s\": %.1f, "
          "\"step_ms\": %.2f, "
          "\"mfu\": %.4f, "
          "\"peak_gflops\": %.1f}\n",
          a->preset.c_str(), static_cast<long long>(a->batch),
          static_cast<long long>(config.model.seq_len), a->device.c_str(),
          a->system_allocator ? "system" : "caching", threads, r.tokens_per_s, r.step_ms, r.mfu,
          r.peak_gflops);
    } else {
      std::printf(
          "%s batch %lld x %lld, %d threads: %.0f tokens/s, %.1f ms/step, MFU %.1f%% "
          "(peak %.1f GFLOP/s)\n",
          a->preset.c_str(), static_cast<long long>(a->batch),
          static_cast<long long>(config.model.seq_len), threads, r.tokens_per_s, r.step_ms,
          100 * r.mfu, r.peak_gflops);
    }
  });
}

}  // namespace starling::cli
