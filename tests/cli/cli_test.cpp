// End-to-end tests of the `starling` binary on data generated here: resuming is bit-identical to
// training straight through, and bad input of every kind ends in a clear error (exit code 2, a
// message naming what was wrong) instead of a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
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

namespace fs = std::filesystem;

namespace {

using Result = starling::testing::CliResult;

Result run(const std::string& args) { return starling::testing::run_cli(args); }

using starling::testing::read_file;
using starling::testing::rng_data_start;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("starling_cli_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "text");
    // A small corpus of pseudo-sentences: enough windows for a few steps and a val split.
    std::mt19937 rng(7);
    const char* words[] = {"the",    "jury",   "said", "city", "election", "was",   "of",   "and",
                           "report", "county", "that", "it",   "new",      "court", "judge"};
    for (int d = 0; d < 12; ++d) {
      std::ofstream out(root_ / "text" / ("doc" + std::to_string(d) + ".txt"));
      for (int s = 0; s < 60; ++s) {
        for (int w = 0; w < 12; ++w) out << words[rng() % 15] << (w == 11 ? ".\n" : " ");
      }
    }
    const Result prep = run("data prepare " + (root_ / "text").string() + " --out " +
                            (root_ / "data").string() + " --val-fraction 0.2");
    ASSERT_EQ(prep.code, 0) << prep.output;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // A config for a one-layer model that trains in well under a second per step.
  fs::path write_config(const std::string& name, const std::string& extra = "") {
    const fs::path path = root_ / (name + ".toml");
    std::ofstream(path) << "[model]\npreset = \"gpt2-tiny\"\nn_layer = 1\nd_model = 32\n"
                           "n_head = 2\nseq_len = 32\n"
                        << "[data]\ndir = \"" << (root_ / "data").string() << "\"\n"
                        << "[train]\nsteps = 8\nbatch_size = 4\ngrad_accum = 2\nthreads = 1\n"
                           "eval_every = 4\neval_batches = 2\ncheckpoint_every = 0\n"
                           "sample_at_end = false\nout_dir = \""
                        << (root_ / ("run_" + name)).string() << "\"\n"
                        << "[optim]\nlr = 1e-2\nwarmup_steps = 2\n"
                        << extra;
    return path;
  }

  static fs::path root_;
};
fs::path CliTest::root_;

TEST_F(CliTest, ResumeIsBitIdenticalToAStraightRun) {
  const Result straight = run("train -q --config " + write_config("straight").string());
  ASSERT_EQ(straight.code, 0) << straight.output;

  const fs::path split = write_config("split");
  const Result first = run("train -q --config " + split.string() + " --stop-at 4");
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("continue with --resume"), std::string::npos) << first.output;
  const Result second = run("train -q --config " + split.string() + " --resume");
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  // Each invocation's step records say where it began, which is how a report over the run's
  // records (pipeline.stages = "auto") reads the last invocation's alone.
  std::istringstream metrics(read_file(root_ / "run_split" / "metrics.jsonl"));
  std::vector<std::string> began;
  for (std::string line; std::getline(metrics, line);) {
    std::smatch m;
    if (std::regex_search(line, m, std::regex(R"re("run_from":([0-9]+).*"step":([0-9]+))re")))
      began.push_back(m[2].str() + " from " + m[1].str());
  }
  EXPECT_EQ(began, (std::vector<std::string>{"4 from 0", "8 from 4"}));

  const fs::path a = root_ / "run_straight" / "checkpoints" / "step_00000008";
  const fs::path b = root_ / "run_split" / "checkpoints" / "step_00000008";
  ASSERT_TRUE(fs::exists(a / "model.safetensors"));
  ASSERT_TRUE(fs::exists(b / "model.safetensors"));
  EXPECT_TRUE(read_file(a / "model.safetensors") == read_file(b / "model.safetensors"))
      << "weights after 8 straight steps differ from 4 + resume + 4";
  // The optimizer file, bit for bit, up to the saved RNG state: the generator is seeded from
  // train.seed, but its state serialises a struct with uninitialised padding, which may differ
  // between processes.
  const std::string opt_a = read_file(a / "optimizer.safetensors");
  const std::string opt_b = read_file(b / "optimizer.safetensors");
  const size_t rng_a = rng_data_start(opt_a), rng_b = rng_data_start(opt_b);
  ASSERT_GT(rng_a, 0u);
  ASSERT_EQ(rng_a, rng_b);
  EXPECT_TRUE(opt_a.compare(0, rng_a, opt_b, 0, rng_b) == 0)
      << "optimizer moments after 8 straight steps differ from 4 + resume + 4";
}

TEST_F(CliTest, RefusesToOverwriteARunWithoutResume) {
  const fs::path cfg = write_config("twice");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  const Result again = run("train -q --config " + cfg.string() + " --set train.steps=2");
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.output.find("already holds a checkpoint"), std::string::npos) << again.output;
}

// A run whose checkpoints/latest is lost (a copy that left it out, a hand's rm) still holds its
// checkpoints: a fresh run there is refused, as with the file, and --resume goes on from the
// newest. (A fresh run used to start there and write over them, step by step.)
TEST_F(CliTest, ACheckpointWithoutItsLatestFileIsStillTheRuns) {
  const fs::path cfg = write_config("no_latest", "");
  ASSERT_EQ(run("train -q --config " + cfg.string() +
                " --set train.steps=4 --set train.checkpoint_every=2")
                .code,
            0);
  const fs::path ckpts = root_ / "run_no_latest" / "checkpoints";
  ASSERT_TRUE(fs::remove(ckpts / "latest"));
  const std::string weights = read_file(ckpts / "step_00000004" / "model.safetensors");
  ASSERT_FALSE(weights.empty());
  const Result fresh = run("train -q --config " + cfg.string() + " --set train.steps=6");
  EXPECT_EQ(fresh.code, 2) << fresh.output;
  EXPECT_NE(fresh.output.find("already holds a checkpoint"), std::string::npos) << fresh.output;
  EXPECT_TRUE(fs::exists(ckpts / "step_00000002" / "model.safetensors"));
  EXPECT_TRUE(read_file(ckpts / "step_00000004" / "model.safetensors") == weights);
  // A lowered train.steps trains nothing, and says so.
  const Result none = run("train --config " + cfg.string() + " --resume --set train.steps=3");
  EXPECT_EQ(none.code, 0) << none.output;
  EXPECT_NE(none.output.find("checkpoints/latest is missing"), std::string::npos) << none.output;
  EXPECT_NE(none.output.find("nothing to train: the checkpoint is at step 4, and this run ends "
                             "before it (step 3: train.steps)"),
            std::string::npos)
      << none.output;
  EXPECT_TRUE(read_file(ckpts / "step_00000004" / "model.safetensors") == weights);
  const Result on = run("train -q --config " + cfg.string() + " --resume --set train.steps=6");
  EXPECT_EQ(on.code, 0) << on.output;
  EXPECT_NE(on.output.find("step_00000004 at step 4"), std::string::npos) << on.output;
  EXPECT_TRUE(fs::exists(ckpts / "step_00000006"));
}

