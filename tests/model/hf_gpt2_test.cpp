// Import of Hugging Face GPT-2 weights: python/hf_gpt2_fixture.py writes a small GPT-2 in HF's
// names and Conv1D layouts together with the loss an HF-style forward computes on a batch; after
// load_hf, Starling's Executor must give the same loss. Those tests skip (with a message)
// where the python interpreter has no torch; the error cases use a file written here and always
// run. ctest runs every test in its own process, so the fixture is cached in the build tree, keyed
// by a hash of the scripts and arguments that make it.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "../cli/run_files.h"
#include "../support/python_oracle.h"
#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/model/hf_import.h"

namespace starling {
namespace {

namespace fs = std::filesystem;

using testing::kLossTol;
using testing::python_has_torch;
using testing::read_file;
using testing::shell_quote;

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

constexpr const char* kFixtureArgs =
    " --n-layer 2 --n-head 4 --d-model 64 --vocab-size 256 --n-positions 32 --batch-size 2"
    " --seed 0";

// The fixture directory (model.safetensors, expected.safetensors), generated on first use into
// <build>/test-fixtures/hf_gpt2-<hash>; empty with `no_torch` set if it is not there and python
// cannot import torch, or with `log` set if the script failed. Written into a temporary directory
// and renamed into place, so concurrent test processes never see half of it.
fs::path fixture_dir(bool* no_torch, std::string* log) {
  const fs::path script = fs::path(STARLING_SOURCE_DIR) / "python" / "hf_gpt2_fixture.py";
  const std::string key =
      read_file(script) + read_file(script.parent_path() / "safetensors_lite.py") + kFixtureArgs;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016zx", std::hash<std::string>{}(key));
  const fs::path cache = fs::path(STARLING_CLI_PATH).parent_path() / "test-fixtures";
  const fs::path dir = cache / (std::string("hf_gpt2-") + hex);
  if (fs::exists(dir / "expected.safetensors")) return dir;
  fs::create_directories(cache);
  const fs::path tmp =
      cache / (".tmp-" + dir.filename().string() + "-" + std::to_string(::getpid()));
  const fs::path log_file = tmp.string() + ".log";
  const std::string cmd = STARLING_PYTHON " " + shell_quote(script.string()) + " --out-dir " +
                          shell_quote(tmp.string()) + kFixtureArgs + " > " +
                          shell_quote(log_file.string()) + " 2>&1";
  const int status = std::system(cmd.c_str());
  *log = read_file(log_file);
  std::error_code ec;
  fs::remove(log_file, ec);
  if (status != 0 || !fs::exists(tmp / "expected.safetensors")) {
    fs::remove_all(tmp, ec);
    *no_torch = !python_has_torch();  // a skip, not a failure
    return {};
  }
  fs::rename(tmp, dir, ec);  // fails harmlessly if another process got there first
  fs::remove_all(tmp, ec);
  return fs::exists(dir / "expected.safetensors") ? dir : fs::path();
}

class HfGpt2 : public ::testing::Test {
 protected:
  void SetUp() override {
    static bool no_torch = false;
    static std::string log;
    static const fs::path dir = fixture_dir(&no_torch, &log);
    if (no_torch)
      GTEST_SKIP() << STARLING_PYTHON
          " cannot import torch (install python3-torch), so "
          "python/hf_gpt2_fixture.py cannot write the HF GPT-2 fixture";
    ASSERT_FALSE(dir.empty()) << "python/hf_gpt2_fixture.py failed:\n" << log;
    dir_ = dir;
    tmp_ = fs::temp_directory_path() / ("starling-hf-gpt2-test-" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!tmp_.empty()) fs::remove_all(tmp_, ec);
  }

  fs::path model_file() const { return dir_ / "model.safetensors"; }
  SafetensorsFile expected() const { return read_safetensors(dir_ / "expected.safetensors"); }
  static double loss(graph::OpDag& dag, const SafetensorsFile& batch) {
    graph::Executor exec(dag);
    return exec.forward({batch.at("tokens"), batch.at("targets")}).item<double>();
  }

