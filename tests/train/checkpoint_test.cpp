// Checkpoints: a save reads back bit for bit; find_checkpoint resolves run/checkpoints/step
// directories; bad files are CheckpointErrors naming the file and field; and — the point of the
// design — a process killed at any stage of a save leaves the previous checkpoint the one that
// loads. Also AdamW and gradient clipping against hand computations of torch's formulas.
#include "starling/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../data/test_util.h"
#include "starling/common/error.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"

namespace starling::train {
namespace {

namespace fs = std::filesystem;
using data::testing::read_bytes;
using data::testing::TempDir;
using data::testing::write_text;

model::ModelConfig tiny() {
  auto c = model::preset("gpt2-tiny");
  c.n_layer = 1;
  c.seq_len = 16;
  return c;
}

std::vector<at::Tensor> batch(const model::ModelConfig& c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = at::randint(c.vocab_size, {2, c.seq_len + 1}, gen, at::kLong);
  return {tokens.narrow(1, 0, c.seq_len).contiguous(), tokens.narrow(1, 1, c.seq_len).contiguous()};
}

// A model and an optimizer that has taken one step (so its moments are not zero).
struct Trained {
  model::ModelConfig config;
  std::unique_ptr<graph::OpDag> dag;
  std::unique_ptr<AdamW> opt;

