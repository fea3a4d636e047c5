// Swapped training end to end through the binary: the planner's error for a budget that cannot
// work, its printed plan, and bit-identity with unswapped training (losses every step, validation
// losses, final weights and AdamW moments) for GPT-2 and LLaMA, with and without recomputation
// and gradient accumulation, on the host and disk tiers, at the smallest budget the planner
// accepts (the most swapping there can be). Also checkpoint + resume under swapping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_cli.h"
#include "run_files.h"
#include "starling/common/process.h"

namespace {

namespace fs = std::filesystem;
using starling::testing::binary_sees_a_gpu;
using starling::testing::read_file;
using starling::testing::rng_data_start;
using starling::testing::run_cli;

// "step", "loss" and "val_loss" of every metrics record, in order, as written (full precision).
std::vector<std::string> losses(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<std::string> out;
  const std::regex field("\"(step|loss|val_loss)\":([-0-9.eE+]+)");
  for (std::string line; std::getline(in, line);) {
    std::string kept;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), field);
         it != std::sregex_iterator(); ++it)
      kept += (*it)[1].str() + "=" + (*it)[2].str() + " ";
    out.push_back(kept);
  }
  return out;
}

// "1.23 MB" -> bytes.
double parse_size(const std::string& number, const std::string& unit) {
  const double scale = unit == "KB" ? 1e3 : unit == "MB" ? 1e6 : unit == "GB" ? 1e9 : 1;
  return std::stod(number) * scale;
}

class SwapCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("starling_swap_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "text");
    std::mt19937 rng(11);
    const char* words[] = {"a",    "swap", "layer",  "group",  "disk", "host",  "budget", "plan",
                           "step", "loss", "weight", "moment", "grad", "chunk", "tier"};
    for (int d = 0; d < 10; ++d) {
      std::ofstream out(root_ / "text" / ("doc" + std::to_string(d) + ".txt"));
      for (int s = 0; s < 60; ++s)
        for (int w = 0; w < 12; ++w) out << words[rng() % 15] << (w == 11 ? ".\n" : " ");
    }
    const auto prep = run_cli("data prepare " + (root_ / "text").string() + " --out " +
                              (root_ / "data").string() + " --val-fraction 0.2");
    ASSERT_EQ(prep.code, 0) << prep.output;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static fs::path config(const std::string& name, const std::string& preset, bool recompute,
                         int accum) {
    const fs::path path = root_ / (name + ".toml");
    std::ofstream(path) << "[model]\npreset = \"" << preset
                        << "\"\nn_layer = 2\nd_model = 32\nn_head = 2\nseq_len = 32\n"
                        << "[data]\ndir = \"" << (root_ / "data").string() << "\"\n"
                        << "[train]\nsteps = 6\nbatch_size = 4\ngrad_accum = " << accum
                        << "\nthreads = 1\nlog_every = 1\neval_every = 3\neval_batches = 2\n"
                        << "checkpoint_every = 0\nsample_at_end = false\nrecompute = "
                        << (recompute ? "true" : "false") << "\nout_dir = \""
                        << (root_ / ("run_" + name)).string() << "\"\n"
                        << "[optim]\nlr = 1e-2\nwarmup_steps = 2\n";
    return path;
  }

  // The smallest budget the planner accepts for `cfg`, read from its error for 1 KB.
  static std::string smallest_budget(const fs::path& cfg, const std::string& tier,
                                     const std::string& settings = "") {
    const auto r =
        run_cli("plan swap --config " + cfg.string() + " --budget 1KB --set swap.tier=" + tier +
                " --set swap.dir=" + root_.string() + settings);
    EXPECT_NE(r.code, 0) << r.output;
    std::smatch m;
    if (!std::regex_search(r.output, m,
                           std::regex("smallest feasible budget is ([0-9.]+) (B|KB|MB|GB)"))) {
      ADD_FAILURE() << "no smallest budget in: " << r.output;
      return "";
    }
    // Rounded to three digits in the message: add one unit of the last digit.
    const double bytes = parse_size(m[1].str(), m[2].str()) * 1.01;
    return std::to_string(static_cast<long long>(bytes)) + "B";
  }

  static fs::path root_;
};
fs::path SwapCliTest::root_;

