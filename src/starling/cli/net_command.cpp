// `starling keygen` and `starling status`: a peer's CURVE identity, and a look at a live swarm.
#include <iostream>
#include <memory>

#include "starling/cli/commands.h"
#include "starling/common/error.h"
#include "starling/net/keys.h"
#include "starling/net/status_client.h"

namespace starling::cli {

void add_net_commands(CLI::App& app) {
  auto* keygen = app.add_subcommand(
      "keygen", "write a CURVE key pair: FILE (secret, mode 0600) and FILE.pub (public)");
  auto out = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  keygen->add_option("--out", *out, "the secret key file to write, e.g. keys/alice.key")
      ->required();
  keygen->add_option("--name", *name, "a name stored beside the public key (for allowlists)");
  keygen->callback([out, name] {
    const auto keys = net::generate_keypair();
    net::save_keypair(keys, *out, *name);
    std::filesystem::path pub(*out);
    pub.replace_extension(".pub");
    std::cout << "wrote " << *out << " (keep it secret) and " << pub.string() << "\n"
              << "public key: " << keys.public_key
              << " (Z85; in hex: " << net::hex_key(keys.public_key) << ")\n"
              << "add the .pub line to the swarm's allowlist on every peer\n";
  });

  auto* status = app.add_subcommand(
      "status", "ask a swarm member for the members, their state and measured links");
  auto join = std::make_shared<std::string>();
  auto key = std::make_shared<std::string>();
  auto allow = std::make_shared<std::string>();
  auto insecure = std::make_shared<bool>(false);
  auto timeout = std::make_shared<double>(5.0);
  status->add_option("--join", *join, "a member's address: tcp://HOST:PORT or KEY@tcp://HOST:PORT")
      ->required();
  status->add_option("--key", *key, "this user's key file (its public key must be allowlisted)");
  status->add_option("--allow", *allow, "the swarm's allowlist (tells which key to expect)");
  status->add_flag("--insecure", *insecure, "the swarm runs without CURVE (plain TCP)");
  status->add_option("--timeout", *timeout, "seconds to wait for the answer")
      ->capture_default_str();
  status->callback([=] {
    net::StatusQuery q;
    q.entry = *join;
    q.insecure = *insecure;
    if (!*insecure) {
      if (key->empty() || allow->empty())
        throw ConfigError("status: give --key and --allow (or --insecure for a plain-TCP swarm)");
      q.keys = net::load_keypair(*key);
      q.allowlist = net::load_allowlist(*allow);
    }
    if (*timeout <= 0) throw ConfigError("status: --timeout must be positive");
    q.timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000));
    std::cout << net::format_status(net::query_status(q));
  });
}

}  // namespace starling::cli