// The export writes model.safetensors and config.json: never into a checkpoint (it would replace
// the weights it read) or a run, and never onto a file.
TEST_F(CliTest, ExportNeverWritesIntoACheckpointOrARun) {
  const fs::path cfg = write_config("export_into", "");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  const fs::path run_dir = root_ / "run_export_into";
  const fs::path ckpt = run_dir / "checkpoints" / "step_00000002";
  const std::string weights = read_file(ckpt / "model.safetensors");
  const fs::path file = root_ / "export_file";
  std::ofstream(file) << "x";
  for (const auto& [out, says] : std::vector<std::pair<fs::path, std::string>>{
           {ckpt, "holds a Starling checkpoint or dataset (meta.json)"},
           {run_dir, "holds a run's checkpoints"},
           {file, "is a file, not a directory"}}) {
    const Result r = run("export --checkpoint " + run_dir.string() + " --out " + out.string());
    EXPECT_EQ(r.code, 2) << out << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << r.output;
  }
  EXPECT_TRUE(read_file(ckpt / "model.safetensors") == weights);
}

// A run that starts from a Hugging Face model's directory is checked against its config.json,
// and `model from-hf` prints the [model] table that fits it.
TEST_F(CliTest, InitFromAModelsDirectoryChecksItsConfig) {
  const fs::path cfg = write_config("from_hf");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  const fs::path hf = root_ / "from_hf_export";
  ASSERT_EQ(
      run("export --checkpoint " + (root_ / "run_from_hf").string() + " --out " + hf.string()).code,
      0);
  const Result table = run("model from-hf " + hf.string());
  EXPECT_EQ(table.code, 0) << table.output;
  for (const char* line : {"[model]\n", "arch = \"gpt2\"\n", "n_layer = 1\n", "d_model = 32\n",
                           "n_head = 2\n", "seq_len = 32\n", "norm_eps = 1e-05\n"})
    EXPECT_NE(table.output.find(line), std::string::npos) << line << " not in " << table.output;

  const std::string from = " --set train.steps=1 --set train.init_from=\"" + hf.string() + "\"";
  const Result same = run("train -q --config " + cfg.string() + " --out " +
                          (root_ / "run_from_hf_same").string() + from);
  EXPECT_EQ(same.code, 0) << same.output;
  const Result wider = run("train -q --config " + cfg.string() + " --out " +
                           (root_ / "run_from_hf_wider").string() + from + " --set model.n_head=4");
  EXPECT_EQ(wider.code, 2) << wider.output;
  EXPECT_NE(wider.output.find("model.n_head = 4, the model's config.json says 2"),
            std::string::npos)
      << wider.output;
  EXPECT_NE(wider.output.find("starling model from-hf"), std::string::npos) << wider.output;
}

// A run starts from another run's weights by naming its Starling checkpoint: as it would from
// their Hugging Face export (the two end on the same bytes), and only with the same model.
TEST_F(CliTest, InitFromAStarlingCheckpointIsInitFromItsExport) {
  const fs::path cfg = write_config("from_ckpt");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  const fs::path source = root_ / "run_from_ckpt", hf = root_ / "from_ckpt_export";
  ASSERT_EQ(run("export --checkpoint " + source.string() + " --out " + hf.string()).code, 0);
  const auto start = [&](const std::string& out, const fs::path& from, const std::string& more) {
    return run("train -q --config " + cfg.string() + " --out " + (root_ / out).string() +
               " --set train.steps=2 --set train.init_from='\"" + from.string() + "\"'" + more);
  };
  for (const fs::path& from : {source, source / "checkpoints" / "step_00000002",
                               source / "checkpoints" / "step_00000002" / "model.safetensors"}) {
    const Result r = start("from_ckpt_starling", from, "");
    ASSERT_EQ(r.code, 0) << from << ": " << r.output;
    fs::remove_all(root_ / "from_ckpt_starling");
  }
  const Result starling = start("from_ckpt_starling", source, "");
  ASSERT_EQ(starling.code, 0) << starling.output;
  const Result exported = start("from_ckpt_hf", hf, "");
  ASSERT_EQ(exported.code, 0) << exported.output;
  const auto weights = [&](const std::string& out) {
    return read_file(root_ / out / "checkpoints" / "step_00000002" / "model.safetensors");
  };
  EXPECT_FALSE(weights("from_ckpt_starling").empty());
  EXPECT_TRUE(weights("from_ckpt_starling") == weights("from_ckpt_hf"));
  EXPECT_FALSE(weights("from_ckpt_starling") ==
               read_file(source / "checkpoints" / "step_00000002" / "model.safetensors"));
  const Result other = start("from_ckpt_other", source, " --set model.n_head=4");
  EXPECT_EQ(other.code, 2) << other.output;
  EXPECT_NE(other.output.find("differs from the config's [model]"), std::string::npos)
      << other.output;
  EXPECT_NE(other.output.find("model.n_head"), std::string::npos) << other.output;
}

// A SentencePiece model's ids are its own: a run started from a checkpoint trains on data of that
// model (another one, even of the same size, gives the ids other pieces), as data prepare
// --sp-model makes it.
TEST_F(CliTest, InitFromAStarlingCheckpointNeedsItsSentencePieceModel) {
  const auto prepare = [&](const std::string& out, const std::string& how) {
    return run("data prepare " + (root_ / "text").string() + " --out " + (root_ / out).string() +
               " --tokenizer sentencepiece " + how);
  };
  ASSERT_EQ(prepare("sp_one", "--vocab-size 300").code, 0);
  ASSERT_EQ(prepare("sp_two", "--vocab-size 300 --seed 2").code, 0);
  ASSERT_FALSE(read_file(root_ / "sp_one" / "tokenizer.model") ==
               read_file(root_ / "sp_two" / "tokenizer.model"));
  const fs::path cfg = write_config("sp_source");
  const std::string sp = " --set model.vocab_size=300 --set train.steps=1 --set data.dir='\"";
  ASSERT_EQ(
      run("train -q --config " + cfg.string() + sp + (root_ / "sp_one").string() + "\"'").code, 0);
  const fs::path source = root_ / "run_sp_source";
  ASSERT_EQ(prepare("sp_same",
                    "--sp-model " +
                        (source / "checkpoints" / "step_00000001" / "tokenizer.model").string())
                .code,
            0);
  const auto start = [&](const std::string& out, const std::string& data) {
    return run("train -q --config " + cfg.string() + " --out " + (root_ / out).string() + sp +
               (root_ / data).string() + "\"' --set train.init_from='\"" + source.string() + "\"'");
  };
  const Result other = start("sp_other", "sp_two");
  EXPECT_EQ(other.code, 2) << other.output;
  EXPECT_NE(other.output.find("is not the one the model of"), std::string::npos) << other.output;
  EXPECT_NE(other.output.find("--sp-model"), std::string::npos) << other.output;
  const Result same = start("sp_same_run", "sp_same");
  EXPECT_EQ(same.code, 0) << same.output;
}

