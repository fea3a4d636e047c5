// CURVE identities. A key file holds one peer's key pair (Z85 text, readable only by its owner);
// its ".pub" twin holds the public half for others. A swarm is defined by an allowlist: a text
// file with one public key per line, optionally followed by a name; a word starting with '#' starts
// a comment (Z85 keys may contain '#' themselves).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "starling/net/peer_id.h"

namespace starling::net {

struct KeyPair {
  std::string public_key;  // 40 characters of Z85
  std::string secret_key;
};

KeyPair generate_keypair();

// Writes `path` (both keys, mode 0600) and `path` with extension ".pub" (public key and name).
// Refuses to overwrite an existing key file.
void save_keypair(const KeyPair& keys, const std::filesystem::path& path, const std::string& name);

// Reads a key file written by save_keypair. Throws ConfigError naming the file and what is wrong.
KeyPair load_keypair(const std::filesystem::path& path);

struct AllowedKey {
  std::string public_key;
  std::string name;  // may be empty
};

// Reads an allowlist; every line must be a valid Z85 public key. Throws ConfigError with line.
std::vector<AllowedKey> load_allowlist(const std::filesystem::path& path);

// True if `key` is 40 characters of Z85 that decode to 32 bytes.
bool is_valid_public_key(const std::string& key);

// The 32 raw bytes of a Z85 key (public or secret). Throws ConfigError for anything else.
std::array<uint8_t, 32> raw_key(const std::string& z85_key);

// The same 32 bytes as 64 lowercase hex digits: a form a shell passes through unquoted (Z85 has
// '<', '>', '(', ')', '!', '&' and more).
std::string hex_key(const std::string& z85_key);
// True if `text` is 64 hex digits.
bool is_hex_key(const std::string& text);
// The Z85 form of a 64-hex-digit key. Throws ConfigError for anything else.
std::string z85_from_hex(const std::string& hex);
// The public key of a ".pub" file (save_keypair's twin, or any file whose first word is a key, in
// Z85 or hex), in Z85. Throws ConfigError naming the file.
std::string read_public_key_file(const std::filesystem::path& path);

// The peer id a public key stands for: its first 8 bytes, little-endian.
PeerId peer_id_from_public_key(const std::string& z85_key);

}  // namespace starling::net
