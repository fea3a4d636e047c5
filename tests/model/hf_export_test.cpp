// Export to Hugging Face's format and import back: python/hf_forward.py computes the exported
// model's logits the way transformers does (from HF's names, layouts and conventions alone), and
// they must equal Starling's to fp32 tolerance, for GPT-2 and for LLaMA with grouped-query
// attention, tied and untied; importing the export gives back every parameter bit for bit; and
// `starling export` writes a trained checkpoint's model. The python comparison skips (saying why)
// where the interpreter has no torch; the round trip and the command always run.
#include "starling/model/hf_export.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "../cli/run_cli.h"
#include "../support/python_oracle.h"
#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/model/hf_import.h"

namespace starling {
namespace {

namespace fs = std::filesystem;

using testing::python_has_torch;

struct ExportCase {
  const char* name;
  const char* preset;
  int64_t n_kv_head;
  bool tied;
};

model::ModelConfig config_of(const ExportCase& c) {
  auto m = model::preset(c.preset);
  m.n_layer = 2;
  m.d_model = 64;
  m.n_head = 4;
  m.n_kv_head = c.n_kv_head;
  m.seq_len = 16;
  m.tie_embeddings = c.tied;
  return m;
}

// A model whose every parameter is perturbed away from its init (norm gains 1, biases 0 would
// hide a tensor exported to the wrong place).
std::unique_ptr<graph::OpDag> perturbed_model(const model::ModelConfig& m, uint64_t seed) {
  auto dag = model::build_model(m, seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 100);
  at::NoGradGuard no_grad;
  for (auto& p : dag->params().params()) p.value.add_(at::randn(p.value.sizes(), gen) * 0.05);
  return dag;
}

class HfExport : public ::testing::TestWithParam<ExportCase> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("starling-hf-export-" + std::string(GetParam().name) + "-" +
                                        std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_P(HfExport, TransformersStyleForwardGivesStarlingsLogits) {
  if (!python_has_torch())
    GTEST_SKIP() << STARLING_PYTHON " cannot import torch (install python3-torch)";
  const auto m = config_of(GetParam());
  auto dag = perturbed_model(m, 7);
  model::export_hf(dag->params(), m, dir_ / "hf");

  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor seq = at::randint(m.vocab_size, {2, m.seq_len + 1}, gen, at::kLong);
  const at::Tensor tokens = seq.narrow(1, 0, m.seq_len).contiguous();
  const at::Tensor targets = seq.narrow(1, 1, m.seq_len).contiguous();
  write_safetensors(dir_ / "batch.safetensors", {{"tokens", tokens}, {"targets", targets}});
  const std::string cmd =
      STARLING_PYTHON " " STARLING_SOURCE_DIR "/python/hf_forward.py --model-dir " +
      (dir_ / "hf").string() + " --batch " + (dir_ / "batch.safetensors").string() + " --out " +
      (dir_ / "hf_logits.safetensors").string() + " > " + (dir_ / "log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "python/hf_forward.py failed; see " << dir_ / "log";
  const auto theirs = read_safetensors(dir_ / "hf_logits.safetensors");

  graph::Executor exec(*dag);
  const at::Tensor ours = exec.forward({tokens, at::Tensor()}, model::logits_node(*dag));
  const at::Tensor hf = theirs.at("logits");
  ASSERT_EQ(ours.sizes(), hf.sizes());
  EXPECT_TRUE(at::allclose(ours, hf, 1e-4, 1e-5))
      << "max difference " << (ours - hf).abs().max().item<double>();
  graph::Executor loss_exec(*dag);
  EXPECT_NEAR(loss_exec.forward({tokens, targets}).item<double>(), theirs.at("loss").item<double>(),
              1e-5);
}

TEST_P(HfExport, ImportingTheExportGivesBackEveryParameterBitForBit) {
  const auto m = config_of(GetParam());
  auto dag = perturbed_model(m, 7);
  model::export_hf(dag->params(), m, dir_ / "hf");
  const auto config = nlohmann::json::parse(std::ifstream(dir_ / "hf" / "config.json"));
  EXPECT_EQ(config.at("model_type"), m.arch == model::Arch::kGpt2 ? "gpt2" : "llama");
  EXPECT_EQ(config.at("tie_word_embeddings"), m.tie_embeddings);
  EXPECT_EQ(read_safetensors(dir_ / "hf" / "model.safetensors").contains("lm_head.weight"),
            !m.tie_embeddings);

  auto back = model::build_model(m, 99);
  model::load_hf(dir_ / "hf" / "model.safetensors", *back, m);
  for (const auto& p : dag->params().params())
    EXPECT_TRUE(at::equal(p.value, back->params().get(p.name).value)) << p.name;
}

INSTANTIATE_TEST_SUITE_P(Models, HfExport,
                         ::testing::Values(ExportCase{"gpt2", "gpt2-tiny", 0, true},
                                           ExportCase{"llama_gqa", "llama-tiny", 2, false},
                                           ExportCase{"llama_tied", "llama-tiny", 0, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// The wrong architecture or an untied head for a file names the tensor that does not fit.
TEST(HfImport, AnotherArchitectureOrHeadNamesTheTensor) {
  const fs::path dir =
      fs::temp_directory_path() / ("starling-hf-arch-" + std::to_string(::getpid()));
  const auto gpt2 = config_of({"gpt2", "gpt2-tiny", 0, true});
  auto dag = perturbed_model(gpt2, 3);
  model::export_hf(dag->params(), gpt2, dir);
  const fs::path file = dir / "model.safetensors";
  auto llama = config_of({"llama", "llama-tiny", 0, false});
  auto as_llama = model::build_model(llama, 1);
  try {
    model::load_hf(file, *as_llama, llama);
    ADD_FAILURE() << "a GPT-2 file loaded as LLaMA";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("wte.weight"), std::string::npos) << e.what();
  }
  auto untied = gpt2;
  untied.tie_embeddings = false;
  auto as_untied = model::build_model(untied, 1);
  try {
    model::load_hf(file, *as_untied, untied);
    ADD_FAILURE() << "a tied file loaded into an untied model";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// `starling export` on a trained run: the files, and the model they hold equals the checkpoint's.
TEST(ExportCommand, WritesATrainedCheckpointsModel) {
  const fs::path root =
      fs::temp_directory_path() / ("starling-export-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "text");
  {
    std::ofstream text(root / "text" / "a.txt");
    std::mt19937 rng(1);
    const char* words[] = {"export", "the", "model", "to", "another", "framework"};
    for (int i = 0; i < 3000; ++i) text << words[rng() % 6] << (i % 12 == 11 ? ".\n" : " ");
  }
  ASSERT_EQ(testing::run_cli("data prepare " + (root / "text").string() + " --out " +
                             (root / "data").string())
                .code,
            0);
  const fs::path cfg = root / "run.toml";
  std::ofstream(cfg) << "[model]\npreset = \"llama-tiny\"\nn_layer = 1\nd_model = 32\nn_head = 2\n"
                     << "seq_len = 16\n[data]\ndir = \"" << (root / "data").string()
                     << "\"\n[train]\nsteps = 2\nbatch_size = 2\nthreads = 1\nlog_every = 1\n"
                     << "eval_every = 0\nsample_at_end = false\nout_dir = \""
                     << (root / "run").string() << "\"\n";
  const auto train = testing::run_cli("train -q --config " + cfg.string());
  ASSERT_EQ(train.code, 0) << train.output;
  const auto out = testing::run_cli("export --checkpoint " + (root / "run").string() + " --out " +
                                    (root / "hf").string());
  ASSERT_EQ(out.code, 0) << out.output;
  EXPECT_NE(out.output.find("config.json"), std::string::npos) << out.output;
  const auto exported = read_safetensors(root / "hf" / "model.safetensors");
  const auto ckpt =
      read_safetensors(root / "run" / "checkpoints" / "step_00000002" / "model.safetensors");
  EXPECT_TRUE(at::equal(exported.at("model.embed_tokens.weight"), ckpt.at("embed.tok.weight")));
  EXPECT_TRUE(at::equal(exported.at("model.layers.0.self_attn.o_proj.weight"),
                        ckpt.at("layers.0.attn.proj.weight")));

  const auto bad = testing::run_cli("export --checkpoint " + (root / "run").string() + " --out " +
                                    (root / "x").string() + " --format onnx");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("\"onnx\" is not an export format"), std::string::npos) << bad.output;
  const auto missing = testing::run_cli("export --checkpoint " + (root / "nothing").string() +
                                        " --out " + (root / "y").string());
  EXPECT_NE(missing.code, 0);
  fs::remove_all(root);
}

}  // namespace
}  // namespace starling
