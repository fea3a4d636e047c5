// The SentencePiece module: the only translation unit that includes sentencepiece's headers or
// links its library (see sentencepiece_backend.h for why it lives apart).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>

#include "starling/data/sentencepiece_backend.h"

namespace starling::data::spm {
namespace {
namespace fs = std::filesystem;

// Feeds the trainer one line at a time from the text files, so paths need no escaping and memory
// stays bounded. SentencePiece drops sentences longer than max_sentence_length, so long lines
// (whole paragraphs) are cut at spaces instead of being lost.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const std::vector<std::string>& files, std::size_t max_line)
      : files_(files), max_line_(max_line) {
    Next();
  }

  bool done() const override { return done_; }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return status_; }

  void Next() override {
    while (true) {
      if (!pending_.empty()) {
        take_piece();
        return;
      }
      if (stream_.is_open() && std::getline(stream_, pending_)) {
        if (!pending_.empty() && pending_.back() == '\r') pending_.pop_back();
        continue;
      }
      if (stream_.is_open()) stream_.close();
      if (next_file_ == files_.size()) {
        done_ = true;
        value_.clear();
        return;
      }
      const std::string& file = files_[next_file_++];
      stream_.open(file, std::ios::binary);
      if (!stream_) {
        // Reported through status() rather than thrown, so no exception crosses the trainer.
        status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound,
                                              "cannot read '" + file + "'");
        done_ = true;
        return;
      }
    }
  }

 private:
  void take_piece() {
    if (pending_.size() <= max_line_) {
      value_ = std::move(pending_);
      pending_.clear();
      return;
    }
    std::size_t cut = pending_.rfind(' ', max_line_);
    if (cut == std::string::npos || cut == 0) {
      cut = max_line_;
      // Do not split a UTF-8 sequence: back up over continuation bytes.
      while (cut > 0 && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
      if (cut == 0) cut = max_line_;
    }
    value_ = pending_.substr(0, cut);
    pending_.erase(0, cut);
  }

  const std::vector<std::string>& files_;
  std::size_t max_line_;
  std::size_t next_file_ = 0;
  std::ifstream stream_;
  std::string pending_;
  std::string value_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

class SentencePieceProcessorImpl final : public Processor {
 public:
  bool load(const std::string& file, std::string* error) {
    const auto status = processor_.Load(file);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  bool encode(std::string_view text, std::vector<int>* ids, std::string* error) const override {
    const auto status = processor_.Encode(text, ids);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  bool decode(const std::vector<int>& ids, std::string* text, std::string* error) const override {
    const auto status = processor_.Decode(ids, text);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  int piece_size() const override { return processor_.GetPieceSize(); }
  int eos_id() const override { return processor_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

class BackendImpl final : public Backend {
 public:
  std::unique_ptr<Processor> load(const std::string& model_file, std::string* error) override {
    auto p = std::make_unique<SentencePieceProcessorImpl>();
    if (!p->load(model_file, error)) return nullptr;
    return p;
  }
  bool train(const std::unordered_map<std::string, std::string>& args,
             const std::vector<std::string>& files, std::size_t max_line,
             std::string* error) override {
    // Sentence sampling draws from SentencePiece's global generator; a fixed seed makes the same
    // inputs give the same model.
    sentencepiece::SetRandomGeneratorSeed(20240520);
    LineIterator lines(files, max_line);
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
};

}  // namespace
}  // namespace starling::data::spm

extern "C" __attribute__((visibility("default"))) starling::data::spm::Backend*
starling_sentencepiece_backend() {
  static starling::data::spm::BackendImpl backend;
  return &backend;
}