  fs::path dir_, tmp_;
};

TEST_F(HfGpt2, ImportedModelGivesHuggingFaceLoss) {
  const auto c = fixture_config();
  const auto batch = expected();
  const double hf = batch.at("loss").item<double>();
  auto dag = model::build_model(c, 1);
  EXPECT_GT(std::abs(loss(*dag, batch) - hf), 1e-3)
      << "a fresh model should not already give the HF loss";
  model::load_hf(model_file(), *dag, c);
  EXPECT_NEAR(loss(*dag, batch), hf, kLossTol);

  // Spot-check the Conv1D transpose directly.
  const auto file = read_safetensors(model_file());
  EXPECT_TRUE(at::equal(dag->params().get("layers.1.mlp.fc.weight").value,
                        file.at("h.1.mlp.c_fc.weight").t()));
  EXPECT_TRUE(at::equal(dag->params().get("embed.tok.weight").value, file.at("wte.weight")));
}

// The same weights as GPT2LMHeadModel exports them: "transformer." names, the attn.bias causal
// masks and attn.masked_bias scalars older exports carry, and lm_head.weight.
TEST_F(HfGpt2, PrefixBuffersAndLmHeadAreAccepted) {
  const auto file = read_safetensors(model_file());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : file.tensors) {
    tensors.emplace_back("transformer." + name, t);
    if (name.size() > 9 && name.compare(name.size() - 9, 9, "ln_1.bias") == 0) {
      const std::string h = "transformer." + name.substr(0, name.size() - 9);
      tensors.emplace_back(h + "attn.bias", at::ones({32, 32}).tril().view({1, 1, 32, 32}));
      tensors.emplace_back(h + "attn.masked_bias", at::scalar_tensor(-1e4));
    }
  }
  tensors.emplace_back("lm_head.weight", file.at("wte.weight").clone());
  const fs::path exported = tmp_ / "exported.safetensors";
  write_safetensors(exported, tensors, {{"format", "pt"}});

  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  model::load_hf(exported, *dag, c);
  const auto batch = expected();
  EXPECT_NEAR(loss(*dag, batch), batch.at("loss").item<double>(), kLossTol);
}

TEST_F(HfGpt2, HalfPrecisionFileBecomesFp32) {
  const auto file = read_safetensors(model_file());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : file.tensors) tensors.emplace_back(name, t.to(at::kHalf));
  const fs::path half = tmp_ / "half.safetensors";
  write_safetensors(half, tensors);
  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  model::load_hf(half, *dag, c);
  const auto& w = dag->params().get("layers.0.attn.qkv.weight").value;
  EXPECT_EQ(w.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(w, file.at("h.0.attn.c_attn.weight").to(at::kHalf).to(at::kFloat).t()));
  const auto batch = expected();
  EXPECT_NEAR(loss(*dag, batch), batch.at("loss").item<double>(), 1e-2);
}

// A model with a 16-token context takes the first 16 of the file's 32 learned positions, and
// (causal attention) gives the same logits on 16 tokens as the full-context import.
TEST_F(HfGpt2, ShorterContextTakesFirstPositions) {
  const auto full_c = fixture_config(32), short_c = fixture_config(16);
  auto full = model::build_model(full_c, 1), shorter = model::build_model(short_c, 2);
  model::load_hf(model_file(), *full, full_c);
  model::load_hf(model_file(), *shorter, short_c);
  const auto file = read_safetensors(model_file());
  EXPECT_TRUE(at::equal(shorter->params().get("embed.pos.weight").value,
                        file.at("wpe.weight").narrow(0, 0, 16)));
  const auto tokens = expected().at("tokens").narrow(1, 0, 16).contiguous();
  graph::Executor a(*full), b(*shorter);
  const auto la = a.forward({tokens, at::Tensor()}, model::logits_node(*full));
  const auto lb = b.forward({tokens, at::Tensor()}, model::logits_node(*shorter));
  EXPECT_TRUE(at::allclose(la, lb, 1e-5, 1e-6))
      << "max diff " << (la - lb).abs().max().item<double>();
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

// A GPT-2 in HF names and Conv1D layouts with random values, written without python: enough for
// the error cases, which need the names and shapes but not a reference loss.
class HfGpt2Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("starling-hf-gpt2-err-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    file_ = dir_ / "model.safetensors";
    const auto c = fixture_config();
    const int64_t d = c.d_model, v = c.vocab_size, p = c.seq_len;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    auto r = [&](std::vector<int64_t> shape) { return at::randn(shape, gen); };
    std::vector<std::pair<std::string, at::Tensor>> t = {{"wte.weight", r({v, d})},
                                                         {"wpe.weight", r({p, d})}};
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string h = "h." + std::to_string(i) + ".";
      for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"ln_1.weight", {d}},
               {"ln_1.bias", {d}},
               {"attn.c_attn.weight", {d, 3 * d}},
               {"attn.c_attn.bias", {3 * d}},
               {"attn.c_proj.weight", {d, d}},
               {"attn.c_proj.bias", {d}},
               {"ln_2.weight", {d}},
               {"ln_2.bias", {d}},
               {"mlp.c_fc.weight", {d, 4 * d}},
               {"mlp.c_fc.bias", {4 * d}},
               {"mlp.c_proj.weight", {4 * d, d}},
               {"mlp.c_proj.bias", {d}}})
        t.emplace_back(h + name, r(shape));
    }
    t.emplace_back("ln_f.weight", r({d}));
    t.emplace_back("ln_f.bias", r({d}));
    write_safetensors(file_, t, {{"format", "pt"}});
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_, file_;
};

