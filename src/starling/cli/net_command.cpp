// `starling keygen`, `starling status` and `starling dashboard`: a peer's CURVE identity, a look at
// a live swarm, and a web page that keeps looking.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <memory>
#include <thread>

#include "starling/cli/commands.h"
#include "starling/common/error.h"
#include "starling/net/dashboard.h"
#include "starling/net/keys.h"
#include "starling/net/status_client.h"

namespace starling::cli {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_dashboard_signal(int) { g_stop.store(true); }

// Until Ctrl-C (SIGINT) or SIGTERM.
void wait_for_stop_signal() {
  std::signal(SIGINT, on_dashboard_signal);
  std::signal(SIGTERM, on_dashboard_signal);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

void add_net_commands(CLI::App& app) {
  auto* keygen = app.add_subcommand(
      "keygen",
      "write a CURVE key pair: FILE (secret, mode 0600) and FILE with .pub for its extension "
      "(public; keys/alice.key gives keys/alice.pub)");
  auto out = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  keygen->add_option("--out", *out, "the secret key file to write, e.g. keys/alice.key")
      ->required();
  keygen->add_option("--name", *name, "a name stored beside the public key (for allowlists)");
  keygen->callback([out, name] {
    // The name ends the .pub line that allowlists copy: a line break or tab there breaks them.
    if (std::any_of(name->begin(), name->end(),
                    [](unsigned char ch) { return ch < 0x20 || ch == 0x7f; }))
      throw ConfigError(
          "keygen --name: a name may not hold control characters (a line break, a "
          "tab): it goes on the public key's line of an allowlist");
    if (out->empty()) throw ConfigError("keygen --out: give the secret key file to write");
    const auto keys = net::generate_keypair();
    net::save_keypair(keys, *out, *name);
    std::filesystem::path pub(*out);
    pub.replace_extension(".pub");
    std::cout << "wrote " << *out << " (keep it secret) and " << pub.string() << "\n"
              << "public key: " << keys.public_key
              << " (Z85; in hex: " << net::hex_key(keys.public_key) << ")\n"
              << "add the .pub line to the swarm's allowlist on every peer\n";
  });

  // `status` and `dashboard` ask a member the same way.
  struct Asking {
    std::string join, key, allow;
    bool insecure = false;
    double timeout = 5.0;
  };
  auto add_asking = [](CLI::App* cmd, Asking& a) {
    cmd->add_option("--join", a.join, "a member's address: tcp://HOST:PORT or KEY@tcp://HOST:PORT")
        ->required();
    cmd->add_option("--key", a.key, "this user's key file (its public key must be allowlisted)");
    cmd->add_option("--allow", a.allow, "the swarm's allowlist (tells which key to expect)");
    cmd->add_flag("--insecure", a.insecure, "the swarm runs without CURVE (plain TCP)");
    cmd->add_option("--timeout", a.timeout, "seconds to wait for an answer")->capture_default_str();
  };
  auto query_of = [](const Asking& a, const std::string& what) {
    net::StatusQuery q;
    q.entry = a.join;
    q.insecure = a.insecure;
    if (!a.insecure) {
      if (a.key.empty() || a.allow.empty())
        throw ConfigError(what + ": give --key and --allow (or --insecure for a plain-TCP swarm)");
      q.keys = net::load_keypair(a.key);
      q.allowlist = net::load_allowlist(a.allow);
    }
    // NaN passes a "<= 0" test, and a day's worth of milliseconds overflows nothing: beyond it,
    // a wait that never ends.
    if (!(a.timeout > 0 && a.timeout <= 86400))
      throw ConfigError(what + ": --timeout must be above 0 and at most 86400 s (a day), not " +
                        std::to_string(a.timeout));
    q.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout * 1000));
    return q;
  };

  auto* status = app.add_subcommand(
      "status", "ask a swarm member for the members, their state and measured links");
  auto status_args = std::make_shared<Asking>();
  add_asking(status, *status_args);
  status->callback([=] {
    std::cout << net::format_status(net::query_status(query_of(*status_args, "status")));
  });

  auto* dashboard = app.add_subcommand(
      "dashboard", "serve a live web page of a swarm: members, links, training curves");
  auto dash_args = std::make_shared<Asking>();
  auto listen = std::make_shared<std::string>("127.0.0.1:8080");
  auto every = std::make_shared<double>(1.0);
  add_asking(dashboard, *dash_args);
  dashboard->add_option("--listen", *listen, "HOST:PORT to serve on (port 0: any free port)")
      ->capture_default_str();
  dashboard->add_option("--every", *every, "seconds between two looks at the swarm")
      ->capture_default_str();
  dashboard->callback([=] {
    const net::StatusQuery q = query_of(*dash_args, "dashboard");
    if (!(*every > 0 && *every <= 86400))
      throw ConfigError("dashboard: --every must be above 0 and at most 86400 s (a day)");
    net::Dashboard page([q] { return net::query_status(q); },
                        {.listen = *listen,
                         .every = std::chrono::milliseconds(static_cast<int64_t>(*every * 1000)),
                         .source = q.entry});
    std::cout << "dashboard at " << page.url() << " (Ctrl-C stops it)" << std::endl;
    wait_for_stop_signal();
  });
}

}  // namespace starling::cli