TEST_F(SwapCliTest, PlanRefusesATooSmallBudgetAndPrintsAFeasibleOne) {
  const fs::path cfg = config("plan", "gpt2-tiny", false, 1);
  const std::string budget = smallest_budget(cfg, "disk");
  ASSERT_FALSE(budget.empty());
  const auto r = run_cli("plan swap --config " + cfg.string() + " --budget " + budget +
                         " --set swap.tier=disk --set swap.dir=" + root_.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("layer groups"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("predicted"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("of I/O hidden"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tier disk"), std::string::npos) << r.output;
  // One replica may start its update inside the backward (a guess, with clipping); a peer's
  // exchange comes first, so a config for peers plans without it.
  EXPECT_NE(r.output.find("inside the backward"), std::string::npos) << r.output;
  const auto peer =
      run_cli("plan swap --config " + cfg.string() + " --budget " + budget +
              " --set swap.tier=disk --set strategy.kind=atom --set swap.dir=" + root_.string());
  ASSERT_EQ(peer.code, 0) << peer.output;
  EXPECT_NE(peer.output.find("as each peer of strategy.kind = \"atom\" runs it"), std::string::npos)
      << peer.output;
  EXPECT_EQ(peer.output.find("inside the backward"), std::string::npos) << peer.output;
  // A fixed slowdown of the computation beside the tier's transfers, instead of the probe's.
  const auto slowed =
      run_cli("plan swap --config " + cfg.string() + " --budget " + budget +
              " --set swap.tier=disk --set swap.io_slowdown=0.5 --set swap.dir=" + root_.string());
  ASSERT_EQ(slowed.code, 0) << slowed.output;
  EXPECT_NE(slowed.output.find("runs 50% slower while the tier moves data"), std::string::npos)
      << slowed.output;

  // Probing in train.out_dir (no swap.dir), the plan leaves no directory it made.
  ASSERT_FALSE(fs::exists(root_ / "run_plan"));
  const auto in_out_dir = run_cli("plan swap --config " + cfg.string() + " --budget " + budget +
                                  " --set swap.tier=disk");
  ASSERT_EQ(in_out_dir.code, 0) << in_out_dir.output;
  EXPECT_FALSE(fs::exists(root_ / "run_plan"));

  const auto all = run_cli("plan swap --config " + cfg.string() + " --budget 10GB");
  ASSERT_EQ(all.code, 0) << all.output;
  EXPECT_NE(all.output.find("nothing is swapped"), std::string::npos) << all.output;
  EXPECT_NE(all.output.find("of training state (all of it)"), std::string::npos) << all.output;

  // Training with such a budget stops at its start, and leaves no config.toml behind.
  const auto train =
      run_cli("train -q --config " + cfg.string() +
              " --set swap.budget=1KB --set swap.tier=disk --set swap.dir=" + root_.string());
  EXPECT_EQ(train.code, 2) << train.output;
  EXPECT_NE(train.output.find("smallest feasible budget"), std::string::npos) << train.output;
  EXPECT_FALSE(fs::exists(root_ / "run_plan")) << "the failed start left its run directory";
  // So does a swarm of such peers, which says why (quiet too) and trained nothing.
  const auto swarm = run_cli("train -q --peers 2 --config " + cfg.string() +
                             " --set strategy.kind=ddp --set swap.budget=1KB --set swap.tier=disk "
                             "--set swap.dir=" +
                             root_.string() + " --out " + (root_ / "plan_swarm").string());
  EXPECT_NE(swarm.code, 0) << swarm.output;
  EXPECT_NE(swarm.output.find("exited with code 2: error: swap.budget 1.00 KB cannot hold"),
            std::string::npos)
      << swarm.output;
  // Each peer either failed itself or, when the other failed first, was stopped by the launcher,
  // and the summary counts only the first kind as failed.
  const auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = swarm.output.find(what); at != std::string::npos;
         at = swarm.output.find(what, at + 1))
      ++n;
    return n;
  };
  const int failed = count("exited with code"), stopped = count("stopped (another peer failed");
  EXPECT_EQ(failed + stopped, 2) << swarm.output;
  EXPECT_NE(swarm.output.find(std::to_string(failed) + " of 2 peers failed" +
                              (stopped > 0 ? " (the launcher stopped the other 1)" : "")),
            std::string::npos)
      << swarm.output;
  EXPECT_EQ(swarm.output.find("trained 0 steps"), std::string::npos) << swarm.output;
  // A budget that is no size, or none, is refused before the profile (minutes on a large model).
  for (const std::string b : {"abc", "6", "0MB"}) {
    const auto bad = run_cli("plan swap --config " + cfg.string() + " --budget " + b);
    EXPECT_EQ(bad.code, 2) << bad.output;
    EXPECT_EQ(bad.output.find("profiling"), std::string::npos) << bad.output;
    EXPECT_NE(bad.output.find("--budget"), std::string::npos) << bad.output;
  }
  // Too large a size is said so, not "is not a size".
  const auto huge =
      run_cli("plan swap --config " + cfg.string() + " --budget 99999999999999999999TB");
  EXPECT_EQ(huge.code, 2) << huge.output;
  EXPECT_NE(huge.output.find("is more than 9 EB"), std::string::npos) << huge.output;
}

// Ctrl-C while the planner probes the tier: the directories it made for the probe go, it says
// that no plan was made, and the interrupt ends it as it would any command.
TEST_F(SwapCliTest, AnInterruptedPlanSaysSoAndLeavesNoDirectory) {
  const fs::path cfg = config("interrupt", "gpt2-tiny", false, 1);
  const fs::path made = root_ / "interrupted", dir = made / "a" / "b";
  const fs::path log = root_ / "interrupted.log";
  starling::Process plan({STARLING_CLI_PATH, "plan", "swap", "--config", cfg.string(), "--budget",
                          "10GB", "--set", "swap.tier=disk", "--set", "swap.dir=" + dir.string()},
                         log.string());
  // The probe's directory lives from the probe's start to the plan's end (a few hundred ms).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(dir) && std::chrono::steady_clock::now() < deadline &&
         !plan.wait(std::chrono::milliseconds(0)))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(fs::exists(dir)) << "the probe never made " << dir << ": " << read_file(log);
  plan.signal(SIGINT);
  const auto code = plan.wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value()) << "still running after Ctrl-C";
  EXPECT_EQ(*code, 128 + SIGINT) << read_file(log);
  EXPECT_NE(read_file(log).find("plan: interrupted; no plan was made"), std::string::npos)
      << read_file(log);
  EXPECT_FALSE(fs::exists(made)) << "the interrupted plan left " << made;
}