TEST_F(HfGpt2Errors, LayoutFileImports) {
  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  ASSERT_NO_THROW(model::load_hf(file_, *dag, c));
  const auto file = read_safetensors(file_);
  EXPECT_TRUE(at::equal(dag->params().get("layers.1.attn.proj.weight").value,
                        file.at("h.1.attn.c_proj.weight").t()));
  EXPECT_TRUE(at::equal(dag->params().get("final_norm.bias").value, file.at("ln_f.bias")));
}

TEST_F(HfGpt2Errors, APartOfTheModelTakesItsOwnTensors) {
  // A pipeline stage initialised from Hugging Face weights: its tensors come from the file, the
  // others' are skipped, and a tensor of the model that the file lacks is still an error.
  const auto c = fixture_config();
  auto part = model::build_model_part(c, 1, c10::kCPU, [](const graph::OpDag& whole) {
    return graph::StageRange{whole.size() / 2, whole.size() - 1};
  });
  ASSERT_FALSE(part->params().elsewhere().empty());
  ASSERT_NO_THROW(model::load_hf(file_, *part, c));
  const auto file = read_safetensors(file_);
  EXPECT_TRUE(at::equal(part->params().get("final_norm.bias").value, file.at("ln_f.bias")));
  EXPECT_TRUE(at::equal(part->params().get("embed.tok.weight").value, file.at("wte.weight")));
  EXPECT_FALSE(part->params().contains("layers.0.attn.qkv.weight"));
  auto fewer = c;
  fewer.n_layer = 3;  // the file lacks h.2.*, which this part reads
  part = model::build_model_part(fewer, 1, c10::kCPU, [](const graph::OpDag& whole) {
    return graph::StageRange{whole.size() / 2, whole.size() - 1};
  });
  expect_error<CheckpointError>([&] { model::load_hf(file_, *part, fewer); },
                                {file_.string(), "\"h.2."});
}

TEST_F(HfGpt2Errors, WrongWidthNamesTensor) {
  auto c = fixture_config();
  c.d_model = 32;
  auto dag = model::build_model(c, 1);
  expect_error<CheckpointError>(
      [&] { model::load_hf(file_, *dag, c); },
      {file_.string(), "tensor \"wte.weight\"", "[256, 64]", "model.d_model"});
}

TEST_F(HfGpt2Errors, WrongLayerCountNamesTensor) {
  auto c = fixture_config();
  c.n_layer = 1;  // the file has h.1.*
  auto dag = model::build_model(c, 1);
  expect_error<CheckpointError>([&] { model::load_hf(file_, *dag, c); },
                                {file_.string(), "\"h.1."});
  c.n_layer = 3;  // the file lacks h.2.*
  dag = model::build_model(c, 1);
  expect_error<CheckpointError>([&] { model::load_hf(file_, *dag, c); },
                                {file_.string(), "\"h.2."});
}

TEST_F(HfGpt2Errors, LlamaOrUntiedNamesTheTensorThatDoesNotFit) {
  auto c = model::preset("llama-tiny");
  c.n_layer = 1;
  auto dag = model::build_model(c, 1);
  expect_error<CheckpointError>([&] { model::load_hf(file_, *dag, c); },
                                {file_.string(), "\"wte.weight\"", "llama"});
  auto untied = fixture_config();
  untied.tie_embeddings = false;
  auto dag2 = model::build_model(untied, 1);
  expect_error<CheckpointError>([&] { model::load_hf(file_, *dag2, untied); },
                                {file_.string(), "\"lm_head.weight\""});
}

