// Import of Hugging Face GPT-2 weights: python/hf_gpt2_fixture.py writes a small GPT-2 in HF's
// names and Conv1D layouts together with the loss an HF-style forward computes on a batch; after
// load_hf_gpt2, Starling's Executor must give the same loss. Skipped (with a message) where the
// python interpreter has no torch.
#include "starling/model/hf_gpt2.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"

namespace starling {
namespace {

namespace fs = std::filesystem;

constexpr double kLossTol = 1e-5;

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

bool python_has_torch() {
  static const bool ok = std::system(STARLING_PYTHON " -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

// The fixture's shape: --n-layer 2 --n-head 4 --d-model 64 --vocab-size 256 --n-positions 32.
model::ModelConfig fixture_config(int64_t seq_len = 32) {
  model::ModelConfig c;
  c.name = "hf-gpt2-fixture";
  c.arch = model::Arch::kGpt2;
  c.vocab_size = 256;
  c.seq_len = seq_len;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  c.norm_eps = 1e-5;
  c.tie_embeddings = true;
  return c;
}

class HfGpt2 : public ::testing::Test {
 protected:
  // Two fixtures, written once for the suite (python with torch takes seconds to start):
  //   plain/: the default export (bare names), a batch of 2 x 32 tokens;
  //   prefixed/: "transformer." names, attn.bias/masked_bias buffers and lm_head.weight, as
  //     GPT2LMHeadModel exports carry them, and a batch of 16 tokens for a model with a
  //     16-token context (the importer keeps the first 16 of the 32 learned positions).
  static void SetUpTestSuite() {
    if (!python_has_torch()) return;
    root_ = new fs::path(fs::temp_directory_path() /
                         ("starling-hf-gpt2-test-" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    const std::string script =
        STARLING_PYTHON " " + shell_quote(STARLING_SOURCE_DIR "/python/hf_gpt2_fixture.py");
    const std::string common = " --n-layer 2 --n-head 4 --d-model 64 --vocab-size 256 "
                               "--n-positions 32 --batch-size 2";
    const std::string cmd =
        "(" + script + " --out-dir " + shell_quote((*root_ / "plain").string()) + common +
        " --seed 0 > " + shell_quote((*root_ / "plain.log").string()) + " 2>&1 & " + script +
        " --out-dir " + shell_quote((*root_ / "prefixed").string()) + common +
        " --seed 5 --seq-len 16 --prefix transformer. --attn-buffers --lm-head > " +
        shell_quote((*root_ / "prefixed.log").string()) + " 2>&1 & wait)";
    fixture_status_ = std::system(cmd.c_str());
  }
  static void TearDownTestSuite() {
    if (root_) {
      std::error_code ec;
      fs::remove_all(*root_, ec);
      delete root_;
      root_ = nullptr;
    }
  }

  void SetUp() override {
    if (!python_has_torch())
      GTEST_SKIP() << STARLING_PYTHON " cannot import torch (install python3-torch); the HF GPT-2 "
                                      "fixture cannot be generated";
    ASSERT_EQ(fixture_status_, 0) << "hf_gpt2_fixture.py failed";
    for (const char* d : {"plain", "prefixed"})
      ASSERT_TRUE(fs::exists(*root_ / d / "model.safetensors"))
          << d << ": fixture not written; see " << (*root_ / (std::string(d) + ".log"));
  }

  static fs::path dir(const std::string& name) { return *root_ / name; }

  // Executor loss of `dag` on the fixture's batch, and the loss the fixture computed.
  static std::pair<double, double> losses(const std::string& name, graph::OpDag& dag) {
    const auto expected = read_safetensors(dir(name) / "expected.safetensors");
    graph::Executor exec(dag);
    const double loss =
        exec.forward({expected.at("tokens"), expected.at("targets")}).item<double>();
    return {loss, expected.at("loss").item<double>()};
  }

  static fs::path* root_;
  static int fixture_status_;
};

fs::path* HfGpt2::root_ = nullptr;
int HfGpt2::fixture_status_ = -1;

TEST_F(HfGpt2, ImportedModelGivesHuggingFaceLoss) {
  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  const auto [before, hf] = losses("plain", *dag);
  EXPECT_GT(std::abs(before - hf), 1e-3) << "a fresh model should not already give the HF loss";
  model::load_hf_gpt2(dir("plain") / "model.safetensors", *dag, c);
  const auto [after, hf2] = losses("plain", *dag);
  EXPECT_NEAR(after, hf2, kLossTol);

  // Spot-check the Conv1D transpose directly.
  const auto file = read_safetensors(dir("plain") / "model.safetensors");
  EXPECT_TRUE(at::equal(dag->params().get("layers.1.mlp.fc.weight").value,
                        file.at("h.1.mlp.c_fc.weight").t()));
  EXPECT_TRUE(at::equal(dag->params().get("embed.tok.weight").value, file.at("wte.weight")));
}

TEST_F(HfGpt2, PrefixBuffersLmHeadAndShorterContext) {
  const auto c = fixture_config(16);
  auto dag = model::build_model(c, 1);
  model::load_hf_gpt2(dir("prefixed") / "model.safetensors", *dag, c);
  const auto [loss, hf] = losses("prefixed", *dag);
  EXPECT_NEAR(loss, hf, kLossTol);
  const auto file = read_safetensors(dir("prefixed") / "model.safetensors");
  EXPECT_TRUE(at::equal(dag->params().get("embed.pos.weight").value,
                        file.at("transformer.wpe.weight").narrow(0, 0, 16)));
}

// `f` must throw E whose message contains every one of `parts`.
template <class E, class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "\"" << p << "\" not in: " << what;
  }
}

TEST_F(HfGpt2, WrongWidthNamesTensor) {
  auto c = fixture_config();
  c.d_model = 32;
  auto dag = model::build_model(c, 1);
  const fs::path file = dir("plain") / "model.safetensors";
  expect_error<CheckpointError>([&] { model::load_hf_gpt2(file, *dag, c); },
                                {file.string(), "tensor \"", "has shape", "model.d_model"});
}

TEST_F(HfGpt2, WrongLayerCountNamesTensor) {
  const fs::path file = dir("plain") / "model.safetensors";
  auto c = fixture_config();
  c.n_layer = 1;  // the file has h.1.*
  auto dag = model::build_model(c, 1);
  expect_error<CheckpointError>([&] { model::load_hf_gpt2(file, *dag, c); },
                                {file.string(), "\"h.1."});
  c.n_layer = 3;  // the file lacks h.2.*
  dag = model::build_model(c, 1);
  expect_error<CheckpointError>([&] { model::load_hf_gpt2(file, *dag, c); },
                                {file.string(), "\"h.2."});
}

TEST_F(HfGpt2, LlamaIsAConfigError) {
  auto c = model::preset("llama-tiny");
  c.n_layer = 1;
  auto dag = model::build_model(c, 1);
  expect_error<ConfigError>(
      [&] { model::load_hf_gpt2(dir("plain") / "model.safetensors", *dag, c); }, {"gpt2"});
  auto untied = fixture_config();
  untied.tie_embeddings = false;
  auto dag2 = model::build_model(untied, 1);
  expect_error<ConfigError>(
      [&] { model::load_hf_gpt2(dir("plain") / "model.safetensors", *dag2, untied); },
      {"tie_embeddings"});
}

TEST(HfGpt2Files, MissingFileIsCheckpointError) {
  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  expect_error<CheckpointError>(
      [&] { model::load_hf_gpt2("/nonexistent/starling/model.safetensors", *dag, c); },
      {"/nonexistent/starling/model.safetensors"});
}

}  // namespace
}  // namespace starling
