// The cryptography of sealed direct links (direct_links.h): CURVE swarms carry collective chunks
// on direct TCP connections too, so each connection needs its own authenticated encryption.
//
// Handshake (once per TCP connection; the connection is then kept across operations):
//   sender -> receiver: "connection hello" = sender id, receiver id, the sender's fresh X25519 key
//   receiver -> sender: the receiver's fresh X25519 key
//   both: key = HKDF-SHA256(DH(static keys) || DH(fresh keys), the two messages)
// The static keys are the peers' CURVE keys from the swarm's allowlist, so only the two peers the
// hello names can derive the key (authentication); the fresh keys give each connection its own key,
// so a recorded connection replayed later fails (the receiver's half is new), and a stolen static
// key does not open past traffic (forward secrecy).
//
// Records: AES-256-GCM, one direction per connection (sender to receiver), the nonce a record
// counter; a record's header travels in clear and is authenticated with it. A record out of place
// (dropped, reordered, replayed) fails like a forged one. OpenSSL's AES-GCM uses the CPU's AES
// and carry-less multiply instructions: about 3x libsodium's ciphers (which CURVE uses) per core.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

struct evp_cipher_ctx_st;

namespace starling::net {

using Key32 = std::array<uint8_t, 32>;

struct EphemeralKey {
  Key32 secret{}, public_key{};
};

// A fresh X25519 key pair.
EphemeralKey make_ephemeral_key();

// The X25519 shared secret of `secret` and `public_key` (a CURVE key pair's halves are X25519
// keys). Throws NetError when `public_key` gives no usable secret (a low-order point).
Key32 x25519(const Key32& secret, const Key32& public_key);

// The connection's key: HKDF-SHA256 over both shared secrets, bound to the handshake `transcript`.
Key32 derive_link_key(const Key32& static_shared, const Key32& ephemeral_shared,
                      std::span<const uint8_t> transcript);

// One direction of one connection's records.
class LinkCipher {
 public:
  static constexpr size_t kTagBytes = 16;
  enum class Role { seal, open };

  LinkCipher(const Key32& key, Role role);
  ~LinkCipher();
  LinkCipher(const LinkCipher&) = delete;
  LinkCipher& operator=(const LinkCipher&) = delete;

  // Encrypts `data` (n bytes, in place) as the next record, authenticating `header` with it, and
  // writes the record's tag (kTagBytes) to `tag`.
  void seal(std::span<const uint8_t> header, uint8_t* data, size_t n, uint8_t* tag);
  // Decrypts the next record in place. False when it is not authentic: forged, damaged or out of
  // place. The connection must then be dropped (its record count no longer matches).
  [[nodiscard]] bool open(std::span<const uint8_t> header, uint8_t* data, size_t n,
                          const uint8_t* tag);

 private:
  void start_record();

  evp_cipher_ctx_st* ctx_ = nullptr;
  uint64_t records_ = 0;
};

}  // namespace starling::net
