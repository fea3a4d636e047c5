#include "starling/net/keys.h"

#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <sstream>

#include "starling/common/error.h"

namespace starling::net {
namespace {

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return {};
  const auto b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

std::filesystem::path public_path(const std::filesystem::path& path) {
  auto p = path;
  p.replace_extension(".pub");
  return p;
}

}  // namespace

KeyPair generate_keypair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0)
    throw NetError("cannot generate a CURVE key pair: this ZeroMQ was built without CURVE");
  return {pub, sec};
}

bool is_valid_public_key(const std::string& key) {
  if (key.size() != 40) return false;
  std::array<uint8_t, 32> raw{};
  return zmq_z85_decode(raw.data(), key.c_str()) != nullptr;
}

std::array<uint8_t, 32> raw_key(const std::string& z85_key) {
  std::array<uint8_t, 32> raw{};
  if (z85_key.size() != 40 || zmq_z85_decode(raw.data(), z85_key.c_str()) == nullptr)
    throw ConfigError("not a 40-character Z85 CURVE key");
  return raw;
}

std::string hex_key(const std::string& z85_key) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : raw_key(z85_key)) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool is_hex_key(const std::string& text) {
  return text.size() == 64 &&
         std::all_of(text.begin(), text.end(), [](char c) { return std::isxdigit(c) != 0; });
}

std::string z85_from_hex(const std::string& hex) {
  if (!is_hex_key(hex)) throw ConfigError("'" + hex + "' is not a key of 64 hex digits");
  std::array<uint8_t, 32> raw{};
  for (size_t i = 0; i < raw.size(); ++i)
    raw[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  char z85[41];
  if (zmq_z85_encode(z85, raw.data(), raw.size()) == nullptr)
    throw ConfigError("'" + hex + "' cannot be encoded as a CURVE key");
  return z85;
}

std::string read_public_key_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path.string() + ": cannot read the public key file");
  std::string word;
  in >> word;
  if (is_hex_key(word)) return z85_from_hex(word);
  if (!is_valid_public_key(word))
    throw ConfigError(path.string() + ": '" + word +
                      "' is not a CURVE public key (40 Z85 characters or 64 hex digits)");
  return word;
}

PeerId peer_id_from_public_key(const std::string& z85_key) {
  std::array<uint8_t, 32> raw{};
  if (z85_key.size() != 40 || zmq_z85_decode(raw.data(), z85_key.c_str()) == nullptr)
    throw ConfigError("not a CURVE public key: '" + z85_key + "'");
  PeerId id = 0;
  for (int i = 0; i < 8; ++i) id |= static_cast<PeerId>(raw[i]) << (8 * i);
  return id;
}

void save_keypair(const KeyPair& keys, const std::filesystem::path& path, const std::string& name) {
  if (std::filesystem::exists(path))
    throw ConfigError(path.string() + ": already exists; refusing to overwrite a key");
  if (path.extension() == ".pub")
    throw ConfigError(path.string() + ": the secret key file must not end in .pub");
  // keygen --out keys/alice.key in a fresh checkout: the folder is made (the secret key file
  // itself is private to its owner, below).
  if (const auto dir = path.parent_path(); !dir.empty() && !std::filesystem::exists(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw ConfigError(path.string() + ": cannot create its folder " + dir.string() + ": " +
                        ec.message());
  }
  {
    const int old = ::umask(077);
    std::ofstream out(path);
    ::umask(old);
    if (!out) throw ConfigError(path.string() + ": cannot create the key file");
    out << "# Starling CURVE key pair. Keep this file secret.\n"
        << "public-key = " << keys.public_key << "\n"
        << "secret-key = " << keys.secret_key << "\n";
    if (!out.flush()) throw ConfigError(path.string() + ": write failed");
  }
  std::ofstream pub(public_path(path));
  pub << keys.public_key << (name.empty() ? "" : " " + name) << "\n";
  if (!pub.flush()) throw ConfigError(public_path(path).string() + ": write failed");
}

KeyPair load_keypair(const std::filesystem::path& path) {
  // A directory opens and reads as an empty file, which would be blamed for missing keys.
  if (std::filesystem::is_directory(path))
    throw ConfigError(path.string() + ": is a directory, not a key file (starling keygen)");
  std::ifstream in(path);
  if (!in) throw ConfigError(path.string() + ": cannot read the key file");
  KeyPair keys;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    const auto eq = line.find('=');
    const std::string where = path.string() + ":" + std::to_string(number);
    if (eq == std::string::npos)
      throw ConfigError(where + ": expected 'public-key = ...' or 'secret-key = ...'");
    const std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    std::array<uint8_t, 32> raw{};
    if (value.size() != 40 || zmq_z85_decode(raw.data(), value.c_str()) == nullptr)
      throw ConfigError(where + ": '" + key + "' is not a 40-character Z85 CURVE key");
    if (key == "public-key") {
      keys.public_key = value;
    } else if (key == "secret-key") {
      keys.secret_key = value;
    } else {
      throw ConfigError(where + ": unknown field '" + key + "'");
    }
  }
  if (keys.public_key.empty() || keys.secret_key.empty())
    throw ConfigError(path.string() +
                      ": a key file needs both public-key and secret-key (is this a .pub file?)");
  char derived[41];
  if (zmq_curve_public(derived, keys.secret_key.c_str()) != 0 || keys.public_key != derived)
    throw ConfigError(path.string() + ": public-key does not belong to secret-key");
  return keys;
}

std::vector<AllowedKey> load_allowlist(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path))
    throw ConfigError(path.string() +
                      ": is a directory, not an allowlist (a file of public keys, one a line: "
                      "the peers' .pub files put together)");
  std::ifstream in(path);
  if (!in) throw ConfigError(path.string() + ": cannot read the allowlist");
  std::vector<AllowedKey> keys;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = trim(line);
    if (line.empty()) continue;
    std::istringstream fields(line);
    AllowedKey k;
    fields >> k.public_key;
    // '#' is a Z85 digit: a first word that is a key is a key, even if it starts with '#'.
    if (k.public_key[0] == '#' && !is_valid_public_key(k.public_key)) continue;
    std::getline(fields, k.name);
    // A comment after the key starts at a word beginning with '#'.
    if (const auto hash = k.name.find(" #"); hash != std::string::npos) k.name.resize(hash);
    if (!k.name.empty() && k.name[0] == '#') k.name.clear();
    k.name = trim(k.name);
    if (!is_valid_public_key(k.public_key))
      throw ConfigError(path.string() + ":" + std::to_string(number) + ": '" + k.public_key +
                        "' is not a 40-character Z85 CURVE public key");
    keys.push_back(std::move(k));
  }
  if (keys.empty()) throw ConfigError(path.string() + ": the allowlist has no keys");
  return keys;
}

}  // namespace starling::net