TEST_F(SwapCliTest, BadSettingsGetClearErrors) {
  const fs::path cfg = config("bad", "gpt2-tiny", false, 1);
  const auto size = run_cli("train -q --config " + cfg.string() + " --set swap.budget=lots");
  EXPECT_NE(size.code, 0);
  EXPECT_NE(size.output.find("swap.budget: \"lots\" is not a size"), std::string::npos)
      << size.output;
  const auto fp16 = run_cli("train -q --config " + cfg.string() +
                            " --set swap.budget=1MB --set train.dtype=fp16");
  EXPECT_NE(fp16.code, 0);
  EXPECT_NE(fp16.output.find("fp16"), std::string::npos) << fp16.output;
  // A GPU's tier is pinned host RAM: the disk below it is refused before any GPU is touched.
  const auto disk = run_cli("plan swap --config " + cfg.string() +
                            " --budget 1MB --set swap.tier=disk --set train.device=cuda");
  EXPECT_NE(disk.code, 0);
  EXPECT_NE(disk.output.find("swap.tier = \"disk\" is not supported on train.device = \"cuda\""),
            std::string::npos)
      << disk.output;
  // A cap on GPU memory needs a GPU, and a size.
  const auto cap = run_cli("train -q --config " + cfg.string() + " --set train.device_memory=1GB");
  EXPECT_NE(cap.code, 0);
  EXPECT_NE(cap.output.find("train.device_memory caps a GPU's memory"), std::string::npos)
      << cap.output;
  const auto cap_size =
      run_cli("train -q --config " + cfg.string() + " --set train.device_memory=much");
  EXPECT_NE(cap_size.code, 0);
  EXPECT_NE(cap_size.output.find("train.device_memory: \"much\" is not a size"), std::string::npos)
      << cap_size.output;
  // /proc has no blocks: not a disk, rather than a full one ("0 B free").
  if (fs::is_directory("/proc"))
    for (const std::string dir : {"/proc", "/proc/no/such/dir"}) {
      const auto proc =
          run_cli("train -q --config " + cfg.string() +
                  " --set swap.budget=1MB --set swap.tier=disk --set swap.dir=" + dir);
      EXPECT_EQ(proc.code, 2) << proc.output;
      EXPECT_NE(proc.output.find("swap.dir " + dir + " is not on a disk"), std::string::npos)
          << proc.output;
    }
}