// Two runs into one directory at once: the second is refused while the first holds it (it used
// to truncate the first's metrics.jsonl and write checkpoints beside it), and a run that ended,
// however it ended (here killed), leaves the directory free.
TEST_F(CliTest, TwoRunsAtOnceInOneDirectoryAreRefused) {
  const fs::path cfg = write_config("busy");
  const fs::path dir = root_ / "run_busy";
  starling::Process first({STARLING_CLI_PATH, "train", "-q", "--config", cfg.string(), "--set",
                           "train.steps=1000000", "--set", "train.eval_every=0"},
                          (root_ / "busy_first.log").string());
  // The lock file holds its holder's pid once it is taken.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string holder;
  while (holder.empty() && std::chrono::steady_clock::now() < until) {
    std::ifstream in(dir / ".lock");
    std::getline(in, holder);
    if (holder.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(holder, std::to_string(first.pid()));
  const Result second = run("train -q --config " + cfg.string() + " --set train.steps=2");
  EXPECT_EQ(second.code, 2) << second.output;
  EXPECT_NE(second.output.find(dir.string() + " is in use by another run (process " + holder + ")"),
            std::string::npos)
      << second.output;
  first.signal(SIGKILL);
  ASSERT_TRUE(first.wait(std::chrono::seconds(30)));
  // Free again: a resumed run takes it.
  const Result after = run("train -q --resume --config " + cfg.string() + " --set train.steps=2");
  EXPECT_EQ(after.code, 0) << after.output;
}

// A start that fails (a swap budget under one layer group; initial weights that are not there)
// leaves no directory it made, parents included; one that was there stays.
TEST_F(CliTest, AFailedStartLeavesNoDirectoryItMade) {
  const fs::path cfg = write_config("unstarted");
  const fs::path made = root_ / "made";
  for (const std::string& bad :
       {std::string("--set swap.budget=100KB"),
        "--set swap.budget=100KB --set swap.dir=" + (made / "swap").string(),
        "--set train.init_from=" + (root_ / "no-such-model").string()}) {
    const Result r = run("train -q --config " + cfg.string() + " --out " +
                         (made / "for" / "run").string() + " --set train.steps=2 " + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.output;
    EXPECT_FALSE(fs::exists(made)) << bad << ": the failed start left " << made;
  }
  fs::create_directories(made);
  const Result r = run("train -q --config " + cfg.string() + " --out " + made.string() +
                       " --set train.steps=2 --set swap.budget=100KB");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(fs::is_directory(made)) << "a directory that was there before the run went";
}

// A run stopped by a signal logs the step it stops at, whatever train.log_every says, beside the
// checkpoint it takes there.
TEST_F(CliTest, ARunStoppedByASignalLogsItsLastStep) {
  const fs::path cfg = write_config("signal");
  const fs::path log = root_ / "signal.log";
  starling::Process run_(
      {STARLING_CLI_PATH, "train", "-q", "--config", cfg.string(), "--set", "train.steps=1000000",
       "--set", "train.log_every=100000", "--set", "train.eval_every=0"},
      log.string());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(root_ / "run_signal" / "config.toml") &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  run_.signal(SIGINT);
  const auto code = run_.wait(std::chrono::seconds(60));
  ASSERT_TRUE(code);
  EXPECT_EQ(*code, 0);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("stopped at step ([0-9]+); checkpoint")))
      << text;
  std::ifstream metrics(root_ / "run_signal" / "metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  EXPECT_NE(last.find("\"step\":" + m[1].str() + ","), std::string::npos) << last;
  EXPECT_NE(last.find("\"loss\":"), std::string::npos) << last;
}

// A second Ctrl-C quits at once rather than after a step that may take minutes, and loses no
// checkpoint: the one before is still the run's, and the run resumes from it.
TEST_F(CliTest, ASecondSignalQuitsAtOnceAndKeepsTheCheckpoints) {
  const fs::path cfg = write_config("second_signal");
  const fs::path run_dir = root_ / "run_second_signal", log = root_ / "second_signal.log";
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  // Steps of a million micro-batches: far longer than the test waits.
  starling::Process run_(
      {STARLING_CLI_PATH, "train", "--config", cfg.string(), "--resume", "--set", "train.steps=4",
       "--set", "train.grad_accum=1000000", "--set", "train.peak_tflops=1"},
      log.string());
  // The run's header comes just before it takes the signals over (a signal before kills it).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(log).find(" | peak ") == std::string::npos &&
         std::chrono::steady_clock::now() < until && !run_.wait(std::chrono::milliseconds(0)))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  run_.signal(SIGINT);
  while (read_file(log).find("Ctrl-C again") == std::string::npos &&
         std::chrono::steady_clock::now() < until && !run_.wait(std::chrono::milliseconds(0)))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_NE(read_file(log).find("Ctrl-C again"), std::string::npos) << read_file(log);
  EXPECT_FALSE(run_.wait(std::chrono::milliseconds(300))) << "the first signal ended the step";
  // A second signal within a second of the first is taken for the same keypress delivered twice.
  run_.signal(SIGTERM);
  EXPECT_FALSE(run_.wait(std::chrono::milliseconds(1200))) << "a signal 0.3 s later quit";
  run_.signal(SIGINT);
  const auto code = run_.wait(std::chrono::seconds(10));
  ASSERT_TRUE(code) << "still running 10 s after a second SIGINT: " << read_file(log);
  EXPECT_EQ(*code, 128 + SIGINT) << read_file(log);
  EXPECT_NE(read_file(log).find("quitting now"), std::string::npos) << read_file(log);
  EXPECT_EQ(read_file(run_dir / "checkpoints" / "latest"), "step_00000002\n");
  const Result resumed = run("train -q --config " + cfg.string() + " --resume --set train.steps=3");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(run_dir / "checkpoints" / "step_00000003"));
}

