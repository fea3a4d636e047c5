#include "starling/net/link_crypto.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <string>

#include "starling/common/error.h"

namespace starling::net {
namespace {

// Fails loudly: a false return from OpenSSL here means a broken library or an exhausted machine,
// never bad input from a peer (that is `open` returning false).
void check(int ok, const char* what) {
  if (ok <= 0) throw NetError(std::string("direct link cryptography: ") + what + " failed");
}

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;

Pkey private_key(const Key32& secret) {
  Pkey k(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, secret.data(), secret.size()));
  check(k != nullptr, "loading an X25519 secret key");
  return k;
}

// OpenSSL takes at most INT_MAX bytes per update.
constexpr size_t kUpdateBytes = size_t{1} << 30;

}  // namespace

EphemeralKey make_ephemeral_key() {
  EphemeralKey k;
  check(RAND_bytes(k.secret.data(), static_cast<int>(k.secret.size())), "random bytes");
  const Pkey key = private_key(k.secret);
  size_t len = k.public_key.size();
  check(EVP_PKEY_get_raw_public_key(key.get(), k.public_key.data(), &len), "an X25519 public key");
  return k;
}

Key32 x25519(const Key32& secret, const Key32& public_key) {
  const Pkey mine = private_key(secret);
  const Pkey theirs(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, public_key.data(), public_key.size()));
  check(theirs != nullptr, "loading an X25519 public key");
  const PkeyCtx ctx(EVP_PKEY_CTX_new(mine.get(), nullptr));
  check(ctx != nullptr, "an X25519 context");
  check(EVP_PKEY_derive_init(ctx.get()), "X25519");
  Key32 shared{};
  size_t len = shared.size();
  // OpenSSL refuses a public key whose shared secret is all zeros (a low-order point).
  if (EVP_PKEY_derive_set_peer(ctx.get(), theirs.get()) <= 0 ||
      EVP_PKEY_derive(ctx.get(), shared.data(), &len) <= 0 || len != shared.size())
    throw NetError("a direct link's X25519 key gives no shared secret (a low-order point)");
  return shared;
}

Key32 derive_link_key(const Key32& static_shared, const Key32& ephemeral_shared,
                      std::span<const uint8_t> transcript) {
  static constexpr char kSalt[] = "starling direct link v1";
  uint8_t ikm[64];
  std::copy(static_shared.begin(), static_shared.end(), ikm);
  std::copy(ephemeral_shared.begin(), ephemeral_shared.end(), ikm + 32);
  const PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  check(ctx != nullptr, "an HKDF context");
  check(EVP_PKEY_derive_init(ctx.get()), "HKDF");
  check(EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()), "HKDF's hash");
  check(EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), reinterpret_cast<const unsigned char*>(kSalt),
                                    sizeof kSalt - 1),
        "HKDF's salt");
  check(EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), ikm, sizeof ikm), "HKDF's key");
  check(EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), transcript.data(),
                                    static_cast<int>(transcript.size())),
        "HKDF's info");
  Key32 key{};
  size_t len = key.size();
  check(EVP_PKEY_derive(ctx.get(), key.data(), &len), "HKDF");
  OPENSSL_cleanse(ikm, sizeof ikm);
  return key;
}

LinkCipher::LinkCipher(const Key32& key, Role role) {
  ctx_ = EVP_CIPHER_CTX_new();
  check(ctx_ != nullptr, "a cipher context");
  check(EVP_CipherInit_ex(ctx_, EVP_aes_256_gcm(), nullptr, key.data(), nullptr,
                          role == Role::seal ? 1 : 0),
        "AES-256-GCM");
}

LinkCipher::~LinkCipher() { EVP_CIPHER_CTX_free(ctx_); }

void LinkCipher::start_record() {
  // 96-bit nonce: four zero bytes, then the record count (never repeats under one key).
  uint8_t nonce[12] = {};
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(records_ >> (8 * i));
  ++records_;
  check(EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce, -1), "a record's nonce");
}

void LinkCipher::seal(std::span<const uint8_t> header, uint8_t* data, size_t n, uint8_t* tag) {
  start_record();
  int len = 0;
  check(EVP_EncryptUpdate(ctx_, nullptr, &len, header.data(), static_cast<int>(header.size())),
        "a record's header");
  for (size_t at = 0; at < n; at += kUpdateBytes) {
    const int part = static_cast<int>(std::min(kUpdateBytes, n - at));
    check(EVP_EncryptUpdate(ctx_, data + at, &len, data + at, part), "encryption");
  }
  uint8_t none[16];  // GCM's final step writes nothing
  check(EVP_EncryptFinal_ex(ctx_, none, &len), "encryption");
  check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag), "a record's tag");
}

bool LinkCipher::open(std::span<const uint8_t> header, uint8_t* data, size_t n,
                      const uint8_t* tag) {
  start_record();
  int len = 0;
  if (EVP_DecryptUpdate(ctx_, nullptr, &len, header.data(), static_cast<int>(header.size())) <= 0)
    return false;
  for (size_t at = 0; at < n; at += kUpdateBytes) {
    const int part = static_cast<int>(std::min(kUpdateBytes, n - at));
    if (EVP_DecryptUpdate(ctx_, data + at, &len, data + at, part) <= 0) return false;
  }
  uint8_t copy[kTagBytes];
  std::copy(tag, tag + kTagBytes, copy);
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagBytes, copy) <= 0) return false;
  uint8_t none[16];
  return EVP_DecryptFinal_ex(ctx_, none, &len) > 0;
}

}  // namespace starling::net
