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
    std::string dtype = "fp32";
    std::string profile;
    std::vector<std::string> sets;
    int64_t batch = 8, steps = 10, warmup = 3;
    int threads = 0;
    bool recompute = false, json = false, system_allocator = false, no_tf32 = false;
  };
  auto a = std::make_shared<Args>();
  compute->add_option("--preset", a->preset, "model preset")->capture_default_str();
  compute->add_option("--set", a->sets, "override a model key, e.g. --set model.seq_len=128");
  compute->add_option("--batch", a->batch, "sequences per step")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  compute->add_option("--steps", a->steps, "timed steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  compute->add_option("--warmup", a->warmup, "untimed steps first")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  compute
      ->add_option("--threads", a->threads,
                   "intra-op threads; 0 = physical cores (within a CPU limit)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  compute->add_flag("--recompute", a->recompute, "per-node activation recomputation");
  compute->add_option("--device", a->device, "cpu, cuda or cuda:N")->capture_default_str();
  compute->add_option("--dtype", a->dtype, "compute precision (as train.dtype)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  compute->add_flag("--no-tf32", a->no_tf32, "CUDA: keep fp32 matrix products in full fp32");
  compute->add_flag("--json", a->json, "print one JSON line");
  compute->add_option(
      "--profile", a->profile,
      "write a Chrome trace of the timed steps to this file (libtorch with Kineto)");
  compute->add_flag("--system-allocator", a->system_allocator,
                    "libtorch's default CPU allocator instead of Starling's caching one");
  compute->callback([a] {
    // The benchmark times the model alone: its batch, precision and device are flags, and the
    // rest of a run's config (steps, optimizer, data) does not enter it.
    for (const std::string& s : a->sets)
      if (s.rfind("model.", 0) != 0)
        throw CLI::ValidationError(
            "--set", "\"" + s +
                         "\": bench compute takes model keys only (model.*); the batch, device, "
                         "dtype, threads and recompute are its flags (--batch, --device, --dtype, "
                         "--threads, --recompute)");
    const int threads = setup_cpu_runtime(a->threads, a->system_allocator);
    std::string text = "[model]\npreset = \"" + a->preset + "\"\n[data]\ndir = \"-\"\n";
    const auto config = train::parse_run_config(text, "--preset", a->sets);
    const auto r = train::run_compute_bench(config.model, {.batch = a->batch,
                                                           .steps = a->steps,
                                                           .warmup = a->warmup,
                                                           .recompute = a->recompute,
                                                           .device = a->device,
                                                           .dtype = a->dtype,
                                                           .tf32 = !a->no_tf32,
                                                           .profile = a->profile});
    if (a->json) {
      std::printf(
          "{\"impl\": \"starling\", \"preset\": \"%s\", \"batch\": %lld, \"seq_len\": %lld, "
          "\"device\": \"%s\", \"dtype\": \"%s\", \"allocator\": \"%s\", \"threads\": %d, "
          "\"tokens_per_s\": %.1f, \"step_ms\": %.2f, \"tflops\": %.3f, \"mfu\": %.4f, "
          "\"peak_gflops\": %.1f, \"peak_memory_mb\": %.1f, \"fused_adamw\": %s}\n",
          a->preset.c_str(), static_cast<long long>(a->batch),
          static_cast<long long>(config.model.seq_len), a->device.c_str(), a->dtype.c_str(),
          a->system_allocator ? "system" : "caching", threads, r.tokens_per_s, r.step_ms, r.tflops,
          r.mfu, r.peak_gflops, static_cast<double>(r.peak_memory) / 1e6,
          r.fused_adamw ? "true" : "false");
    } else {
      std::printf(
          "%s batch %lld x %lld on %s (%s), %d threads: %.0f tokens/s, %.1f ms/step, "
          "%.2f TFLOP/s, MFU %.1f%% (peak %.1f GFLOP/s)",
          a->preset.c_str(), static_cast<long long>(a->batch),
          static_cast<long long>(config.model.seq_len), a->device.c_str(), a->dtype.c_str(),
          threads, r.tokens_per_s, r.step_ms, r.tflops, 100 * r.mfu, r.peak_gflops);
      if (r.peak_memory > 0)
        std::printf(", peak memory %.2f GiB", static_cast<double>(r.peak_memory) / (1 << 30));
      std::printf("\n");
    }
  });
}

}  // namespace starling::cli