// Two checkpoints' optimizer files hold the same AdamW moments, byte for byte (the random
// generators' state after them left out).
void expect_same_moments(const fs::path& a, const fs::path& b) {
  const std::string oa = read_file(a / "optimizer.safetensors");
  const std::string ob = read_file(b / "optimizer.safetensors");
  const size_t ra = rng_data_start(oa), rb = rng_data_start(ob);
  ASSERT_GT(ra, 0u);
  ASSERT_EQ(ra, rb);
  EXPECT_TRUE(oa.compare(0, ra, ob, 0, rb) == 0) << "AdamW moments differ: " << a << ", " << b;
}

struct Case {
  const char* preset;
  bool recompute;
  int accum;
  const char* tier;
  bool overlap = true;         // swap.overlap_update
  const char* device = "cpu";  // train.device: on "cuda" the tier is pinned host RAM
  int moment_groups = -1;      // swap.moment_groups: groups whose AdamW moments stay resident
  double clip = 1;  // optim.grad_clip: 1 (the default), or 0, the update then starting inside
                    // the backward (swapper.h)
  // swap.speculative_update ("" = the default, "auto"): with clipping on the disk tier, the
  // update starts inside the backward as a guess, kept or redone.
  const char* speculate = "";
  // swap.guess_break_even with "auto": "0" guesses after every unclipped step, "0.99" never
  // (the record's share stays under it), whatever the plan predicts on this machine.
  const char* break_even = "";
  // train.dtype: "bf16" autocasts the products over the swapped fp32 weights (every libtorch's
  // CPU can); "fp16" adds the loss scale, unscaled a gradient at a time when swapped. A CPU
  // autocasts to fp16 from libtorch 2.1 on (skipped on older ones).
  const char* dtype = "fp32";
};

class SwapIdentity : public SwapCliTest, public ::testing::WithParamInterface<Case> {};