  explicit Trained(model::ModelConfig c = tiny(), uint64_t seed = 1) : config(c) {
    dag = model::build_model(c, seed);
    opt = std::make_unique<AdamW>(dag->params(), AdamWOptions{});
    graph::Executor exec(*dag);
    exec.forward_backward(batch(c, seed + 100));
    opt->step(1e-3);
  }
  graph::ParamStore& params() { return dag->params(); }
};

CheckpointMeta meta(int64_t step) {
  CheckpointMeta m;
  m.step = step;
  m.tokens = 1000 * static_cast<uint64_t>(step) + 7;
  m.loader.epoch = 2;
  m.loader.cursor = 31 + static_cast<uint64_t>(step);
  m.config_toml = "[data]\ndir = \"x\"\n# step " + std::to_string(step) + "\n";
  m.tokenizer_kind = "byte";
  m.data_vocab_size = 256;
  m.val_loss = 2.5 + static_cast<double>(step) / 1000;
  return m;
}

std::vector<at::Tensor> snapshot(const graph::ParamStore& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params.params()) out.push_back(p.value.detach().clone());
  return out;
}

void expect_params_equal(const graph::ParamStore& params, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(params.params().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(at::equal(params.params()[i].value, want[i])) << params.params()[i].name;
}

void perturb(graph::ParamStore& params, double by) {
  at::NoGradGuard g;
  for (auto& p : params.params()) p.value.add_(by);
}

template <class F>
std::string checkpoint_error(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected CheckpointError";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "\"" << (needle) << "\" not in: " << (haystack)

std::string latest_name(const fs::path& run) {
  std::string s = read_bytes(run / "checkpoints" / "latest");
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Checkpoint, RoundTrip) {
  TempDir run;
  Trained t;
  const auto m = meta(10);
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  const fs::path dir = save_checkpoint(run.path(), t.params(), *t.opt, m, {});
  EXPECT_EQ(dir, run.path() / "checkpoints" / "step_00000010");
  EXPECT_EQ(latest_name(run.path()), "step_00000010");
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "meta.json"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;

  const Checkpoint c = read_checkpoint(dir);
  EXPECT_EQ(c.dir, dir);
  EXPECT_EQ(c.meta.step, m.step);
  EXPECT_EQ(c.meta.tokens, m.tokens);
  EXPECT_EQ(c.meta.loader.epoch, m.loader.epoch);
  EXPECT_EQ(c.meta.loader.cursor, m.loader.cursor);
  EXPECT_EQ(c.meta.config_toml, m.config_toml);
  EXPECT_EQ(c.meta.tokenizer_kind, m.tokenizer_kind);
  EXPECT_EQ(c.meta.data_vocab_size, m.data_vocab_size);
  EXPECT_EQ(c.meta.val_loss, m.val_loss);

  // Weights into a differently initialised model of the same shape.
  Trained other(tiny(), 99);
  const auto want = snapshot(t.params());
  EXPECT_FALSE(at::equal(other.params().params()[0].value, want[0]));
  load_params(c.model, other.params());
  expect_params_equal(other.params(), want);

  // Optimizer moments, the step count, and the RNG state.
  const auto state = t.opt->state();
  for (const auto& [name, tensor] : state) {
    ASSERT_TRUE(c.optimizer.contains(name)) << name;
    EXPECT_TRUE(at::equal(c.optimizer.at(name), tensor)) << name;
    EXPECT_GT(tensor.abs().max().item<double>(), 0.0) << name << " (moment still zero?)";
  }
  EXPECT_EQ(c.optimizer.metadata.at("steps"), "1");
  ASSERT_TRUE(c.optimizer.contains(kRngTensor));
  EXPECT_TRUE(at::equal(c.optimizer.at(kRngTensor), rng));
  other.opt->load_state(c.optimizer, 1);
  EXPECT_EQ(other.opt->steps(), 1);
  const auto restored = other.opt->state();
  ASSERT_EQ(restored.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i)
    EXPECT_TRUE(at::equal(restored[i].second, state[i].second)) << state[i].first;
}

TEST(Checkpoint, KeepPrunesOlderSteps) {
  TempDir run;
  Trained t;
  for (int64_t step : {100, 200, 300}) {
    perturb(t.params(), 0.5);
    save_checkpoint(run.path(), t.params(), *t.opt, meta(step), {.keep = 2});
  }
  EXPECT_EQ(entries(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step_00000200", "step_00000300"}));
  EXPECT_EQ(latest_name(run.path()), "step_00000300");
  save_checkpoint(run.path(), t.params(), *t.opt, meta(400), {.keep = 1});
  EXPECT_EQ(entries(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step_00000400"}));
}

TEST(Checkpoint, ResavingTheSameStepReplacesIt) {
  TempDir run;
  Trained t;
  save_checkpoint(run.path(), t.params(), *t.opt, meta(5), {});
  perturb(t.params(), 1.0);
  const auto want = snapshot(t.params());
  save_checkpoint(run.path(), t.params(), *t.opt, meta(5), {});
  EXPECT_EQ(entries(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step_00000005"}));
  Trained other(tiny(), 3);
  load_params(read_checkpoint(find_checkpoint(run.path())).model, other.params());
  expect_params_equal(other.params(), want);
}

TEST(Checkpoint, FindCheckpoint) {
  TempDir run;
  Trained t;
  save_checkpoint(run.path(), t.params(), *t.opt, meta(1), {});
  const fs::path newest = save_checkpoint(run.path(), t.params(), *t.opt, meta(2), {});
  EXPECT_EQ(find_checkpoint(run.path()), newest);
  EXPECT_EQ(find_checkpoint(run.path() / "checkpoints"), newest);
  const fs::path older = run.path() / "checkpoints" / "step_00000001";
  EXPECT_EQ(find_checkpoint(older), older);
  EXPECT_EQ(find_checkpoint(newest), newest);

  TempDir empty;
  EXPECT_CONTAINS(checkpoint_error([&] { find_checkpoint(empty.path()); }), empty.path().string());
  // latest naming a directory that is not there.
  write_text(run.path() / "checkpoints" / "latest", "step_00000077\n");
  EXPECT_CONTAINS(checkpoint_error([&] { find_checkpoint(run.path()); }), "step_00000077");
  write_text(run.path() / "checkpoints" / "latest", "../../etc\n");
  EXPECT_CONTAINS(checkpoint_error([&] { find_checkpoint(run.path()); }), "latest");
}

TEST(Checkpoint, LoadParamsShapeMismatchNamesTensor) {
  TempDir run;
  Trained t;
  const fs::path dir = save_checkpoint(run.path(), t.params(), *t.opt, meta(1), {});
  const auto weights = read_checkpoint(dir).model;
  auto c = tiny();
  c.d_model = 64;
  auto dag = model::build_model(c, 1);
  const std::string what = checkpoint_error([&] { load_params(weights, dag->params()); });
  EXPECT_CONTAINS(what, "model.safetensors");
  EXPECT_CONTAINS(what, "\"embed.tok.weight\"");
  EXPECT_CONTAINS(what, "[256, 128]");
}

TEST(Checkpoint, LoadParamsMissingOrExtraTensorNamesIt) {
  TempDir run;
  Trained one;
  const fs::path dir1 = save_checkpoint(run.path() / "a", one.params(), *one.opt, meta(1), {});
  auto c2 = tiny();
  c2.n_layer = 2;
  Trained two(c2);
  const fs::path dir2 = save_checkpoint(run.path() / "b", two.params(), *two.opt, meta(1), {});

  // A 1-layer checkpoint lacks what a 2-layer model needs...
  std::string what =
      checkpoint_error([&] { load_params(read_checkpoint(dir1).model, two.params()); });
  EXPECT_CONTAINS(what, "missing tensor \"layers.1.");
  // ...and a 2-layer checkpoint has tensors a 1-layer model does not.
  what = checkpoint_error([&] { load_params(read_checkpoint(dir2).model, one.params()); });
  EXPECT_CONTAINS(what, "\"layers.1.");
  EXPECT_CONTAINS(what, "not a parameter");
}

// Writes `good` meta.json text, edited by `edit`, into `dir` and returns read_checkpoint's error.
template <class F>
std::string meta_error(const fs::path& dir, const std::string& good, F&& edit) {
  auto j = nlohmann::json::parse(good);
  edit(j);
  write_text(dir / "meta.json", j.dump());
  return checkpoint_error([&] { read_checkpoint(dir); });
}

TEST(Checkpoint, CorruptMetaJson) {
  TempDir run;
  Trained t;
  const fs::path dir = save_checkpoint(run.path(), t.params(), *t.opt, meta(1), {});
  const std::string good = read_bytes(dir / "meta.json");
  ASSERT_NO_THROW(read_checkpoint(dir));
  const std::string meta_path = (dir / "meta.json").string();

  write_text(dir / "meta.json", good.substr(0, good.size() / 2));
  std::string what = checkpoint_error([&] { read_checkpoint(dir); });
  EXPECT_CONTAINS(what, meta_path);
  EXPECT_CONTAINS(what, "JSON");

  what = meta_error(dir, good, [](auto& j) { j["format"] = "pytorch"; });
  EXPECT_CONTAINS(what, meta_path);
  EXPECT_CONTAINS(what, "format");
  what = meta_error(dir, good, [](auto& j) { j["version"] = 99; });
  EXPECT_CONTAINS(what, meta_path);
  EXPECT_CONTAINS(what, "99");
  for (const char* field : {"step", "tokens", "loader", "config", "tokenizer", "val_loss"}) {
    what = meta_error(dir, good, [&](auto& j) { j.erase(field); });
    EXPECT_CONTAINS(what, meta_path);
    EXPECT_CONTAINS(what, field);
  }
  what = meta_error(dir, good, [](auto& j) { j["step"] = "ten"; });
  EXPECT_CONTAINS(what, meta_path);
  EXPECT_CONTAINS(what, "step");
  write_text(dir / "meta.json", "[1, 2]");
  EXPECT_CONTAINS(checkpoint_error([&] { read_checkpoint(dir); }), meta_path);
  fs::remove(dir / "meta.json");
  EXPECT_CONTAINS(checkpoint_error([&] { read_checkpoint(dir); }), meta_path);
}

TEST(Checkpoint, TruncatedTensorFiles) {
  TempDir run;
  Trained t;
  const fs::path dir = save_checkpoint(run.path(), t.params(), *t.opt, meta(1), {});
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path f = dir / name;
    const std::string good = read_bytes(f);
    fs::resize_file(f, fs::file_size(f) / 2);
    EXPECT_CONTAINS(checkpoint_error([&] { read_checkpoint(dir); }), f.string());
    write_text(f, good);
  }
  EXPECT_NO_THROW(read_checkpoint(dir));
}

// --- Crash safety ---------------------------------------------------------------------------

// Saves step 20 in a child process that _exit(3)s right after `stage`; returns its exit status.
int crash_during_save(const fs::path& run, Trained& t, const std::string& stage) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      SaveOptions o;
      o.on_stage = [&](const std::string& s) {
        if (s == stage) ::_exit(3);
      };
      save_checkpoint(run, t.params(), *t.opt, meta(20), o);
      ::_exit(4);  // the stage never came
    } catch (...) {
      ::_exit(5);
    }
  }
  if (pid < 0) return -1;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -3;
}

class CrashDuringSave : public ::testing::TestWithParam<std::string> {};

TEST_P(CrashDuringSave, PreviousCheckpointStaysLatestAndLoads) {
  const std::string stage = GetParam();
  TempDir run;
  Trained t;
  const fs::path step10 = save_checkpoint(run.path(), t.params(), *t.opt, meta(10), {});
  const auto want10 = snapshot(t.params());
  perturb(t.params(), 0.25);  // step 20's weights differ from step 10's
  const auto want20 = snapshot(t.params());

  ASSERT_EQ(crash_during_save(run.path(), t, stage), 3) << "child did not die at " << stage;

  const fs::path ckpts = run.path() / "checkpoints";
  const fs::path step20 = ckpts / "step_00000020";
  bool stale_tmp = false;
  for (const auto& name : entries(ckpts)) stale_tmp |= name.rfind(".tmp-", 0) == 0;
  if (stage == "renamed") {
    // The new directory is in place, but latest was never switched to it.
    EXPECT_TRUE(fs::exists(step20 / "meta.json"));
    EXPECT_FALSE(stale_tmp);
  } else {
    EXPECT_FALSE(fs::exists(step20));
    EXPECT_TRUE(stale_tmp) << "the interrupted save should have left its temporary directory";
  }
  EXPECT_EQ(latest_name(run.path()), "step_00000010");

  const fs::path found = find_checkpoint(run.path());
  EXPECT_EQ(found, step10);
  const Checkpoint c = read_checkpoint(found);
  EXPECT_EQ(c.meta.step, 10);
  EXPECT_EQ(c.meta.loader.cursor, meta(10).loader.cursor);
  Trained fresh(tiny(), 77);
  load_params(c.model, fresh.params());
  expect_params_equal(fresh.params(), want10);
  EXPECT_NO_THROW(fresh.opt->load_state(c.optimizer, c.meta.step));

  // The run goes on: saving step 20 again works, becomes latest, and sweeps up the debris.
  const fs::path saved = save_checkpoint(run.path(), t.params(), *t.opt, meta(20), {});
  EXPECT_EQ(saved, step20);
  EXPECT_EQ(find_checkpoint(run.path()), step20);
  EXPECT_EQ(entries(ckpts), (std::vector<std::string>{"latest", "step_00000010", "step_00000020"}));
  const Checkpoint c20 = read_checkpoint(step20);
  EXPECT_EQ(c20.meta.step, 20);
  load_params(c20.model, fresh.params());
  expect_params_equal(fresh.params(), want20);
}

INSTANTIATE_TEST_SUITE_P(Stages, CrashDuringSave,
                         ::testing::Values("model", "optimizer", "meta", "renamed"));

TEST(CrashAfterCommit, NewCheckpointIsLatest) {
  TempDir run;
  Trained t;
  save_checkpoint(run.path(), t.params(), *t.opt, meta(10), {});
  perturb(t.params(), 0.25);
  const auto want20 = snapshot(t.params());
  ASSERT_EQ(crash_during_save(run.path(), t, "committed"), 3);
  const fs::path found = find_checkpoint(run.path());
  EXPECT_EQ(found.filename(), "step_00000020");
  Trained fresh(tiny(), 77);
  load_params(read_checkpoint(found).model, fresh.params());
  expect_params_equal(fresh.params(), want20);
}

// --- AdamW and clipping ---------------------------------------------------------------------

std::vector<double> values(const at::Tensor& t) {
  auto d = t.detach().to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

void set_grad(graph::ParamStore& ps, const std::string& name, at::Tensor g) {
  ps.get(name).value.mutable_grad() = std::move(g);
}

TEST(AdamW, MatchesTorchFormulaByHand) {
  graph::ParamStore ps;
  ps.add("w", at::tensor({0.5f, -1.0f, 2.0f, 0.1f}), true);
  ps.add("b", at::tensor({0.3f, -0.7f}), false);
  ps.add("frozen", at::tensor({1.0f, 2.0f}), true);  // never gets a gradient
  const double lr = 0.01, b1 = 0.8, b2 = 0.9, eps = 1e-3, wd = 0.5;
  AdamW opt(ps, {.beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});

  // torch.optim.AdamW (non-foreach, no amsgrad), written out per element.
  struct Ref {
    std::vector<double> w, m, v;
    bool decay;
  };
  Ref rw{values(ps.get("w").value), std::vector<double>(4), std::vector<double>(4), true};
  Ref rb{values(ps.get("b").value), std::vector<double>(2), std::vector<double>(2), false};
  const std::vector<std::vector<std::vector<float>>> grads = {
      {{0.2f, -0.4f, 1.5f, 0.0f}, {-0.3f, 0.05f}}, {{-0.1f, 0.3f, 0.5f, 2.0f}, {0.6f, -0.2f}}};
  for (int step = 1; step <= 2; ++step) {
    const auto& g = grads[step - 1];
    set_grad(ps, "w", at::tensor(g[0]));
    set_grad(ps, "b", at::tensor(g[1]));
    opt.step(lr);
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (auto [r, gr] : {std::pair{&rw, &g[0]}, std::pair{&rb, &g[1]}}) {
      for (size_t i = 0; i < r->w.size(); ++i) {
        const double gi = (*gr)[i];
        if (r->decay) r->w[i] *= 1 - lr * wd;
        r->m[i] = b1 * r->m[i] + (1 - b1) * gi;
        r->v[i] = b2 * r->v[i] + (1 - b2) * gi * gi;
        const double denom = std::sqrt(r->v[i]) / std::sqrt(bc2) + eps;
        r->w[i] -= lr / bc1 * r->m[i] / denom;
      }
    }
    EXPECT_EQ(opt.steps(), step);
    for (auto [name, r] : {std::pair{"w", &rw}, std::pair{"b", &rb}}) {
      const auto got = values(ps.get(name).value);
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], r->w[i], 1e-6) << name << "[" << i << "] after step " << step;
    }
  }
  // The no-decay parameter moved only by the Adam update: check the decay actually mattered.
  EXPECT_GT(std::abs(rw.w[3] - 0.1), 1e-4);
  EXPECT_EQ(values(ps.get("frozen").value), (std::vector<double>{1.0, 2.0}));

  // state() holds the moments by name.
  const auto state = opt.state();
  ASSERT_EQ(state.size(), 6u);
  EXPECT_EQ(state[0].first, "exp_avg.w");
  EXPECT_EQ(state[1].first, "exp_avg_sq.w");
  const auto m = values(state[0].second), v = values(state[1].second);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(m[i], rw.m[i], 1e-6);
    EXPECT_NEAR(v[i], rw.v[i], 1e-6);
  }
}

TEST(AdamW, LoadStateRejectsWrongShapes) {
  TempDir dir;
  graph::ParamStore ps;
  ps.add("w", at::zeros({3}), true);
  AdamW opt(ps, {});
  write_safetensors(dir / "o.safetensors",
                    {{"exp_avg.w", at::zeros({4})}, {"exp_avg_sq.w", at::zeros({4})}});
  std::string what =
      checkpoint_error([&] { opt.load_state(read_safetensors(dir / "o.safetensors"), 1); });
  EXPECT_CONTAINS(what, "exp_avg.w");
  write_safetensors(dir / "p.safetensors", {{"exp_avg.w", at::zeros({3})}});
  what = checkpoint_error([&] { opt.load_state(read_safetensors(dir / "p.safetensors"), 1); });
  EXPECT_CONTAINS(what, "exp_avg_sq.w");
}

// Deferred zero moments: claimed once by whoever takes them over; if nobody does, the first
// step zeroes them, so the update equals an ordinary AdamW's bit for bit; load_state() writes
// them (nothing left to claim) and, from a mapped checkpoint, adopts the file's tensors.
TEST(AdamW, DeferredZeroStateIsClaimedOnceOrZeroedByTheFirstStep) {
  auto make = [](graph::ParamStore& ps) {
    ps.add("w", at::tensor({0.5f, -1.0f, 2.0f}), true);
    ps.get("w").value.mutable_grad() = at::tensor({0.2f, -0.4f, 1.5f});
  };
  graph::ParamStore plain_ps, deferred_ps;
  make(plain_ps);
  make(deferred_ps);
  AdamW plain(plain_ps, {});
  AdamW deferred(deferred_ps, {.defer_zero_state = true});
  EXPECT_THROW(deferred.state(), std::logic_error);  // no values to save yet
  deferred.exp_avg(0).fill_(std::nanf(""));          // what an unwritten allocation may hold
  deferred.exp_avg_sq(0).fill_(std::nanf(""));
  plain.step(0.01);
  deferred.step(0.01);
  EXPECT_TRUE(at::equal(plain_ps.get("w").value, deferred_ps.get("w").value));
  EXPECT_TRUE(at::equal(plain.exp_avg(0), deferred.exp_avg(0)));
  EXPECT_FALSE(deferred.claim_zero_state());  // the step took them

  graph::ParamStore claimed_ps;
  make(claimed_ps);
  AdamW claimed(claimed_ps, {.defer_zero_state = true});
  EXPECT_TRUE(claimed.claim_zero_state());
  EXPECT_FALSE(claimed.claim_zero_state());
  EXPECT_FALSE(AdamW(plain_ps, {}).claim_zero_state());

  TempDir dir;
  write_safetensors(dir / "o.safetensors",
                    {{"exp_avg.w", at::ones({3})}, {"exp_avg_sq.w", at::full({3}, 2.0f)}});
  graph::ParamStore loaded_ps;
  make(loaded_ps);
  AdamW loaded(loaded_ps, {.defer_zero_state = true});
  loaded.load_state(read_safetensors(dir / "o.safetensors", SafetensorsRead::kMap), 4);
  EXPECT_FALSE(loaded.claim_zero_state());
  EXPECT_TRUE(at::equal(loaded.exp_avg_sq(0), at::full({3}, 2.0f)));
  EXPECT_EQ(loaded.steps(), 4);
}

TEST(ClipGradNorm, HandComputedNormAndScaling) {
  graph::ParamStore ps;
  ps.add("a", at::zeros({2}), true);
  ps.add("b", at::zeros({1, 1}), false);
  ps.add("c", at::zeros({3}), true);  // no gradient: not part of the norm
  auto set = [&] {
    set_grad(ps, "a", at::tensor({3.0f, -4.0f}));
    set_grad(ps, "b", at::full({1, 1}, 12.0f));
  };
  set();
  // sqrt(9 + 16 + 144) = 13; clipping to 6.5 halves every gradient (up to torch's 1e-6).
  EXPECT_NEAR(clip_grad_norm(ps, 6.5).item<double>(), 13.0, 1e-5);
  const double coef = 6.5 / (13.0 + 1e-6);
  const auto a = values(ps.get("a").value.grad());
  EXPECT_NEAR(a[0], 3.0 * coef, 1e-6);
  EXPECT_NEAR(a[1], -4.0 * coef, 1e-6);
  EXPECT_NEAR(values(ps.get("b").value.grad())[0], 12.0 * coef, 1e-6);
  EXPECT_FALSE(ps.get("c").value.grad().defined());
  EXPECT_NEAR(clip_grad_norm(ps, 0).item<double>(), 6.5, 1e-5);  // 0 = off: just the norm

  set();
  EXPECT_NEAR(clip_grad_norm(ps, 20.0).item<double>(), 13.0, 1e-5);  // under the limit: untouched
  EXPECT_EQ(values(ps.get("a").value.grad()), (std::vector<double>{3.0, -4.0}));
  EXPECT_EQ(values(ps.get("b").value.grad()), (std::vector<double>{12.0}));
}

}  // namespace
}  // namespace starling::train
