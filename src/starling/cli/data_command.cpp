#include <unistd.h>

#include <iostream>

#include "starling/cli/commands.h"
#include "starling/data/prepare.h"

namespace starling::cli {

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "prepare token shards from text");
  data->require_subcommand(1);
  auto* prep = data->add_subcommand(
      "prepare", "text files or directories -> train/val token shards (llm.c .bin) + meta.json");
  auto opts = std::make_shared<data::PrepareOptions>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  prep->add_option("inputs", *inputs, "text files, or directories searched recursively")
      ->required();
  prep->add_option("-o,--out", opts->out_dir, "output directory")->required();
  prep->add_option("--tokenizer", opts->tokenizer,
                   "byte (vocab 256), sentencepiece (trained here, or --sp-model) or gpt2 "
                   "(GPT-2's BPE, vocab 50257: llm.c's shards)")
      ->check(CLI::IsMember({"byte", "sentencepiece", "gpt2"}))
      ->capture_default_str();
  prep->add_option("--bpe", opts->gpt2_bpe_dir,
                   "gpt2: the directory of GPT-2's encoder.json and vocab.bpe "
                   "(scripts/fetch-gpt2-bpe.sh)")
      ->capture_default_str();
  prep->add_option("--vocab-size", opts->vocab_size, "sentencepiece: vocabulary to train")
      ->capture_default_str();
  prep->add_option("--split-digits", opts->split_digits,
                   "sentencepiece: every digit its own piece (true) or numbers merged like words")
      ->default_str("true");
  prep->add_option("--sp-model", opts->sentencepiece_model,
                   "sentencepiece: apply this .model instead of training one");
  prep->add_option("--val-fraction", opts->val_fraction, "fraction of documents for validation")
      ->capture_default_str();
  prep->add_option("--seed", opts->seed, "seed of the train/val split")->capture_default_str();
  prep->add_option("--shard-tokens", opts->shard_tokens, "tokens per shard")->capture_default_str();
  prep->callback([opts, inputs] {
    for (const auto& i : *inputs) opts->inputs.emplace_back(i);
    opts->note = [](const std::string& line) { std::cerr << "note: " << line << "\n"; };
    // On a terminal one line is rewritten in place; into a log (CI, a script) a line per phase
    // and per tenth of it, instead of thousands of carriage returns on one line.
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    std::string last_what;
    uint64_t last_tenth = 0;
    auto info =
        data::prepare_dataset(*opts, [&](const std::string& what, uint64_t done, uint64_t total) {
          if (tty) {
            std::cerr << "\r" << what << " " << done << "/" << total << std::flush;
            return;
          }
          const uint64_t tenth = total > 0 ? done * 10 / total : 0;
          if (what == last_what && tenth == last_tenth) return;
          last_what = what;
          last_tenth = tenth;
          std::cerr << what << " " << done << "/" << total << "\n";
        });
    if (tty) std::cerr << "\n";
    std::cout << "prepared " << info.dir.string() << ": " << info.tokenizer_kind
              << " tokenizer, vocab " << info.vocab_size << ", " << info.train_tokens
              << " train tokens in " << info.train_shards.size() << " shard(s), " << info.val_tokens
              << " val tokens in " << info.val_shards.size() << " shard(s)\n";
  });
}

}  // namespace starling::cli