TEST_P(SwapIdentity, SwappedTrainingIsBitIdenticalToUnswapped) {
  const Case c = GetParam();
  const std::string device = c.device;
  if (device != "cpu" && !binary_sees_a_gpu())
    GTEST_SKIP() << "no GPU: the binary is not built against a CUDA libtorch or sees no GPU "
                    "(scripts/build-cuda.sh)";
  const std::string name = std::string(c.preset) + (c.recompute ? "_rc" : "") + "_acc" +
                           std::to_string(c.accum) + "_" + c.tier + (c.overlap ? "" : "_after") +
                           "_" + device +
                           (c.moment_groups >= 0 ? "_m" + std::to_string(c.moment_groups) : "") +
                           (c.clip == 1 ? "" : "_clip" + std::to_string(c.clip)) +
                           (*c.speculate ? std::string("_") + c.speculate : "") +
                           (*c.break_even ? std::string("_") + c.break_even : "") + "_" + c.dtype;
  const std::string on =
      " --set train.device=" + device + " --set train.dtype=" + c.dtype +
      (c.moment_groups >= 0 ? " --set swap.moment_groups=" + std::to_string(c.moment_groups) : "") +
      " --set optim.grad_clip=" + std::to_string(c.clip);
  const fs::path plain = config(name + "_plain", c.preset, c.recompute, c.accum);
  const fs::path swapped = config(name + "_swap", c.preset, c.recompute, c.accum);
  const auto a = run_cli("train -q --config " + plain.string() + on);
  if (a.code != 0 &&
      a.output.find("train.dtype = \"fp16\" is not supported on cpu") != std::string::npos)
    GTEST_SKIP() << "this libtorch cannot autocast to fp16 on a CPU (2.1 and later can): "
                 << a.output;
  ASSERT_EQ(a.code, 0) << a.output;

  const std::string budget = smallest_budget(swapped, c.tier, on);
  ASSERT_FALSE(budget.empty());
  const auto b =
      run_cli("train --config " + swapped.string() + on + " --set swap.budget=" + budget +
              " --set swap.tier=" + c.tier + " --set swap.dir=" + root_.string() +
              " --set swap.overlap_update=" + (c.overlap ? "true" : "false") +
              (*c.speculate ? std::string(" --set swap.speculative_update=") + c.speculate : "") +
              (*c.break_even ? std::string(" --set swap.guess_break_even=") + c.break_even : ""));
  ASSERT_EQ(b.code, 0) << b.output;

  // It really swapped, and stayed under the budget.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      b.output, m, std::regex("peak resident ([0-9.]+) (B|KB|MB|GB), read ([0-9.]+) (B|KB|MB|GB)")))
      << b.output;
  EXPECT_LE(parse_size(m[1].str(), m[2].str()),
            std::stod(budget.substr(0, budget.size() - 1)) * 1.01)
      << b.output;
  EXPECT_GT(parse_size(m[3].str(), m[4].str()), 0) << b.output;
  // A layer's small parameters (norms, biases) shared staging sets (batches, without staging).
  ASSERT_TRUE(std::regex_search(b.output, m,
                                std::regex("([0-9]+) chunks in ([0-9]+) (staging sets|batches)")))
      << b.output;
  EXPECT_EQ(m[3].str() == "batches", std::string(c.tier) == "host" && device == "cpu") << b.output;
  EXPECT_LT(std::stol(m[2].str()), std::stol(m[1].str())) << b.output;
  // Host RAM below a CPU is updated where it lies; a disk or a GPU's pinned RAM goes through
  // staging.
  EXPECT_EQ(b.output.find("updated in place in the tier") != std::string::npos,
            std::string(c.tier) == "host" && device == "cpu")
      << b.output;
  // Without clipping, on a CPU with the update overlapped, chunks ran inside the backward; with
  // clipping, only in the steps that guessed (disk only). "always" guesses every step, and these
  // cases' limits clip some steps (the guess redone) and not others (kept).
  const bool in_backward =
      std::regex_search(b.output, std::regex("; [1-9][0-9]* chunks inside the backward"));
  const bool guessed = std::regex_search(
      b.output, m,
      std::regex("; ([0-9]+) updates begun before their clipping was known, ([0-9]+) "
                 "of them redone"));
  EXPECT_EQ(in_backward, (c.clip == 0 || guessed) && c.overlap && device == "cpu") << b.output;
  if (std::string(c.tier) != "disk" || c.clip == 0 || std::string(c.speculate) == "off") {
    EXPECT_FALSE(guessed) << b.output;
  }
  const bool declined =
      std::regex_search(b.output, std::regex("; [1-9][0-9]* steps after an unclipped one not "
                                             "guessed \\(break-even share 99%\\)"));
  EXPECT_EQ(declined, std::string(c.break_even) == "0.99") << b.output;
  if (declined) {
    EXPECT_FALSE(guessed) << b.output;
  } else if (*c.speculate) {
    ASSERT_TRUE(guessed) << b.output;
    const int begun = std::stoi(m[1].str()), redone = std::stoi(m[2].str());
    // "auto" guesses only after an unclipped step, so never in the first.
    EXPECT_EQ(begun == 6, std::string(c.speculate) == "always") << b.output;
    EXPECT_GT(redone, 0) << b.output;
    EXPECT_LT(redone, begun) << b.output;
  }
  if (c.moment_groups > 0) {
    EXPECT_NE(b.output.find("AdamW moments of the first " + std::to_string(c.moment_groups)),
              std::string::npos)
        << b.output;
  }

  const fs::path run_a = root_ / ("run_" + name + "_plain");
  const fs::path run_b = root_ / ("run_" + name + "_swap");
  const auto la = losses(run_a), lb = losses(run_b);
  ASSERT_FALSE(la.empty());
  EXPECT_EQ(la, lb);
  const fs::path ck_a = run_a / "checkpoints" / "step_00000006";
  const fs::path ck_b = run_b / "checkpoints" / "step_00000006";
  EXPECT_TRUE(read_file(ck_a / "model.safetensors") == read_file(ck_b / "model.safetensors"))
      << "final weights differ";
  expect_same_moments(ck_a, ck_b);
}

