#include "daemon/transport/udp_crypto.h"

#include <openssl/sha.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/check.h"

namespace longhaul::transport::udp {
namespace {

constexpr char kUpdateLabel[] = "longhaul-udp key update";

void MakeNonce(const std::array<uint8_t, kIvSize>& iv, uint64_t pn, uint8_t out[kIvSize]) {
  std::memcpy(out, iv.data(), kIvSize);
  for (int i = 0; i < 8; ++i) out[kIvSize - 1 - i] ^= static_cast<uint8_t>(pn >> (8 * i));
}

bool KeyPhaseOf(uint64_t generation) { return (generation & 1) != 0; }

}  // namespace

std::array<uint8_t, kKeySize> NextKey(const std::array<uint8_t, kKeySize>& key) {
  uint8_t input[sizeof kUpdateLabel - 1 + kKeySize];
  std::memcpy(input, kUpdateLabel, sizeof kUpdateLabel - 1);
  std::memcpy(input + sizeof kUpdateLabel - 1, key.data(), kKeySize);
  std::array<uint8_t, kKeySize> next;
  static_assert(SHA256_DIGEST_LENGTH == kKeySize);
  unsigned int len = 0;
  LONGHAUL_CHECK(EVP_Digest(input, sizeof input, next.data(), &len, EVP_sha256(), nullptr) == 1);
  OPENSSL_cleanse(input, sizeof input);
  return next;
}

absl::StatusOr<ConnectionKeys> SplitExportedKeys(absl::Span<const uint8_t> exported) {
  if (exported.size() != kExportLength) {
    return absl::InvalidArgumentError("exported key material has the wrong length");
  }
  ConnectionKeys keys;
  const uint8_t* p = exported.data();
  std::memcpy(keys.dialer_to_listener.key.data(), p, kKeySize);
  std::memcpy(keys.dialer_to_listener.iv.data(), p + kKeySize, kIvSize);
  p += kKeySize + kIvSize;
  std::memcpy(keys.listener_to_dialer.key.data(), p, kKeySize);
  std::memcpy(keys.listener_to_dialer.iv.data(), p + kKeySize, kIvSize);
  return keys;
}

PacketSealer::PacketSealer(const DirectionKeys& keys, uint64_t key_update_interval)
    : keys_(keys), key_update_interval_(key_update_interval), ctx_(EVP_CIPHER_CTX_new()) {
  LONGHAUL_CHECK(ctx_ != nullptr);
  LONGHAUL_CHECK(key_update_interval_ > 0u);
  LONGHAUL_CHECK(
      EVP_EncryptInit_ex(ctx_.get(), EVP_aes_256_gcm(), nullptr, keys_.key.data(), nullptr) == 1);
}

absl::Status PacketSealer::Rekey() {
  keys_.key = NextKey(keys_.key);
  ++generation_;
  if (EVP_EncryptInit_ex(ctx_.get(), nullptr, nullptr, keys_.key.data(), nullptr) != 1) {
    return absl::InternalError("AES-GCM key update failed");
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> PacketSealer::Seal(uint64_t connection_id, uint64_t packet_number,
                                          absl::Span<uint8_t> packet, size_t payload_length) {
  return SealGather(connection_id, packet_number, packet, payload_length, {});
}

absl::StatusOr<size_t> PacketSealer::SealGather(uint64_t connection_id, uint64_t packet_number,
                                                absl::Span<uint8_t> packet, size_t prefix_length,
                                                absl::Span<const absl::Span<const uint8_t>> tail) {
  size_t payload_length = prefix_length;
  for (absl::Span<const uint8_t> part : tail) payload_length += part.size();
  LONGHAUL_CHECK(packet.size() >= kHeaderSize + payload_length + kAeadTagSize);
  if (!started_) {
    started_ = true;
    generation_first_pn_ = packet_number;
  } else if (packet_number - generation_first_pn_ >= key_update_interval_) {
    if (absl::Status s = Rekey(); !s.ok()) return s;
    generation_first_pn_ = packet_number;
  }
  PacketHeader header{connection_id, packet_number, KeyPhaseOf(generation_)};
  WriteHeader(header, packet);
  uint8_t nonce[kIvSize];
  MakeNonce(keys_.iv, packet_number, nonce);
  EVP_CIPHER_CTX* ctx = ctx_.get();
  int len = 0;
  uint8_t* payload = packet.data() + kHeaderSize;
  bool ok = EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) == 1 &&
            EVP_EncryptUpdate(ctx, nullptr, &len, packet.data(), kHeaderSize) == 1 &&
            EVP_EncryptUpdate(ctx, payload, &len, payload, static_cast<int>(prefix_length)) == 1;
  size_t at = prefix_length;
  for (absl::Span<const uint8_t> part : tail) {
    if (!ok || part.empty()) continue;
    ok =
        EVP_EncryptUpdate(ctx, payload + at, &len, part.data(), static_cast<int>(part.size())) == 1;
    at += part.size();
  }
  if (!ok || EVP_EncryptFinal_ex(ctx, payload + at, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kAeadTagSize, payload + payload_length) != 1) {
    return absl::InternalError("AES-GCM encryption failed");
  }
  return kHeaderSize + payload_length + kAeadTagSize;
}

PacketOpener::PacketOpener(const DirectionKeys& keys) : iv_(keys.iv) {
  Install(current_, keys.key);
  Install(next_, NextKey(keys.key));
}

void PacketOpener::Install(Generation& g, const std::array<uint8_t, kKeySize>& key) {
  if (g.ctx == nullptr) g.ctx.reset(EVP_CIPHER_CTX_new());
  LONGHAUL_CHECK(g.ctx != nullptr);
  g.key = key;
  LONGHAUL_CHECK(
      EVP_DecryptInit_ex(g.ctx.get(), EVP_aes_256_gcm(), nullptr, g.key.data(), nullptr) == 1);
  g.valid = true;
}

bool PacketOpener::TryOpen(Generation& g, const PacketHeader& h, absl::Span<uint8_t> datagram,
                           const ScatterFn* scatter, Scatter* scattered) {
  if (!g.valid) return false;
  uint8_t nonce[kIvSize];
  MakeNonce(iv_, h.packet_number, nonce);
  const size_t ciphertext_length = datagram.size() - kPacketOverhead;
  uint8_t* payload = datagram.data() + kHeaderSize;
  // Decrypts the head in place, then the rest where the Scatter says (in
  // place by default). If the tag does not verify, the same keystream is
  // applied to the head again to restore the ciphertext, so another
  // generation's key can still be tried and the caller never sees
  // unauthenticated plaintext in the datagram.
  EVP_CIPHER_CTX* ctx = g.ctx.get();
  int len = 0;
  const size_t head =
      scatter != nullptr ? std::min(ciphertext_length, kHeadBytes) : ciphertext_length;
  if (EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_DecryptUpdate(ctx, nullptr, &len, datagram.data(), kHeaderSize) != 1 ||
      EVP_DecryptUpdate(ctx, payload, &len, payload, static_cast<int>(head)) != 1) {
    return false;
  }
  Scatter chosen;
  if (scatter != nullptr)
    chosen = (*scatter)(absl::MakeConstSpan(payload, head), ciphertext_length);
  const size_t in_place = chosen.count > 0 ? std::max(head, chosen.from) : ciphertext_length;
  bool ok = true;
  if (chosen.count > 0) {
    size_t total = 0;
    for (size_t i = 0; i < chosen.count; ++i) total += chosen.pieces[i].size();
    LONGHAUL_CHECK(chosen.from <= ciphertext_length && chosen.count <= Scatter::kMaxPieces &&
                   total == ciphertext_length - chosen.from);
    // Payload bytes [at, ciphertext_length) go to the pieces in order; those below `head` are
    // plaintext already and are copied, the others are decrypted straight into place.
    size_t at = chosen.from;
    if (at > head) {
      ok = EVP_DecryptUpdate(ctx, payload + head, &len, payload + head,
                             static_cast<int>(at - head)) == 1;
    }
    for (size_t i = 0; i < chosen.count && ok; ++i) {
      uint8_t* out = chosen.pieces[i].data();
      size_t n = chosen.pieces[i].size();
      if (at < head) {
        const size_t copied = std::min(n, head - at);
        std::memcpy(out, payload + at, copied);
        out += copied;
        n -= copied;
        at += copied;
      }
      if (n > 0) {
        ok = EVP_DecryptUpdate(ctx, out, &len, payload + at, static_cast<int>(n)) == 1;
        at += n;
      }
    }
  } else if (head < ciphertext_length) {
    ok = EVP_DecryptUpdate(ctx, payload + head, &len, payload + head,
                           static_cast<int>(ciphertext_length - head)) == 1;
  }
  if (ok &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kAeadTagSize, payload + ciphertext_length) ==
          1 &&
      EVP_DecryptFinal_ex(ctx, payload + ciphertext_length, &len) == 1) {
    if (scattered != nullptr) *scattered = chosen;
    return true;
  }
  // Restore the ciphertext: CTR-mode decryption is an XOR with the keystream.
  int restored = 0;
  EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce);
  EVP_DecryptUpdate(ctx, payload, &restored, payload, static_cast<int>(in_place));
  return false;
}

