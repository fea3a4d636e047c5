#include "starling/net/endpoint.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "starling/common/error.h"
#include "starling/net/keys.h"

namespace starling::net {
namespace {

struct HostPort {
  std::string host, port;
};

HostPort split(const std::string& endpoint, const std::string& what) {
  if (endpoint.rfind("tcp://", 0) != 0)
    throw ConfigError(what + ": '" + endpoint + "' is not tcp://HOST:PORT");
  const std::string rest = endpoint.substr(6);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size())
    throw ConfigError(what + ": '" + endpoint + "' is not tcp://HOST:PORT");
  HostPort hp{rest.substr(0, colon), rest.substr(colon + 1)};
  if (hp.port != "*" && hp.port.find_first_not_of("0123456789") != std::string::npos)
    throw ConfigError(what + ": port '" + hp.port + "' in '" + endpoint + "' is not a number");
  if (hp.port != "*" && std::stoul(hp.port) > 65535)
    throw ConfigError(what + ": port " + hp.port + " in '" + endpoint + "' is out of range");
  return hp;
}

// The local address the kernel would use to reach host:port (no packet is sent).
std::string local_address_towards(const std::string& host, const std::string& port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), port == "*" ? "9" : port.c_str(), &hints, &res) != 0 || !res)
    return {};
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf)) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

}  // namespace

std::vector<std::string> candidate_server_keys(const EntryPoint& entry, bool insecure,
                                               const std::string& own_public_key,
                                               const std::vector<AllowedKey>& allowlist) {
  if (insecure) return {""};
  if (!entry.public_key.empty()) return {entry.public_key};
  std::vector<std::string> keys;
  for (const auto& k : allowlist)
    if (k.public_key != own_public_key) keys.push_back(k.public_key);
  return keys;
}

void check_tcp_endpoint(const std::string& endpoint, const std::string& what) {
  split(endpoint, what);
}

std::string endpoint_host(const std::string& endpoint) {
  std::string host = split(endpoint, "endpoint").host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host;
}

EntryPoint parse_entry_point(const std::string& text, const std::string& what) {
  EntryPoint e;
  // '@' is also a Z85 digit, so the key ends at the '@' that starts the endpoint.
  const auto at = text.find("@tcp://");
  if (at == std::string::npos) {
    e.endpoint = text;
  } else {
    const std::string key = text.substr(0, at);
    e.endpoint = text.substr(at + 1);
    if (is_hex_key(key)) {
      e.public_key = z85_from_hex(key);
    } else if (is_valid_public_key(key)) {
      e.public_key = key;
    } else if (key.size() > 4 && key.compare(key.size() - 4, 4, ".pub") == 0) {
      e.public_key = read_public_key_file(key);
    } else {
      throw ConfigError(what + ": '" + key +
                        "' before '@' is not a CURVE public key (64 hex digits, 40 Z85 "
                        "characters, or a .pub file)");
    }
  }
  const HostPort hp = split(e.endpoint, what);
  if (hp.port == "*" || hp.port == "0" || hp.host == "*" || hp.host == "0.0.0.0")
    throw ConfigError(what + ": '" + e.endpoint + "' needs a concrete host and port");
  return e;
}

std::string format_entry_point(const std::string& z85_public_key, const std::string& endpoint) {
  return z85_public_key.empty() ? endpoint : hex_key(z85_public_key) + "@" + endpoint;
}

std::string advertised_endpoint(const std::string& bound, const std::string& advertise_host,
                                const std::vector<EntryPoint>& entries) {
  const HostPort hp = split(bound, "listen address");
  std::string host = hp.host;
  if (!advertise_host.empty()) {
    host = advertise_host;
  } else if (host == "0.0.0.0" || host == "*") {
    if (!entries.empty()) {
      const HostPort entry = split(entries.front().endpoint, "--join");
      host = local_address_towards(entry.host, entry.port);
    }
    if (host.empty() || host == "0.0.0.0" || host == "*") {
      char name[256] = {};
      ::gethostname(name, sizeof name - 1);
      host = local_address_towards(name, "9");
    }
    if (host.empty())
      throw ConfigError("cannot tell which address other peers reach " + bound +
                        " at; give it with --advertise");
  }
  return "tcp://" + host + ":" + hp.port;
}

}  // namespace starling::net
