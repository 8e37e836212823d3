#ifndef LONGHAUL_DAEMON_TRANSPORT_UDP_CRYPTO_H_
#define LONGHAUL_DAEMON_TRANSPORT_UDP_CRYPTO_H_

// Packet protection for the udp transport (proto/UDP.md, "Protection"):
// AES-256-GCM through OpenSSL EVP on every packet, the 17-byte header as
// associated data, the nonce the direction's IV XOR the packet number
// (RFC 8446 §5.3 style). A sender never repeats a packet number, so a key is
// never used twice with one nonce. Keys are replaced before the RFC 9001 §6.6
// confidentiality limit for AES-GCM (2^23 packets): every `key_update_interval`
// packets the sender moves to the next key generation and flips the header's
// key phase bit; the receiver follows once a packet authenticates under the
// next key (RFC 9001 §6 key update, simplified: no confirmation round trip).

#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/transport/udp_packet.h"

namespace longhaul::transport::udp {

inline constexpr size_t kKeySize = 32;
inline constexpr size_t kIvSize = 12;
// RFC 9001 §6.6: 2^23 packets for AEAD_AES_256_GCM. We update at half of it.
inline constexpr uint64_t kDefaultKeyUpdateInterval = uint64_t{1} << 22;

struct DirectionKeys {
  std::array<uint8_t, kKeySize> key{};
  std::array<uint8_t, kIvSize> iv{};
};

// The key of the next generation: SHA-256("longhaul-udp key update" || key).
std::array<uint8_t, kKeySize> NextKey(const std::array<uint8_t, kKeySize>& key);

// The two directions' keys from `kExportLength` bytes of TLS exporter output:
// the dialer sends with the first half and the listener with the second.
inline constexpr size_t kExportLength = 2 * (kKeySize + kIvSize);
inline constexpr char kExportLabel[] = "EXPORTER-longhaul-udp-v1";
struct ConnectionKeys {
  DirectionKeys dialer_to_listener;
  DirectionKeys listener_to_dialer;
};
absl::StatusOr<ConnectionKeys> SplitExportedKeys(absl::Span<const uint8_t> exported);

struct EvpCtxDeleter {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using EvpCtx = std::unique_ptr<EVP_CIPHER_CTX, EvpCtxDeleter>;

// Seals outgoing packets. Not thread-safe; owned by the connection's I/O thread.
class PacketSealer {
 public:
  PacketSealer(const DirectionKeys& keys, uint64_t key_update_interval);

  // `packet` holds kHeaderSize bytes of room, then `payload_length` bytes of
  // plaintext, then kAeadTagSize bytes of room. Writes the header for
  // (`connection_id`, `packet_number`) and encrypts in place. Packet numbers
  // must increase. Returns the datagram length.
  absl::StatusOr<size_t> Seal(uint64_t connection_id, uint64_t packet_number,
                              absl::Span<uint8_t> packet, size_t payload_length);
  // Like Seal, but the plaintext is the `prefix_length` bytes after the header
  // followed by the bytes of `tail`, which are encrypted from where they are
  // (e.g. the send ring) straight into `packet` after the prefix; the tag
  // follows them. `packet` must hold the header, the whole payload and the tag.
  absl::StatusOr<size_t> SealGather(uint64_t connection_id, uint64_t packet_number,
                                    absl::Span<uint8_t> packet, size_t prefix_length,
                                    absl::Span<const absl::Span<const uint8_t>> tail);

  uint64_t key_generation() const { return generation_; }

 private:
  absl::Status Rekey();
  DirectionKeys keys_;
  uint64_t key_update_interval_;
  uint64_t generation_ = 0;
  uint64_t generation_first_pn_ = 0;
  bool started_ = false;
  EvpCtx ctx_;
};

// Where Open decrypts the end of a payload to instead of back into the
// datagram: payload bytes [from, payload length) go, in order, to pieces[0],
// pieces[1], ... (their sizes add up to payload length - from). `count` 0
// decrypts everything in place.
struct Scatter {
  static constexpr size_t kMaxPieces = 6;
  size_t from = 0;
  std::array<absl::Span<uint8_t>, kMaxPieces> pieces{};
  size_t count = 0;
};

// Opens incoming packets. Not thread-safe; owned by the connection's I/O thread.
class PacketOpener {
 public:
  // Decrypted in place before Open asks for a Scatter: enough for every frame
  // that precedes a STREAM frame's data in a packet of ours.
  static constexpr size_t kHeadBytes = 384;
  // Chooses a Scatter from the first min(payload length, kHeadBytes) bytes
  // of plaintext, which are not yet authenticated: a Scatter may only name
  // memory that holds nothing anyone relies on until the packet is accepted,
  // since a packet that fails authentication leaves garbage there.
  using ScatterFn =
      absl::FunctionRef<Scatter(absl::Span<const uint8_t> head, size_t payload_length)>;

  explicit PacketOpener(const DirectionKeys& keys);

  // Authenticates and decrypts `datagram` in place. Returns the plaintext
  // payload (a view into `datagram`) or an error if the header is malformed,
  // names another connection, or the packet fails authentication under every
  // candidate key (previous, current and next generation).
  absl::StatusOr<absl::Span<uint8_t>> Open(uint64_t expected_connection_id,
                                           absl::Span<uint8_t> datagram, PacketHeader* header);
  // Like Open, but decrypts the payload's tail where `scatter` says (one AES
  // pass from the datagram to its destination, no copy). On success
  // `*scattered` is the Scatter used, and the returned payload's bytes from
  // scattered->from on are in its pieces, not in the datagram.
  absl::StatusOr<absl::Span<uint8_t>> Open(uint64_t expected_connection_id,
                                           absl::Span<uint8_t> datagram, PacketHeader* header,
                                           ScatterFn scatter, Scatter* scattered);

  uint64_t key_generation() const { return generation_; }

 private:
  struct Generation {
    std::array<uint8_t, kKeySize> key{};
    EvpCtx ctx;
    bool valid = false;
  };
  absl::StatusOr<absl::Span<uint8_t>> OpenImpl(uint64_t expected_connection_id,
                                               absl::Span<uint8_t> datagram, PacketHeader* header,
                                               const ScatterFn* scatter, Scatter* scattered);
  bool TryOpen(Generation& g, const PacketHeader& h, absl::Span<uint8_t> datagram,
               const ScatterFn* scatter, Scatter* scattered);
  void Install(Generation& g, const std::array<uint8_t, kKeySize>& key);

  std::array<uint8_t, kIvSize> iv_{};
  Generation previous_, current_, next_;
  uint64_t generation_ = 0;
  uint64_t generation_first_pn_ = 0;  // lowest packet number seen under current_
};

}  // namespace longhaul::transport::udp

#endif  // LONGHAUL_DAEMON_TRANSPORT_UDP_CRYPTO_H_