// A file where a directory belongs, and a directory where a file does, are named as such (they
// used to surface as the C++ library's "Not a directory" or "basic_filebuf::underflow").
TEST_F(CliTest, AFileWhereADirectoryBelongsIsNamed) {
  const fs::path cfg = write_config("wrong_kind");
  const fs::path file = root_ / "wrong_kind_file";
  std::ofstream(file) << "x";
  for (const std::string& peers :
       {std::string(), std::string(" --peers 2 --set strategy.kind=\"ddp\"")}) {
    const Result r = run("train -q --config " + cfg.string() + " --out " + file.string() + peers);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("train.out_dir: " + file.string() + " is a file, not a directory"),
              std::string::npos)
        << r.output;
  }
  const fs::path data = root_ / "meta_is_a_dir";
  fs::create_directories(data / "meta.json");
  const Result r =
      run("train -q --config " + cfg.string() + " --set data.dir='\"" + data.string() + "\"'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find((data / "meta.json").string() + "' is a directory, not a file"),
            std::string::npos)
      << r.output;
}

// A signal during a long evaluation ends it (no validation loss) and the run saves its steps;
// it used to go on evaluating, and a second signal had nothing to stop.
TEST_F(CliTest, ASignalEndsALongEvaluationAndTheRunKeepsItsSteps) {
  const fs::path cfg = write_config("eval_signal");
  const fs::path log = root_ / "eval_signal.log";
  starling::Process run_({STARLING_CLI_PATH, "train", "--config", cfg.string(), "--set",
                          "train.steps=2", "--set", "train.eval_batches=100000000"},
                         log.string());
  // The evaluation comes after step 2's record.
  const fs::path metrics = root_ / "run_eval_signal" / "metrics.jsonl";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_file(metrics).find("\"step\":2,") == std::string::npos &&
         std::chrono::steady_clock::now() < until && !run_.wait(std::chrono::milliseconds(0)))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  run_.signal(SIGTERM);
  const auto code = run_.wait(std::chrono::seconds(60));
  ASSERT_TRUE(code) << "still evaluating a minute after SIGTERM: " << read_file(log);
  EXPECT_EQ(*code, 0) << read_file(log);
  EXPECT_NE(read_file(log).find("step 2: evaluation stopped by the signal"), std::string::npos)
      << read_file(log);
  // The checkpoint says it has no validation loss (not step 0's, or none of an earlier one).
  EXPECT_NE(read_file(root_ / "run_eval_signal" / "checkpoints" / "step_00000002" / "meta.json")
                .find("\"val_loss\": -1"),
            std::string::npos);
}

// A validation split the run cannot evaluate (here: no window of seq_len + 1 tokens in it) is
// found before the training, not after it, and named.
TEST_F(CliTest, AValidationSplitWithoutABatchIsFoundBeforeTraining) {
  const fs::path cfg = write_config("val_short");
  const Result r = run("train -q --config " + cfg.string() +
                       " --set model.seq_len=16384 --set train.batch_size=1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the validation split of " + (root_ / "data").string()),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(root_ / "run_val_short")) << "a failed start leaves no directory";
}