// The shards of the fixture's file as Hugging Face saves a big model: `dir`/model-0000N-of-00002
// .safetensors, the first holding the embeddings and layer 0, and an index naming each tensor's.
void write_shards(const fs::path& file, const fs::path& dir) {
  fs::create_directories(dir);
  const SafetensorsFile whole = read_safetensors(file);
  std::vector<std::pair<std::string, at::Tensor>> first, second;
  std::string map;
  for (const auto& [name, t] : whole.tensors) {
    const bool in_first = name.rfind("w", 0) == 0 || name.rfind("h.0.", 0) == 0;
    (in_first ? first : second).emplace_back(name, t);
    map += (map.empty() ? "" : ", ") + ("\"" + name + "\": \"model-0000") + (in_first ? "1" : "2") +
           "-of-00002.safetensors\"";
  }
  write_safetensors(dir / "model-00001-of-00002.safetensors", first, {{"format", "pt"}});
  write_safetensors(dir / "model-00002-of-00002.safetensors", second, {{"format", "pt"}});
  std::ofstream(dir / "model.safetensors.index.json")
      << "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" << map << "}}";
}

TEST_F(HfGpt2Errors, AModelsDirectoryAndItsShardsImportLikeItsFile) {
  const auto c = fixture_config();
  auto from_file = model::build_model(c, 1);
  model::load_hf(file_, *from_file, c);
  const fs::path sharded = dir_ / "sharded";
  write_shards(file_, sharded);
  // The index named itself is its directory.
  for (const fs::path& source : {dir_, sharded, sharded / "model.safetensors.index.json"}) {
    auto dag = model::build_model(c, 2);  // another seed: every value must come from the files
    ASSERT_NO_THROW(model::load_hf(source, *dag, c)) << source;
    for (const auto& p : from_file->params().params())
      EXPECT_TRUE(at::equal(dag->params().get(p.name).value, p.value)) << source << " " << p.name;
  }
}

TEST_F(HfGpt2Errors, ABadShardIndexIsNamed) {
  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  expect_error<CheckpointError>([&] { model::load_hf(empty, *dag, c); },
                                {empty.string(), "model.safetensors.index.json"});

  const fs::path sharded = dir_ / "sharded";
  write_shards(file_, sharded);
  const fs::path index = sharded / "model.safetensors.index.json";
  auto rewrite_index = [&](const std::string& from, const std::string& to) {
    std::string text = read_file(index);
    text.replace(text.find(from), from.size(), to);
    std::ofstream(index) << text;
  };
  // A tensor in both shards: which one is meant is unknowable.
  std::vector<std::pair<std::string, at::Tensor>> again = {
      {"ln_f.bias", read_safetensors(file_).at("ln_f.bias")}};
  write_safetensors(sharded / "model-00003-of-00002.safetensors", again, {{"format", "pt"}});
  rewrite_index("\"ln_f.bias\": \"model-00002", "\"ln_f.bias\": \"model-00003");
  expect_error<CheckpointError>([&] { model::load_hf(sharded, *dag, c); },
                                {"tensor \"ln_f.bias\" is also in", "model-00002-of-00002"});
  // An index that points outside its directory.
  rewrite_index("\"ln_f.bias\": \"model-00003", "\"ln_f.bias\": \"../model-00003");
  expect_error<CheckpointError>([&] { model::load_hf(sharded, *dag, c); },
                                {index.string(), "is not a file name in"});
  // A shard that is not there.
  rewrite_index("\"ln_f.bias\": \"../model-00003", "\"ln_f.bias\": \"model-00009");
  expect_error<CheckpointError>(
      [&] { model::load_hf(sharded, *dag, c); },
      {(sharded / "model-00009-of-00002.safetensors").string(), "cannot open"});
  std::ofstream(index) << "{\"weight_map\": [1]}";
  expect_error<CheckpointError>([&] { model::load_hf(sharded, *dag, c); },
                                {index.string(), "weight_map"});
}

// A model's config.json named where its weights are meant: read as safetensors, its text gave
// "header length 8386653730289748603 does not fit".
TEST_F(HfGpt2Errors, AJsonFileIsNotWeights) {
  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  std::ofstream(dir_ / "config.json") << "{\"model_type\": \"gpt2\"}";
  expect_error<CheckpointError>([&] { model::load_hf(dir_ / "config.json", *dag, c); },
                                {(dir_ / "config.json").string(), "not a model's weights"});
}

TEST_F(HfGpt2Errors, MissingFileIsCheckpointError) {
  const auto c = fixture_config();
  auto dag = model::build_model(c, 1);
  expect_error<CheckpointError>([&] { model::load_hf(dir_ / "absent.safetensors", *dag, c); },
                                {(dir_ / "absent.safetensors").string()});
}

}  // namespace
}  // namespace starling
