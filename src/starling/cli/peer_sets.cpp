#include "starling/cli/peer_sets.h"

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>

#include "starling/common/error.h"

namespace starling::cli {

bool peer_may_set(const std::string& key) {
  return key == "train.threads" || key == "train.device" || key == "train.device_memory" ||
         (key.rfind("swap.", 0) == 0 && key.size() > 5);
}

std::vector<std::vector<std::string>> parse_peer_sets(const std::vector<std::string>& args,
                                                      int peers) {
  std::vector<std::vector<std::string>> out(static_cast<size_t>(peers));
  for (const std::string& arg : args) {
    const auto bad = [&](const std::string& why) {
      return ConfigError("--peer-set " + arg + ": " + why);
    };
    const size_t colon = arg.find(':'), eq = arg.find('=');
    if (colon == std::string::npos || colon == 0 || eq == std::string::npos || eq < colon)
      throw bad("expected PEER:KEY=VALUE, e.g. 1:swap.budget=\"6MB\" or 0:train.threads=2");
    const std::string index = arg.substr(0, colon);
    for (const char c : index)
      if (!std::isdigit(static_cast<unsigned char>(c)))
        throw bad("\"" + index + "\" is not a peer number (0 to " + std::to_string(peers - 1) +
                  ")");
    // Digits only, so stoll cannot throw but on a number too long for it.
    const long long i = index.size() > 9 ? peers : std::stoll(index);
    if (i >= peers)
      throw bad("the swarm has peers 0 to " + std::to_string(peers - 1) + " (--peers " +
                std::to_string(peers) + ")");
    std::string key = arg.substr(colon + 1, eq - colon - 1);
    const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    while (!key.empty() && space(key.back())) key.pop_back();
    while (!key.empty() && space(key.front())) key.erase(key.begin());
    if (key.empty() || key.back() == '.' || key.find('.') == std::string::npos)
      throw bad("\"" + key + "\" is not a key: TABLE.NAME, e.g. swap.budget");
    if (!peer_may_set(key))
      throw bad(
          "a peer may set apart from the others only what it runs on: train.threads, "
          "train.device, train.device_memory and the swap.* keys; \"" +
          key + "\" must be the same for the whole swarm (--set)");
    out[static_cast<size_t>(i)].push_back(key + arg.substr(eq));
  }
  return out;
}

void save_peer_sets(const std::filesystem::path& out, const std::vector<std::string>& args) {
  const std::filesystem::path file = out / kPeerSetsFile, aside = out / ".peer_sets.json.tmp";
  std::error_code ec;
  if (args.empty()) {
    std::filesystem::remove(file, ec);
    return;
  }
  {
    std::ofstream f(aside);
    f << nlohmann::json{{"peer_set", args}}.dump(2) << "\n";
    if (!f.flush()) throw ConfigError(aside.string() + ": cannot write the swarm's --peer-set");
  }
  std::filesystem::rename(aside, file, ec);
  if (ec)
    throw ConfigError(file.string() + ": cannot write the swarm's --peer-set: " + ec.message());
}

std::vector<std::string> saved_peer_sets(const std::filesystem::path& out) {
  const std::filesystem::path file = out / kPeerSetsFile;
  if (!std::filesystem::exists(file)) return {};
  std::ifstream f(file);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  std::vector<std::string> args;
  const bool ok = j.is_object() && j.contains("peer_set") && j["peer_set"].is_array();
  if (ok)
    for (const auto& a : j["peer_set"]) {
      if (!a.is_string()) {
        args.clear();
        break;
      }
      args.push_back(a.get<std::string>());
    }
  if (!ok || args.empty())
    throw ConfigError(file.string() +
                      ": not the swarm's --peer-set as it began ({\"peer_set\": [\"1:KEY=VALUE\", "
                      "...]}); give --peer-set again, or remove the file");
  return args;
}

}  // namespace starling::cli