TEST_F(CliTest, ResumeWithADifferentModelIsAnError) {
  const fs::path cfg = write_config("mismatch");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --stop-at 2").code, 0);
  const Result r = run("train -q --config " + cfg.string() + " --resume --set model.d_model=64");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("differs from the config's [model]"), std::string::npos) << r.output;
  // It names the keys that differ, and only those.
  EXPECT_NE(r.output.find("  model.d_model: the checkpoint's "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", the config's 64\n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("model.n_layer"), std::string::npos) << r.output;
}

TEST_F(CliTest, SampleFromCheckpoint) {
  const fs::path cfg = write_config("sample");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  const Result r = run("sample --checkpoint " + (root_ / "run_sample").string() +
                       " --prompt 'the jury' --max-tokens 20 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("the jury", 0), 0u) << r.output;
  EXPECT_GE(r.output.size(), 8u + 20u);

  // A nucleus so small that only the likeliest token is in it samples what greedy picks.
  const std::string greedy = r.output;
  const Result nucleus = run("sample --checkpoint " + (root_ / "run_sample").string() +
                             " --prompt 'the jury' --max-tokens 20 --temperature 1 --top-p 1e-6");
  ASSERT_EQ(nucleus.code, 0) << nucleus.output;
  EXPECT_EQ(nucleus.output, greedy);
  // So do the tiniest temperatures (the logits over them used to overflow into NaN): 1e-45 is
  // the smallest float, 1e-46 is 0 as a float, 1e-400 is 0 as a double.
  for (const char* t : {"1e-45", "1e-46", "1e-400"}) {
    const Result cold = run("sample --checkpoint " + (root_ / "run_sample").string() +
                            " --prompt 'the jury' --max-tokens 20 --temperature " + t);
    ASSERT_EQ(cold.code, 0) << t << ": " << cold.output;
    EXPECT_EQ(cold.output, greedy) << t;
  }
  const Result nan = run("sample --checkpoint " + (root_ / "run_sample").string() +
                         " --max-tokens 2 --temperature nan");
  EXPECT_EQ(nan.code, 2) << nan.output;
  EXPECT_NE(nan.output.find("--temperature: must be a finite number >= 0, got nan"),
            std::string::npos)
      << nan.output;
  // A stop text ends the sample just before its first appearance after the prompt.
  const std::string generated = greedy.substr(8, greedy.size() - 9);  // minus the newline
  ASSERT_GE(generated.size(), 8u);
  // A printable character of the generated text that first appears after its start, so the cut
  // keeps something (a byte-level model may also write quotes and controls: those are skipped).
  std::string stop;
  for (size_t i = 1; i < generated.size() && stop.empty(); ++i)
    if (std::isprint(static_cast<unsigned char>(generated[i])) && generated[i] != '\'' &&
        generated.find(generated[i]) == i)
      stop = generated.substr(i, 1);
  ASSERT_FALSE(stop.empty()) << "no character to stop at in the greedy sample: " << greedy;
  const Result stopped =
      run("sample --checkpoint " + (root_ / "run_sample").string() +
          " --prompt 'the jury' --max-tokens 20 --temperature 0 --stop '" + stop + "'");
  ASSERT_EQ(stopped.code, 0) << stopped.output;
  EXPECT_EQ(stopped.output, "the jury" + generated.substr(0, generated.find(stop)) + "\n");
  for (const char* p : {"0", "1.5", "-1", "x"}) {
    const Result bad =
        run("sample --checkpoint " + (root_ / "run_sample").string() + " --top-p " + p);
    EXPECT_NE(bad.code, 0) << p;
    EXPECT_NE(bad.output.find(std::string("--top-p: must be")), std::string::npos) << bad.output;
    EXPECT_NE(bad.output.find(std::string("got ") + p), std::string::npos) << bad.output;
  }
  // On one thread (another reduction order: the text may differ in a near tie).
  const Result one = run("sample --checkpoint " + (root_ / "run_sample").string() +
                         " --prompt 'the jury' --max-tokens 20 --temperature 0 --threads 1");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_EQ(one.output.rfind("the jury", 0), 0u) << one.output;
  EXPECT_NE(run("sample --checkpoint " + (root_ / "run_sample").string() + " --threads -1").code,
            0);
}

// Text through GPT-2's BPE trains a model of GPT-2's vocabulary, and its checkpoint samples text
// back through the dataset's own copy of the BPE files.
TEST_F(CliTest, GptTwoTokensTrainAndSampleText) {
  const fs::path bpe = fs::path(STARLING_SOURCE_DIR) / "data" / "gpt2";
  if (!fs::is_regular_file(bpe / "vocab.bpe"))
    GTEST_SKIP() << "GPT-2's BPE files are not in " << bpe
                 << ": run scripts/fetch-gpt2-bpe.sh (make test does)";
  const Result prep =
      run("data prepare " + (root_ / "text").string() + " --out " + (root_ / "data_gpt2").string() +
          " --tokenizer gpt2 --bpe " + bpe.string() + " --val-fraction 0.2");
  ASSERT_EQ(prep.code, 0) << prep.output;
  EXPECT_NE(prep.output.find("gpt2 tokenizer, vocab 50257"), std::string::npos) << prep.output;
  const fs::path cfg = write_config("gpt2_tokens");
  const Result train =
      run("train -q --config " + cfg.string() + " --set 'data.dir=\"" +
          (root_ / "data_gpt2").string() + "\"' --set model.vocab_size=50257 --set train.steps=2");
  ASSERT_EQ(train.code, 0) << train.output;
  const Result r = run("sample --checkpoint " + (root_ / "run_gpt2_tokens").string() +
                       " --prompt 'the jury said' --max-tokens 5 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("the jury said", 0), 0u) << r.output;
  // Without the files, preparing says where they should come from.
  const Result missing = run("data prepare " + (root_ / "text").string() + " --out " +
                             (root_ / "data_nobpe").string() + " --tokenizer gpt2 --bpe " +
                             (root_ / "nowhere").string());
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.output.find("fetch it with scripts/fetch-gpt2-bpe.sh"), std::string::npos)
      << missing.output;
}

// `starling eval` over the batches the run evaluated gives the run's own final validation loss
// (the same windows, in the same order, summed the same way), and bad options are clear errors.
TEST_F(CliTest, EvalGivesTheRunsValidationLoss) {
  const fs::path cfg = write_config("eval");
  ASSERT_EQ(run("train -q --config " + cfg.string()).code, 0);
  double run_loss = 0;
  {
    std::ifstream in(root_ / "run_eval" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (const auto at = line.find("\"val_loss\":"); at != std::string::npos)
        run_loss = std::stod(line.substr(at + 11));
  }
  ASSERT_GT(run_loss, 0);
  const fs::path json = root_ / "eval.json";
  const Result r = run("eval -q --checkpoint " + (root_ / "run_eval").string() +
                       " --batches 2 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("perplexity"), std::string::npos) << r.output;
  std::ifstream in(json);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("\"loss\":");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_NEAR(std::stod(text.substr(at + 7)), run_loss, 1e-9) << text;

  const Result whole =
      run("eval -q --checkpoint " + (root_ / "run_eval").string() + " --threads 1");
  EXPECT_EQ(whole.code, 0) << whole.output;
  const Result split =
      run("eval -q --checkpoint " + (root_ / "run_eval").string() + " --split test");
  EXPECT_NE(split.code, 0);
  EXPECT_NE(split.output.find("\"test\" is not a split"), std::string::npos) << split.output;
  const Result big =
      run("eval -q --checkpoint " + (root_ / "run_eval").string() + " --batch-size 100000");
  EXPECT_NE(big.code, 0);
  EXPECT_NE(big.output.find("smaller --batch-size"), std::string::npos) << big.output;
}

struct BadConfigCase {
  const char* name;
  std::string extra;  // appended TOML or --set flags
  bool as_flags;
  const char* expected;  // substring of the error
};

TEST_F(CliTest, BadConfigsNameTheKey) {
  const std::vector<BadConfigCase> cases = {
      {"unknown_key", "stepz = 3\n", false, "unknown key \"optim.stepz\""},
      {"unknown_table", "[trian]\nsteps = 3\n", false, "unknown table [trian]"},
      {"wrong_type", "--set train.steps='\"ten\"'", true, "train.steps: expected an integer"},
      {"bad_enum", "--set optim.schedule=linear", true, "optim.schedule: expected one of"},
      {"bad_preset", "--set model.preset=gpt5", true, "unknown preset \"gpt5\""},
      {"bad_heads", "--set model.n_head=3", true, "must be divisible by model.n_head"},
      {"vocab_too_small", "--set model.vocab_size=100", true,
       "model.vocab_size (100) is smaller than the vocabulary of the data"},
      {"bad_set", "--set trainsteps", true, "expected table.key=value"},
      {"bad_device", "--set train.device=gpu", true, "train.device: expected \"cpu\", \"cuda\""},
      {"bad_allocator", "--set train.cpu_allocator=jemalloc", true,
       "train.cpu_allocator: expected one of \"caching\", \"system\""},
  };
  for (const auto& c : cases) {
    const fs::path cfg = write_config(std::string("bad_") + c.name, c.as_flags ? "" : c.extra);
    const Result r = run("train -q --config " + cfg.string() + (c.as_flags ? " " + c.extra : ""));
    EXPECT_EQ(r.code, 2) << c.name << ": " << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.name << ": " << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
  const Result missing = run("train --config " + (root_ / "nope.toml").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.output.find("nope.toml: cannot read config file"), std::string::npos);
  const fs::path syntax = root_ / "syntax.toml";
  std::ofstream(syntax) << "[train]\nsteps = = 3\n";
  const Result bad_syntax = run("train --config " + syntax.string());
  EXPECT_EQ(bad_syntax.code, 2);
  EXPECT_NE(bad_syntax.output.find("syntax.toml:2: invalid TOML"), std::string::npos)
      << bad_syntax.output;
}

TEST_F(CliTest, BadDataFilesNameTheFile) {
  // Copy the dataset and damage the copy.
  const fs::path bad = root_ / "bad_data";
  fs::remove_all(bad);
  fs::copy(root_ / "data", bad, fs::copy_options::recursive);
  const fs::path shard = bad / "train_000.bin";
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 10);
  const fs::path cfg = write_config("bad_data");
  Result r = run("train -q --config " + cfg.string() + " --set data.dir=" + bad.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train_000.bin"), std::string::npos) << r.output;

  fs::resize_file(shard, size);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t wrong = 12345;
    f.write(reinterpret_cast<const char*>(&wrong), sizeof wrong);
  }
  r = run("train -q --config " + cfg.string() + " --set data.dir=" + bad.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train_000.bin"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("magic"), std::string::npos) << r.output;

  r = run("train -q --config " + cfg.string() + " --set data.dir=" + (root_ / "absent").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("data.dir = \"" + (root_ / "absent").string() +
                          "\": no such dataset directory"),
            std::string::npos)
      << r.output;
  // A relative path: the message says what it was resolved against.
  r = run("train -q --config " + cfg.string() + " --set data.dir=no/such/data");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("resolved against the working directory, " + fs::current_path().string()),
            std::string::npos)
      << r.output;
}

TEST_F(CliTest, ATokenTheModelCannotEmbedNamesTheShardAndPosition) {
  // Every token of a copy's training shard becomes 4000, past the byte vocabulary of 256: the
  // first batch must stop with an error naming the shard and the token, not a libtorch trace.
  const fs::path bad = root_ / "big_tokens";
  fs::remove_all(bad);
  fs::copy(root_ / "data", bad, fs::copy_options::recursive);
  const fs::path shard = bad / "train_000.bin";
  const auto tokens = (fs::file_size(shard) - 1024) / 2;  // after the 256-int32 header
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024);
    const std::vector<uint16_t> big(tokens, 4000);
    f.write(reinterpret_cast<const char*>(big.data()),
            static_cast<std::streamsize>(big.size() * sizeof(uint16_t)));
  }
  const fs::path cfg = write_config("big_tokens");
  const Result r = run("train -q --config " + cfg.string() + " --set data.dir=" + bad.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train_000.bin: token 4000 at token index"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("model.vocab_size"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("index out of range"), std::string::npos) << r.output;
}

// A disk that fills up: small tmpfs mounts in a private mount namespace (root only; CI is root).
// A checkpoint of this model takes 272 KB (estimated at about 340 KB): 500 KB hold one, 760 KB two
// but not three.
// With "stop" the run ends at the checkpoint that does not fit, naming the directory and the
// bytes, the previous checkpoint intact and nothing half-written left; after room is made,
// --resume goes on. With "continue" it trains to the end and only the last checkpoint is an
// error. With keep_checkpoints = 2 the older checkpoint is removed early to make room.
TEST_F(CliTest, AFullDiskKeepsThePreviousCheckpointAndStopsOrGoesOn) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs (CI runs as root)";
  if (std::system("unshare -m true >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "unshare -m is not available here (no mount namespaces)";
  const fs::path cfg = write_config("full_disk");
  const fs::path d = root_ / "full_disk";
  fs::remove_all(d);
  const fs::path script = root_ / "full_disk.sh";
  std::ofstream(script) << "d=" << d.string() << "\nS=" << STARLING_CLI_PATH
                        << "\nCFG=" << cfg.string() << R"SH(
mkdir -p $d/a $d/b $d/c
mount -t tmpfs -o size=500k tmpfs $d/a || { echo MOUNT_FAILED; exit 0; }
mount -t tmpfs -o size=500k tmpfs $d/b
mount -t tmpfs -o size=760k tmpfs $d/c
run() { out=$1; shift; $S train -q --config $CFG --set train.steps=6 --set train.checkpoint_every=2 \
  --set train.eval_every=0 --set train.log_every=1 --set "train.out_dir=\"$out\"" "$@"; }
run $d/a/run --set train.keep_checkpoints=1; echo "A_EXIT=$?"
echo "A_FILES=$(ls -A $d/a/run/checkpoints | tr '\n' ' ')"
echo "A_LATEST=$(cat $d/a/run/checkpoints/latest)"
mount -o remount,size=8m $d/a
run $d/a/run --set train.keep_checkpoints=1 --resume; echo "A_RESUME_EXIT=$?"
echo "A_AFTER=$(cat $d/a/run/checkpoints/latest)"
run $d/b/run --set train.keep_checkpoints=1 --set 'train.on_checkpoint_error="continue"'
echo "B_EXIT=$?"
echo "B_STEPS=$(grep -c '"loss"' $d/b/run/metrics.jsonl)"
echo "B_FILES=$(ls -A $d/b/run/checkpoints | tr '\n' ' ')"
run $d/c/run --set train.keep_checkpoints=2; echo "C_EXIT=$?"
echo "C_FILES=$(ls -A $d/c/run/checkpoints | tr '\n' ' ')"
mkdir -p $d/d $d/e
mount -t tmpfs -o size=3m tmpfs $d/d
mount -t tmpfs -o size=20m tmpfs $d/e
swapped() { run $d/run_$1 --set model.n_layer=2 --set 'swap.budget="500KB"' \
  --set "swap.dir=\"$d/$1\""; }
swapped d; echo "D_EXIT=$?"
swapped e; echo "E_EXIT=$?"
)SH";
  FILE* p = ::popen(("unshare -m sh " + script.string() + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ::pclose(p);
  if (out.find("MOUNT_FAILED") != std::string::npos)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << out;
  auto has = [&](const std::string& s) { return out.find(s) != std::string::npos; };

  // stop: the checkpoint of step 4 does not fit beside step 2's.
  EXPECT_TRUE(has("A_EXIT=2")) << out;
  EXPECT_TRUE(has((d / "a" / "run" / "checkpoints").string() +
                  ": the checkpoint of step_00000004 needs about"))
      << out;
  EXPECT_TRUE(has("MB free; the newest checkpoint, step_00000002, is intact; free some space"))
      << out;
  EXPECT_TRUE(has("A_FILES=latest step_00000002 \n")) << out;  // no .tmp- left behind
  EXPECT_TRUE(has("A_LATEST=step_00000002")) << out;
  EXPECT_TRUE(has("A_RESUME_EXIT=0")) << out;
  EXPECT_TRUE(has("A_AFTER=step_00000006")) << out;
  // continue: step 4's checkpoint is skipped, training reaches step 6, whose checkpoint must fit.
  EXPECT_TRUE(has("checkpoint at step 4 skipped")) << out;
  EXPECT_TRUE(has("B_EXIT=2")) << out;
  EXPECT_TRUE(has("B_STEPS=6")) << out;
  EXPECT_TRUE(has("B_FILES=latest step_00000002 \n")) << out;
  // keep 2: step 2's checkpoint makes room for step 6's.
  EXPECT_TRUE(has("removed checkpoint step_00000002 to make room for step_00000006")) << out;
  EXPECT_TRUE(has("C_EXIT=0")) << out;
  EXPECT_TRUE(has("C_FILES=latest step_00000004 step_00000006 \n")) << out;
  // A swap.dir without room for the disk tier's bandwidth probe (8 MiB at least, more than this
  // model's 836 KB of state) is told so before the run starts; it used to pass the check and fail
  // on the swap file, and the probe took 32 MiB however small the state.
  EXPECT_TRUE(has("D_EXIT=2")) << out;
  EXPECT_TRUE(has("reserves room there for its bandwidth probe, before the training state's"))
      << out;
  if (has("E_EXIT=2") && has("O_DIRECT"))
    GTEST_LOG_(INFO) << "this kernel's tmpfs takes no O_DIRECT: the 20 MB case is not tried";
  else
    EXPECT_TRUE(has("E_EXIT=0")) << out;
}

TEST_F(CliTest, BadCheckpointsNameTheFile) {
  const fs::path cfg = write_config("bad_ckpt");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  const fs::path ckpt = root_ / "run_bad_ckpt" / "checkpoints" / "step_00000002";
  const fs::path model = ckpt / "model.safetensors";
  const std::string good = read_file(model);

  std::ofstream(model, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2);
  Result r = run("sample --checkpoint " + ckpt.string() + " --max-tokens 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;

  std::ofstream(model, std::ios::binary | std::ios::trunc) << "\xff\xff\xff\xff\xff\xff\xff\x7f{}";
  r = run("sample --checkpoint " + ckpt.string() + " --max-tokens 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("header length"), std::string::npos) << r.output;

  std::ofstream(model, std::ios::binary | std::ios::trunc) << good;
  std::ofstream(ckpt / "meta.json", std::ios::trunc) << "{\"format\": \"starling-checkpoint\"";
  r = run("sample --checkpoint " + ckpt.string() + " --max-tokens 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("meta.json: not valid JSON"), std::string::npos) << r.output;

  r = run("sample --checkpoint " + (root_ / "nowhere").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no checkpoint found"), std::string::npos) << r.output;
}

// meta.json fields that parse but cannot be (a step above int64, negative tokens, another step
// than the directory's), a saved config or loader state that fails, tokens of another kind at
// --resume, and weights that are not finite: each refused, naming the checkpoint's file.
TEST_F(CliTest, ACheckpointThatContradictsItselfIsRefused) {
  const fs::path cfg = write_config("meta_agree");
  ASSERT_EQ(run("train -q --config " + cfg.string() + " --set train.steps=2").code, 0);
  const fs::path ckpt = root_ / "run_meta_agree" / "checkpoints" / "step_00000002";
  const fs::path meta = ckpt / "meta.json", model = ckpt / "model.safetensors";
  const std::string good_meta = read_file(meta), good_model = read_file(model);
  const std::string sample = "sample --checkpoint " + ckpt.string() + " --max-tokens 2";
  const std::string resume = "train -q --config " + cfg.string() + " --resume";
  auto edit_meta = [&](const std::string& from, const std::string& to) {
    std::string text = good_meta;
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " not in " << text;
    std::ofstream(meta, std::ios::trunc) << text.replace(at, from.size(), to);
  };
  auto expect_refused = [&](const std::string& command, const std::string& says,
                            const fs::path& names) {
    const Result r = run(command);
    EXPECT_EQ(r.code, 2) << command << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << command << ": " << r.output;
    EXPECT_NE(r.output.find(names.string()), std::string::npos) << command << ": " << r.output;
  };
  struct Case {
    std::string from, to, says;
  };
  for (const Case& c : std::vector<Case>{
           {"\"step\": 2", "\"step\": 1e30", "field \"step\" must be a whole number"},
           {"\"step\": 2", "\"step\": 5", "says step 5, but its directory is step_00000002"},
           {"\"tokens\": ", "\"tokens\": -", "field \"tokens\" must be a whole number"},
           {"\"vocab_size\": 256", "\"vocab_size\": 100000", "more than its model's vocabulary"},
           {"preset = 'gpt2-tiny'", "preset = 'gpt2-bogus'", "unknown preset \"gpt2-bogus\""}}) {
    SCOPED_TRACE(c.to);
    edit_meta(c.from, c.to);
    expect_refused(sample, c.says, meta);
    expect_refused(resume, c.says, meta);
  }
  // Only a run reads the loader's state and the data's kind of tokens.
  edit_meta("\"cursor\": ", "\"cursor\": 1000000000");
  expect_refused(resume, "is past this peer's", meta);
  edit_meta("\"kind\": \"byte\"", "\"kind\": \"gpt2\"");
  expect_refused(resume, "holds byte tokens, but the model of", ckpt);

  // A NaN in the weights (the first element of the file's first tensor): evaluating or exporting
  // it used to succeed with "loss nan".
  std::ofstream(meta, std::ios::trunc) << good_meta;
  std::string nan_model = good_model;
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i)
    header |= uint64_t{static_cast<unsigned char>(nan_model[i])} << (8 * i);
  const unsigned char nan_bits[4] = {0x00, 0x00, 0xc0, 0x7f};  // a quiet NaN, little-endian
  nan_model.replace(8 + header, 4, reinterpret_cast<const char*>(nan_bits), 4);
  std::ofstream(model, std::ios::binary | std::ios::trunc) << nan_model;
  for (const std::string& command :
       {sample, "eval -q --checkpoint " + ckpt.string() + " --batches 1",
        "export --checkpoint " + ckpt.string() + " --out " + (root_ / "nan_export").string()})
    expect_refused(command, "holds values that are not finite", model);
  EXPECT_FALSE(fs::exists(root_ / "nan_export" / "model.safetensors"));

  std::ofstream(model, std::ios::binary | std::ios::trunc) << good_model;
  const Result r = run(resume + " --set train.steps=3");
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(CliTest, BadCommandLinesAreUsageErrors) {
  EXPECT_NE(run("").code, 0);
  Result typo = run("trian --config x.toml");
  EXPECT_EQ(typo.code, 2) << typo.output;
  EXPECT_NE(typo.output.find("unknown command \"trian\""), std::string::npos) << typo.output;
  EXPECT_NE(typo.output.find("train"), std::string::npos) << typo.output;
  for (const char* device : {"tpu", "cuda:-1"}) {
    const Result bad = run(std::string("bench compute --steps 1 --device ") + device);
    EXPECT_EQ(bad.code, 2) << bad.output;
    EXPECT_NE(bad.output.find("--device = \"" + std::string(device) + "\": not a device"),
              std::string::npos)
        << bad.output;
  }
  const Result help = run("help");
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_NE(help.output.find("Subcommands:"), std::string::npos) << help.output;
  EXPECT_NE(run("train --no-such-flag").code, 0);
  Result r = run("sample --checkpoint x --max-tokens -3");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  // A link rate is checked before any namespace is made (it used to fail in scripts/netlab.sh).
  for (const std::string rate : {"fast", "5", ""}) {
    r = run("train --config x.toml --peers 2 --link-rate '" + rate + "'");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("\"" + rate + "\" is not a rate"), std::string::npos) << r.output;
  }
  // Past any link (and past netlab.sh's arithmetic, where it used to fail).
  for (const std::string rate : {"99999999999999999999tbit", "101tbit"}) {
    r = run("train --config x.toml --peers 2 --link-rate " + rate);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("faster than 100tbit"), std::string::npos) << r.output;
  }
  // bench compute times the model: a run's keys were ignored without a word.
  r = run("bench compute --set train.steps=5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("model keys only"), std::string::npos) << r.output;
  // --out is train.out_dir: giving both is refused rather than one silently winning.
  r = run("train --config x.toml --out a --set train.out_dir=b");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("both give the output directory"), std::string::npos) << r.output;
  // A step to stop at is 1 or more: 0 or a negative one used to pass unchecked.
  // Past int64's largest, CLI11 reads the largest: capped below, it is refused.
  for (const char* bad : {"0", "-3", "9223372036854775808"}) {
    r = run(std::string("train --config x.toml --stop-at ") + bad);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("--stop-at"), std::string::npos) << r.output;
  }
}

TEST_F(CliTest, BenchProfileWritesATraceOrSaysWhyNot) {
  // A libtorch with Kineto writes a Chrome trace; one without (Debian's) must say so up front,
  // as a configuration error, not die with a libtorch backtrace after the run.
  const fs::path trace = root_ / "trace.json";
  const Result r =
      run("bench compute --preset gpt2-tiny --batch 1 --steps 1 --warmup 0 "
          "--threads 1 --profile " +
          trace.string());
  if (r.code == 0) {
    EXPECT_NE(read_file(trace).find("traceEvents"), std::string::npos);
  } else {
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("--profile"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(trace));
  }
}

TEST_F(CliTest, PlanProfileAndPipeline) {
  // The cost table of a one-layer model: 6 nodes, each cut carrying one 4 x 32 x 32 fp32
  // activation (the residual stream), none after the loss.
  const fs::path cfg = write_config("plan_pipeline");
  const fs::path table = root_ / "plan_pipeline.json";
  Result r = run("plan profile -c " + cfg.string() + " -o " + table.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("profiled 6 nodes"), std::string::npos) << r.output;
  const std::string text = read_file(table);
  EXPECT_NE(text.find("\"starling-cost-table\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"cut_bytes\": 16384"), std::string::npos) << text;
  // --steady-seconds: the steady passes go on for that long (their mean is the table's).
  const auto t0 = std::chrono::steady_clock::now();
  r = run("plan profile -c " + cfg.string() + " -o " + (root_ / "steady.json").string() +
          " --steady-seconds 0.5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
  EXPECT_NE(r.output.find("profiled 6 nodes"), std::string::npos) << r.output;
  r = run("plan profile -c " + cfg.string() + " -o " + (root_ / "steady.json").string() +
          " --steady-seconds -1");
  EXPECT_EQ(r.code, 2) << r.output;  // CLI11's own check, with the project's code
  EXPECT_NE(r.output.find("--steady-seconds"), std::string::npos) << r.output;

  r = run("plan pipeline --profile " + table.string() +
          " --speeds 1,1,0.5 --link-rate 1gbit --micro-batches 8");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("OP-Fence:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("predicted step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("for 8 micro-batches"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("even split by node count"), std::string::npos) << r.output;
  r = run("plan pipeline --profile " + table.string() +
          " --speeds 1,1,1,1 --link-rate 1gbit --link 0-2=10mbit --link 1-3=10mbit "
          "--link 0-3=10mbit --link 1-2=10mbit");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 groups of devices by bandwidth"), std::string::npos) << r.output;
  // A star: each device's one upload carries a middle stage's two directions.
  r = run("plan pipeline --profile " + table.string() +
          " --speeds 1,1,1 --link-rate 10kbit --egress 10kbit");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("sends both ways through one upload"), std::string::npos) << r.output;

  // Bad input names what is wrong.
  r = run("plan pipeline --profile " + root_.string() + " --speeds 1,1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("is a directory, not a cost table"), std::string::npos) << r.output;
  r = run("plan pipeline --profile " + table.string() + " --speeds 1,x");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--speeds: \"x\" is not a speed > 0"), std::string::npos) << r.output;
  r = run("plan pipeline --profile " + table.string() + " --link 0-5=1gbit");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--link 0-5=1gbit"), std::string::npos) << r.output;
  r = run("plan pipeline --profile " + table.string() + " --link-rate fast");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--link-rate = \"fast\""), std::string::npos) << r.output;
  // train --link-rate refuses it: so does the planner.
  r = run("plan pipeline --profile " + table.string() + " --speeds 1 --link-rate 1e30gbit");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("faster than 100tbit"), std::string::npos) << r.output;
  // A simulation of 10^8 micro-batches ran for minutes: the most train.grad_accum takes.
  r = run("plan pipeline --profile " + table.string() + " --speeds 1 --micro-batches 100000000");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--micro-batches"), std::string::npos) << r.output;
  r = run("plan pipeline --profile " + table.string() + " --egress 5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--egress = \"5\""), std::string::npos) << r.output;
  r = run("plan pipeline --profile " + (root_ / "absent.json").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("absent.json"), std::string::npos) << r.output;
}

TEST_F(CliTest, ListKeysAndModelShow) {
  Result r = run("train --list-keys");
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("optim.warmup_steps"), std::string::npos);
  // Defaults as a person writes them: the shortest text of the double, still a TOML float.
  EXPECT_NE(r.output.find("optim.beta2  float  0.95  "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optim.grad_clip  float  1.0  "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.norm_eps  float  1e-05  "), std::string::npos) << r.output;
  r = run("model show --preset llama-tiny");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("layers.3.mlp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("total:"), std::string::npos) << r.output;
}

}  // namespace