absl::StatusOr<absl::Span<uint8_t>> PacketOpener::Open(uint64_t expected_connection_id,
                                                       absl::Span<uint8_t> datagram,
                                                       PacketHeader* header) {
  return OpenImpl(expected_connection_id, datagram, header, nullptr, nullptr);
}

absl::StatusOr<absl::Span<uint8_t>> PacketOpener::Open(uint64_t expected_connection_id,
                                                       absl::Span<uint8_t> datagram,
                                                       PacketHeader* header, ScatterFn scatter,
                                                       Scatter* scattered) {
  return OpenImpl(expected_connection_id, datagram, header, &scatter, scattered);
}

absl::StatusOr<absl::Span<uint8_t>> PacketOpener::OpenImpl(uint64_t expected_connection_id,
                                                           absl::Span<uint8_t> datagram,
                                                           PacketHeader* header,
                                                           const ScatterFn* scatter,
                                                           Scatter* scattered) {
  if (scattered != nullptr) *scattered = Scatter{};
  auto parsed = ParseHeader(datagram);
  if (!parsed.ok()) return parsed.status();
  if (parsed->connection_id != expected_connection_id) {
    return absl::InvalidArgumentError("packet for another connection");
  }
  *header = *parsed;
  const absl::Span<uint8_t> payload =
      datagram.subspan(kHeaderSize, datagram.size() - kPacketOverhead);
  if (header->key_phase == KeyPhaseOf(generation_)) {
    if (TryOpen(current_, *header, datagram, scatter, scattered)) {
      if (header->packet_number < generation_first_pn_) generation_first_pn_ = header->packet_number;
      return payload;
    }
  } else if (previous_.valid && header->packet_number < generation_first_pn_) {
    // A late packet from before the peer's last key update.
    if (TryOpen(previous_, *header, datagram, scatter, scattered)) return payload;
  } else if (TryOpen(next_, *header, datagram, scatter, scattered)) {
    // The peer moved to the next generation: rotate previous <- current <- next.
    std::swap(previous_, current_);
    std::swap(current_, next_);
    Install(next_, NextKey(current_.key));
    ++generation_;
    generation_first_pn_ = header->packet_number;
    return payload;
  }
  return absl::PermissionDeniedError("packet failed authentication");
}

}  // namespace longhaul::transport::udp
