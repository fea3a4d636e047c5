// Key files, allowlists and entry points: Z85 keys may contain or start with '#' and '@', which
// must not be mistaken for a comment or an address separator; bad files name file and line.
#include "starling/net/keys.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include "starling/common/error.h"
#include "starling/net/endpoint.h"

namespace fs = std::filesystem;
namespace net = starling::net;

namespace {

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("starling_keys_" + std::to_string(::getpid()) + "_" + name);
}

// A key pair whose public key satisfies `want` (drawn until one does).
net::KeyPair key_where(const std::function<bool(const std::string&)>& want) {
  while (true) {
    auto k = net::generate_keypair();
    if (want(k.public_key)) return k;
  }
}

}  // namespace

// keygen --out keys/alice.key where keys/ does not exist yet: the folder is made.
TEST(KeysTest, AKeyFilesFolderIsMade) {
  const fs::path dir = fs::path(temp("new_keys_dir"));
  fs::remove_all(dir);
  const fs::path path = dir / "deeper" / "alice.key";
  const auto keys = net::generate_keypair();
  net::save_keypair(keys, path, "alice");
  EXPECT_EQ(net::load_keypair(path).public_key, keys.public_key);
  EXPECT_TRUE(fs::exists(dir / "deeper" / "alice.pub"));
  fs::remove_all(dir);
}

TEST(KeysTest, KeyFileRoundTripsAndIsChecked) {
  const auto path = temp("a.key");
  fs::remove(path);
  fs::remove(fs::path(path).replace_extension(".pub"));
  const auto keys = net::generate_keypair();
  net::save_keypair(keys, path, "alice");
  const auto loaded = net::load_keypair(path);
  EXPECT_EQ(loaded.public_key, keys.public_key);
  EXPECT_EQ(loaded.secret_key, keys.secret_key);
  EXPECT_THROW(net::save_keypair(keys, path, "again"), starling::ConfigError);
  // A public key that does not belong to the secret key.
  const auto other = net::generate_keypair();
  std::ofstream(path) << "public-key = " << other.public_key << "\nsecret-key = " << keys.secret_key
                      << "\n";
  try {
    net::load_keypair(path);
    FAIL();
  } catch (const starling::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not belong"), std::string::npos) << e.what();
  }
  // A .pub file given where the key file is expected.
  try {
    net::load_keypair(fs::path(path).replace_extension(".pub"));
    FAIL();
  } catch (const starling::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(":1:"), std::string::npos) << e.what();
  }
  fs::remove(path);
  fs::remove(fs::path(path).replace_extension(".pub"));
}

// A directory opens and reads as an empty file: named as a directory, not as a file missing its
// keys ("is this a .pub file?", "the allowlist has no keys").
TEST(KeysTest, ADirectoryIsNotAKeyFileOrAnAllowlist) {
  const fs::path dir = temp("a_dir.key");
  fs::create_directories(dir);
  for (const auto& load : std::vector<std::function<void()>>{
           [&] { net::load_keypair(dir); }, [&] { (void)net::load_allowlist(dir); }}) {
    try {
      load();
      ADD_FAILURE() << "a directory was read";
    } catch (const starling::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(dir.string() + ": is a directory"), std::string::npos)
          << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(KeysTest, AllowlistKeepsKeysWithHashAndDropsComments) {
  // ('#' is the last Z85 digit, so it never starts a key: a 40-character key encodes 32 bytes,
  // and its first digit is at most 2^32 / 85^4 = 82.)
  const auto hash_first = key_where([](const std::string& k) { return k.find('#') == 1; });
  const auto hash_inside = key_where([](const std::string& k) {
    const auto at = k.find('#');
    return at != std::string::npos && at > 1;
  });
  const auto plain = net::generate_keypair();
  const auto path = temp("swarm.allow");
  std::ofstream(path) << "# the swarm\n"
                      << hash_first.public_key << " first # a comment\n"
                      << "  " << hash_inside.public_key << "\n"
                      << plain.public_key << " # only a comment\n"
                      << "#" << plain.public_key << " commented out, not a key (41 chars)\n";
  const auto allow = net::load_allowlist(path);
  ASSERT_EQ(allow.size(), 3u);
  EXPECT_EQ(allow[0].public_key, hash_first.public_key);
  EXPECT_EQ(allow[0].name, "first");
  EXPECT_EQ(allow[1].public_key, hash_inside.public_key);
  EXPECT_EQ(allow[2].name, "");
  std::ofstream(path) << plain.public_key << "\nnot-a-key bob\n";
  try {
    net::load_allowlist(path);
    FAIL();
  } catch (const starling::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("swarm.allow:2"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(KeysTest, EntryPointSplitsAtTheEndpointNotAtAnAtSignInTheKey) {
  const auto k =
      key_where([](const std::string& key) { return key.find('@') != std::string::npos; });
  const auto e = net::parse_entry_point(k.public_key + "@tcp://10.0.0.1:7000", "--join");
  EXPECT_EQ(e.public_key, k.public_key);
  EXPECT_EQ(e.endpoint, "tcp://10.0.0.1:7000");
  EXPECT_EQ(net::parse_entry_point("tcp://h:1", "--join").public_key, "");
  EXPECT_THROW(net::parse_entry_point("tcp://h:0", "--join"), starling::ConfigError);
  EXPECT_THROW(net::parse_entry_point("tcp://h:99999", "--join"), starling::ConfigError);
  EXPECT_THROW(net::parse_entry_point("h:1", "--join"), starling::ConfigError);
  EXPECT_THROW(net::parse_entry_point("short@tcp://h:1", "--join"), starling::ConfigError);
}

// The form peers print: the key in hex, which a shell passes through unquoted (Z85 keys hold
// '<', '>', '(', ')', '!' and more); the same key as Z85, or as a .pub file, parses the same.
TEST(KeysTest, EntryPointsTakeTheKeyInHexZ85OrAPubFile) {
  const auto k = key_where([](const std::string& key) {
    return key.find_first_of("<>()!&|;$`\\\"' ") != std::string::npos;
  });
  const std::string printed = net::format_entry_point(k.public_key, "tcp://10.0.0.1:7000");
  EXPECT_EQ(printed, net::hex_key(k.public_key) + "@tcp://10.0.0.1:7000");
  for (char c : printed)
    EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) ||
                std::string("@:/.").find(c) != std::string::npos)
        << "'" << c << "' in " << printed;
  EXPECT_EQ(net::parse_entry_point(printed, "--join").public_key, k.public_key);
  EXPECT_EQ(net::parse_entry_point(k.public_key + "@tcp://10.0.0.1:7000", "--join").public_key,
            k.public_key);
  const auto key_file = temp("joinee.key");
  net::save_keypair(k, key_file, "joinee");
  const std::string pub = fs::path(key_file).replace_extension(".pub").string();
  const auto from_file = net::parse_entry_point(pub + "@tcp://10.0.0.1:7000", "--join");
  EXPECT_EQ(from_file.public_key, k.public_key);
  EXPECT_EQ(from_file.endpoint, "tcp://10.0.0.1:7000");
  EXPECT_EQ(net::format_entry_point("", "tcp://h:1"), "tcp://h:1");
  try {
    net::parse_entry_point("missing.pub@tcp://h:1", "--join");
    ADD_FAILURE() << "a missing .pub file was accepted";
  } catch (const starling::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.pub"), std::string::npos) << e.what();
  }
  EXPECT_THROW(net::parse_entry_point(std::string(64, 'g') + "@tcp://h:1", "--join"),
               starling::ConfigError);
  fs::remove(key_file);
  fs::remove(pub);
}
