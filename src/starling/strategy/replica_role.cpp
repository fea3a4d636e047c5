#include "starling/strategy/replica_role.h"

#include <sstream>

namespace starling::strategy {

namespace {

constexpr const char* kPrefix = "replica1 ";

// The role's words after the prefix, each under the config key it stands for.
std::vector<std::pair<std::string, std::string>> fields(const std::string& role) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream words(role.substr(std::string(kPrefix).size()));
  std::string word;
  if (words >> word) {
    const auto slash = word.find('/');
    out.emplace_back("strategy.kind", word.substr(0, slash));
    if (slash != std::string::npos)
      out.emplace_back("strategy.local_steps", word.substr(slash + 1));
  }
  if (words >> word) out.emplace_back("model.arch", word);
  static const std::pair<char, const char*> kKeys[] = {
      {'L', "model.n_layer"},    {'D', "model.d_model"},       {'H', "model.n_head"},
      {'K', "model.n_kv_head"},  {'F', "model.d_ff"},          {'S', "model.seq_len"},
      {'V', "model.vocab_size"}, {'T', "model.tie_embeddings"}};
  while (words >> word) {
    for (const auto& [letter, key] : kKeys)
      if (word[0] == letter) out.emplace_back(key, word.substr(1));
  }
  return out;
}

}  // namespace

std::string replica_role(const train::RunConfig& c) {
  const auto& s = c.strategy;
  const auto& m = c.model;
  const bool rounds = s.kind == "localsgd" || s.kind == "diloco" || s.kind == "co2";
  std::string role = kPrefix + s.kind;
  if (rounds) role += "/" + std::to_string(s.local_steps);
  role += " " + model::to_string(m.arch);
  role += " L" + std::to_string(m.n_layer) + " D" + std::to_string(m.d_model) + " H" +
          std::to_string(m.n_head) + " K" + std::to_string(m.kv_heads()) + " F" +
          std::to_string(m.ff_dim());
  // A GPT-2 learns a position per token of its context: another seq_len is another tensor.
  // LLaMA's rotary positions have no weights, and its peers may differ in context.
  if (m.arch == model::Arch::kGpt2) role += " S" + std::to_string(m.seq_len);
  role += " V" + std::to_string(m.vocab_size) + " T" + (m.tie_embeddings ? "1" : "0");
  // A member record holds at most 128 characters of role; only absurd settings come near it.
  return role.substr(0, 128);
}

bool is_replica_role(const std::string& role) { return role.rfind(kPrefix, 0) == 0; }

std::vector<std::string> replica_role_differences(const std::string& mine,
                                                  const std::string& theirs) {
  std::vector<std::string> out;
  if (mine == theirs) return out;
  const auto a = fields(mine), b = fields(theirs);
  for (const auto& [key, value] : a) {
    std::string other = "(none)";
    for (const auto& [k, v] : b)
      if (k == key) other = v;
    if (other != value) out.push_back(key + ": this peer's " + value + ", theirs " + other);
  }
  for (const auto& [key, value] : b) {
    bool here = false;
    for (const auto& [k, v] : a) here = here || k == key;
    if (!here) out.push_back(key + ": this peer's (none), theirs " + value);
  }
  if (out.empty()) out.push_back("their role: \"" + theirs + "\", this peer's: \"" + mine + "\"");
  return out;
}

}  // namespace starling::strategy