INSTANTIATE_TEST_SUITE_P(
    Models, SwapIdentity,
    ::testing::Values(Case{"gpt2-tiny", false, 2, "disk"}, Case{"gpt2-tiny", true, 1, "host"},
                      Case{"gpt2-tiny", true, 2, "disk"}, Case{"llama-tiny", true, 2, "disk"},
                      Case{"llama-tiny", false, 1, "host"}, Case{"llama-tiny", false, 2, "disk"},
                      Case{"gpt2-tiny", false, 2, "disk", false},
                      // The first groups' moments kept in compute memory, updated in place.
                      Case{"gpt2-tiny", false, 2, "disk", true, "cpu", 1},
                      Case{"llama-tiny", true, 1, "host", true, "cpu", 2},
                      // No clipping: each parameter's update starts inside the backward.
                      Case{"gpt2-tiny", false, 2, "disk", true, "cpu", -1, 0},
                      Case{"llama-tiny", true, 1, "host", true, "cpu", -1, 0},
                      // Clipping, the update guessed inside the backward: kept or redone.
                      Case{"gpt2-tiny", false, 2, "disk", true, "cpu", -1, 1.6, "always"},
                      Case{"llama-tiny", true, 1, "disk", true, "cpu", -1, 1.5, "auto", "0"},
                      // "auto" guessing nothing: too few steps kept for its break-even share.
                      Case{"llama-tiny", true, 1, "disk", true, "cpu", -1, 1.5, "auto", "0.99"},
                      // bf16's autocast over weights that come and go: with recompute and
                      // clipping, without clipping (the update inside the backward, in place in
                      // host RAM), and guessed every step.
                      Case{"gpt2-tiny", true, 2, "disk", true, "cpu", -1, 1, "", "", "bf16"},
                      Case{"llama-tiny", false, 1, "host", true, "cpu", -1, 0, "", "", "bf16"},
                      Case{"gpt2-tiny", false, 2, "disk", true, "cpu", -1, 1.6, "always", "",
                           "bf16"},
                      // fp16's loss scaling (skipped where the CPU cannot autocast to fp16).
                      Case{"gpt2-tiny", false, 2, "disk", true, "cpu", -1, 1, "", "", "fp16"},
                      // A GPU's memory with pinned host RAM below it (skipped without a GPU).
                      Case{"gpt2-tiny", false, 2, "host", true, "cuda"},
                      Case{"gpt2-tiny", true, 1, "host", false, "cuda"},
                      Case{"llama-tiny", true, 2, "host", true, "cuda"},
                      Case{"gpt2-tiny", false, 2, "host", true, "cuda", -1, 1, "", "", "fp16"}),
    [](const auto& info) {
      return std::string(info.param.preset[0] == 'g' ? "Gpt2" : "Llama") +
             (info.param.recompute ? "Recompute" : "") + "Accum" +
             std::to_string(info.param.accum) + (info.param.tier[0] == 'd' ? "Disk" : "Host") +
             (info.param.overlap ? "" : "UpdateAfterPasses") +
             (std::string(info.param.device) == "cuda" ? "Cuda" : "") +
             (info.param.moment_groups > 0 ? "Moments" + std::to_string(info.param.moment_groups)
                                           : "") +
             (info.param.clip == 0   ? "NoClip"
              : info.param.clip != 1 ? "Clip" + std::to_string(int(info.param.clip * 10))
                                     : "") +
             (std::string(info.param.speculate) == "always" ? "GuessEveryStep"
              : std::string(info.param.speculate) == "auto"
                  ? (std::string(info.param.break_even) == "0.99" ? "GuessDeclined"
                                                                  : "GuessAfterUnclipped")
                  : "") +
             (std::string(info.param.dtype) == "fp16"   ? "Fp16"
              : std::string(info.param.dtype) == "bf16" ? "Bf16"
                                                        : "");
    });

// Overlapped with the next forward, the update keeps to the forward's window and changes the
// weights the window loads in place, so a moving weight is read once per step where the update
// after the passes reads it twice (through staging, then for the forward).
TEST_F(SwapCliTest, TheOverlappedUpdateReadsEachMovingWeightOnce) {
  const fs::path cfg = config("reads", "gpt2-tiny", false, 1);
  const std::string smallest = smallest_budget(cfg, "disk");
  ASSERT_FALSE(smallest.empty());
  // Room for the window's loads beside the smallest plan. One plan for both runs (the planner's
  // choice, from a noisy profile, could differ between them and move other bytes).
  const std::string budget =
      std::to_string(std::stoll(smallest.substr(0, smallest.size() - 1)) * 3 / 2) + "B";
  auto reads = [&](bool overlap) {
    const auto r =
        run_cli("train --config " + cfg.string() + " --set swap.budget=" + budget +
                " --set swap.tier=disk --set swap.dir=" + root_.string() +
                " --set train.eval_every=0 --set swap.group_nodes=1 --set swap.depth=1"
                " --set swap.moment_groups=0 --set swap.overlap_update=" +
                (overlap ? "true" : "false") + " --set train.out_dir=" +
                (root_ / (std::string("run_reads_") + (overlap ? "on" : "off"))).string());
    EXPECT_EQ(r.code, 0) << r.output;
    std::smatch m;
    if (!std::regex_search(r.output, m, std::regex("read ([0-9.]+) (B|KB|MB|GB), written"))) {
      ADD_FAILURE() << "no swap report in: " << r.output;
      return 0.0;
    }
    return parse_size(m[1].str(), m[2].str());
  };
  const double overlapped = reads(true), after = reads(false);
  ASSERT_GT(after, 0);
  EXPECT_LT(overlapped, after) << "read " << overlapped << " B with the update overlapped, "
                               << after << " B after the passes";
}

