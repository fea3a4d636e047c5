// Endpoint strings: "tcp://HOST:PORT", and entry points "tcp://HOST:PORT" or
// "PUBLICKEY@tcp://HOST:PORT" (the key names which allowlisted peer listens there; without it a
// joining peer tries every key on its allowlist at once). The key may be written in hex (the form
// peers print, safe in a shell unquoted), in Z85 (quoted: it has shell metacharacters), or as the
// path of a ".pub" file.
#pragma once

#include <string>
#include <vector>

#include "starling/net/keys.h"

namespace starling::net {

struct EntryPoint {
  std::string endpoint;
  std::string public_key;  // empty when not given
};

// Throws ConfigError naming `what` (e.g. "--join") when the text is not a valid entry point. The
// returned key is Z85, whatever form the text used.
EntryPoint parse_entry_point(const std::string& text, const std::string& what);

// "HEXKEY@tcp://HOST:PORT" for a Z85 public key (just the endpoint when the key is empty): the
// form to print for others to paste.
std::string format_entry_point(const std::string& z85_public_key, const std::string& endpoint);

// The public keys a client should try for `entry`: none needed (insecure: one empty key), the
// one the entry names, or every allowlisted key but `own_public_key` (only the right one
// completes the CURVE handshake). A joiner passes its own key (it does not join itself); a status
// query passes "", since it may ask the peer that runs with the same key.
std::vector<std::string> candidate_server_keys(const EntryPoint& entry, bool insecure,
                                               const std::string& own_public_key,
                                               const std::vector<AllowedKey>& allowlist);

// Checks "tcp://HOST:PORT" (PORT may be 0 or '*'); throws ConfigError naming `what`.
void check_tcp_endpoint(const std::string& endpoint, const std::string& what);

// The HOST of "tcp://HOST:PORT", without an IPv6 address's brackets; throws ConfigError.
std::string endpoint_host(const std::string& endpoint);

// The address others should use to reach a socket bound at `bound` (as ZeroMQ reports it, with
// the real port). A wildcard host is replaced by `advertise_host` when given, else by the local
// address that routes to the first entry point, else by the host name's address.
std::string advertised_endpoint(const std::string& bound, const std::string& advertise_host,
                                const std::vector<EntryPoint>& entries);

}  // namespace starling::net