// GPT-2's vocabulary over a small model: the token table is most of the state, and a batch's
// tokens are a few hundred rows scattered over it. Swapped with one node per group, the rows the
// next lookup reads are updated first (read from the disk in spans around them, merged where
// they are close) and the rest of the table between the later groups; swap.rows_first = false
// updates the table whole before the forward. Both end bit-identical to unswapped training.
TEST_F(SwapCliTest, TheTokenTablesLookedUpRowsGoFirst) {
  const fs::path bpe = fs::path(STARLING_SOURCE_DIR) / "data" / "gpt2";
  if (!fs::is_regular_file(bpe / "vocab.bpe"))
    GTEST_SKIP() << "GPT-2's BPE files are not in " << bpe
                 << ": run scripts/fetch-gpt2-bpe.sh (make test does)";
  const fs::path data = root_ / "data_gpt2";
  const auto prep =
      run_cli("data prepare " + (root_ / "text").string() + " --out " + data.string() +
              " --tokenizer gpt2 --bpe " + bpe.string() + " --val-fraction 0.2");
  ASSERT_EQ(prep.code, 0) << prep.output;
  // d_model 256: the table (51 MB) outweighs the staging area (50 MB), so a budget just above
  // the smallest feasible one swaps.
  const std::string model = " --set data.dir=" + data.string() +
                            " --set model.vocab_size=50257 --set model.d_model=256"
                            " --set model.n_layer=3 --set swap.group_nodes=1 --set swap.depth=1";
  const fs::path cfg = config("rows", "gpt2-tiny", false, 1);
  const std::string smallest = smallest_budget(cfg, "disk", model);
  ASSERT_FALSE(smallest.empty());
  const std::string budget =
      std::to_string(std::stoll(smallest.substr(0, smallest.size() - 1)) * 11 / 10) + "B";
  auto run = [&](const std::string& name, const std::string& settings) {
    const auto r = run_cli("train --config " + cfg.string() + model + settings +
                           " --set train.out_dir=" + (root_ / ("run_rows_" + name)).string());
    EXPECT_EQ(r.code, 0) << r.output;
    return r.output;
  };
  const std::string swap =
      " --set swap.budget=" + budget + " --set swap.tier=disk --set swap.dir=" + root_.string();
  run("plain", "");
  const std::string first = run("first", swap);
  const std::string whole = run("whole", swap + " --set swap.rows_first=false");
  // Every step but the first starts with the previous step's update in flight; the evaluation
  // forwards after steps 3 and 6 look rows up too.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(first, m, std::regex("looked-up rows first ([0-9]+) times")))
      << first;
  EXPECT_GE(std::stoi(m[1].str()), 5) << first;
  EXPECT_EQ(whole.find("looked-up rows first"), std::string::npos) << whole;

  const fs::path plain_ck = root_ / "run_rows_plain" / "checkpoints" / "step_00000006";
  const auto plain_losses = losses(root_ / "run_rows_plain");
  ASSERT_FALSE(plain_losses.empty());
  for (const char* name : {"first", "whole"}) {
    SCOPED_TRACE(name);
    const fs::path run_dir = root_ / (std::string("run_rows_") + name);
    EXPECT_EQ(losses(run_dir), plain_losses);
    const fs::path ck = run_dir / "checkpoints" / "step_00000006";
    EXPECT_TRUE(read_file(ck / "model.safetensors") == read_file(plain_ck / "model.safetensors"))
        << "final weights differ";
    expect_same_moments(plain_ck, ck);
  }
}

// A GPU capped below the training state (train.device_memory) trains it only swapped: the AdamW
// moments wait in RAM and come over one tensor at a time, never whole. A run stopped and resumed
// (the checkpoint's moments staged the same way) ends where a straight one does.
TEST_F(SwapCliTest, StateLargerThanTheGpuTrainsSwappedAndResumes) {
  if (!binary_sees_a_gpu())
    GTEST_SKIP() << "no GPU: the binary is not built against a CUDA libtorch or sees no GPU "
                    "(scripts/build-cuda.sh)";
  // 4 layers of width 1024 and a 4096-token vocabulary: 54.6M parameters, 218 MB of weights,
  // 874 MB with gradients and AdamW moments; the card is capped at 512 MB. (No MFU probe: its
  // matrices would crowd the cap.)
  auto widen = [](const fs::path& path) {
    std::string text = read_file(path);
    text = std::regex_replace(text, std::regex("n_layer = 2\nd_model = 32\nn_head = 2\n"),
                              "n_layer = 4\nd_model = 1024\nn_head = 16\nvocab_size = 4096\n");
    std::ofstream(path) << text;
    return path;
  };
  const std::string gpu =
      " --set train.device=cuda --set train.device_memory=512MB --set train.peak_tflops=100";
  const fs::path plain = widen(config("capped_plain", "gpt2-tiny", false, 1));
  const auto refused = run_cli("train -q --config " + plain.string() + gpu);
  EXPECT_NE(refused.code, 0) << refused.output;
  EXPECT_NE(refused.output.find("out of memory"), std::string::npos) << refused.output;

  const std::string swap = gpu + " --set swap.budget=300MB --set swap.tier=host";
  const fs::path straight = widen(config("capped_straight", "gpt2-tiny", false, 1));
  const auto whole = run_cli("train --config " + straight.string() + swap);
  ASSERT_EQ(whole.code, 0) << whole.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(whole.output, m,
                                std::regex("device memory peak over the steps ([0-9.]+) GiB")))
      << whole.output;
  EXPECT_LT(std::stod(m[1].str()) * (1 << 30), 512e6) << whole.output;

  const fs::path split = widen(config("capped_split", "gpt2-tiny", false, 1));
  const auto first = run_cli("train -q --config " + split.string() + swap + " --stop-at 3");
  ASSERT_EQ(first.code, 0) << first.output;
  const auto second = run_cli("train -q --config " + split.string() + swap + " --resume");
  ASSERT_EQ(second.code, 0) << second.output;
  const fs::path a = root_ / "run_capped_straight" / "checkpoints" / "step_00000006";
  const fs::path b = root_ / "run_capped_split" / "checkpoints" / "step_00000006";
  EXPECT_TRUE(read_file(a / "model.safetensors") == read_file(b / "model.safetensors"))
      << "the resumed run's weights differ from the straight run's";
}

// Twice: with every moment in the tier, and with the first group's moments kept in compute
// memory, where a resumed run adopts them from the checkpoint's mapping and updates them there.
TEST_F(SwapCliTest, ResumedSwappedRunMatchesAStraightOne) {
  // Also with every update guessed inside the backward, kept in some steps and redone in others.
  const std::string guessed = " --set optim.grad_clip=1.6 --set swap.speculative_update=always";
  for (const std::string& kept :
       {std::string(), std::string(" --set swap.moment_groups=1"), guessed}) {
    SCOPED_TRACE(kept.empty()      ? "moments in the tier"
                 : kept == guessed ? "every update guessed"
                                   : "first group's moments kept");
    const std::string tag = kept.empty() ? "" : kept == guessed ? "_guessed" : "_kept";
    const fs::path straight = config("resume_straight" + tag, "gpt2-tiny", true, 2);
    const fs::path split = config("resume_split" + tag, "gpt2-tiny", true, 2);
    const std::string budget = smallest_budget(straight, "disk", kept);
    ASSERT_FALSE(budget.empty());
    const std::string swap =
        " --set swap.budget=" + budget + " --set swap.dir=" + root_.string() + kept;
    const auto whole = run_cli("train -q --config " + straight.string() + swap);
    ASSERT_EQ(whole.code, 0) << whole.output;
    const auto first = run_cli("train -q --config " + split.string() + swap + " --stop-at 4");
    ASSERT_EQ(first.code, 0) << first.output;
    const auto second = run_cli("train -q --config " + split.string() + swap + " --resume");
    ASSERT_EQ(second.code, 0) << second.output;
    const fs::path a = root_ / ("run_resume_straight" + tag) / "checkpoints" / "step_00000006";
    const fs::path b = root_ / ("run_resume_split" + tag) / "checkpoints" / "step_00000006";
    EXPECT_TRUE(read_file(a / "model.safetensors") == read_file(b / "model.safetensors"));
    expect_same_moments(a, b);
  }
}

}  // namespace
