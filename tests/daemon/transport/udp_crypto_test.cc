#include "daemon/transport/udp_crypto.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace longhaul::transport::udp {
namespace {

DirectionKeys TestKeys() {
  DirectionKeys k;
  std::iota(k.key.begin(), k.key.end(), 1);
  std::iota(k.iv.begin(), k.iv.end(), 100);
  return k;
}

// A sealed datagram carrying `text` as its payload.
std::vector<uint8_t> Sealed(PacketSealer& sealer, uint64_t cid, uint64_t pn, const std::string& text) {
  std::vector<uint8_t> packet(kHeaderSize + text.size() + kAeadTagSize);
  std::memcpy(packet.data() + kHeaderSize, text.data(), text.size());
  auto size = sealer.Seal(cid, pn, absl::MakeSpan(packet), text.size());
  EXPECT_TRUE(size.ok());
  EXPECT_EQ(*size, packet.size());
  return packet;
}

std::string Text(absl::Span<const uint8_t> s) { return std::string(s.begin(), s.end()); }

TEST(UdpCryptoTest, SealOpenRoundTrip) {
  PacketSealer sealer(TestKeys(), kDefaultKeyUpdateInterval);
  PacketOpener opener(TestKeys());
  auto packet = Sealed(sealer, 42, 1, "chunk bytes");
  // The payload is not sent in the clear.
  EXPECT_EQ(std::search(packet.begin(), packet.end(), std::begin("chunk"), std::end("chunk") - 1),
            packet.end());
  PacketHeader h;
  auto payload = opener.Open(42, absl::MakeSpan(packet), &h);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(Text(*payload), "chunk bytes");
  EXPECT_EQ(h.packet_number, 1u);
}

TEST(UdpCryptoTest, EveryTamperedByteFailsAuthentication) {
  PacketSealer sealer(TestKeys(), kDefaultKeyUpdateInterval);
  PacketOpener opener(TestKeys());
  const auto original = Sealed(sealer, 7, 5, "do not touch");
  for (size_t i = 0; i < original.size(); ++i) {
    auto packet = original;
    packet[i] ^= 0x04;
    PacketHeader h;
    auto payload = opener.Open(7, absl::MakeSpan(packet), &h);
    EXPECT_FALSE(payload.ok()) << "byte " << i;
  }
  // The untouched packet still opens: failed attempts left no state behind.
  auto packet = original;
  PacketHeader h;
  EXPECT_TRUE(opener.Open(7, absl::MakeSpan(packet), &h).ok());
}

TEST(UdpCryptoTest, PacketNumberIsAuthenticated) {
  PacketSealer sealer(TestKeys(), kDefaultKeyUpdateInterval);
  PacketOpener opener(TestKeys());
  auto packet = Sealed(sealer, 7, 5, "x");
  packet[9] = 6;  // claim packet number 6
  PacketHeader h;
  EXPECT_EQ(opener.Open(7, absl::MakeSpan(packet), &h).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(UdpCryptoTest, WrongKeyOrConnectionIsRefused) {
  PacketSealer sealer(TestKeys(), kDefaultKeyUpdateInterval);
  DirectionKeys other = TestKeys();
  other.key[0] ^= 1;
  PacketOpener opener(other);
  auto packet = Sealed(sealer, 7, 1, "x");
  PacketHeader h;
  EXPECT_EQ(opener.Open(7, absl::MakeSpan(packet), &h).status().code(),
            absl::StatusCode::kPermissionDenied);
  PacketOpener right(TestKeys());
  EXPECT_EQ(right.Open(8, absl::MakeSpan(packet), &h).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(UdpCryptoTest, NoncesDifferPerPacketNumber) {
  PacketSealer sealer(TestKeys(), kDefaultKeyUpdateInterval);
  auto a = Sealed(sealer, 1, 1, "same plaintext");
  auto b = Sealed(sealer, 1, 2, "same plaintext");
  EXPECT_NE(std::vector<uint8_t>(a.begin() + kHeaderSize, a.end()),
            std::vector<uint8_t>(b.begin() + kHeaderSize, b.end()));
}

TEST(UdpCryptoTest, KeyUpdateEveryIntervalIsFollowedByTheReceiver) {
  constexpr uint64_t kInterval = 4;
  PacketSealer sealer(TestKeys(), kInterval);
  PacketOpener opener(TestKeys());
  std::vector<std::vector<uint8_t>> packets;
  for (uint64_t pn = 1; pn <= 20; ++pn) packets.push_back(Sealed(sealer, 3, pn, "p" + std::to_string(pn)));
  EXPECT_EQ(sealer.key_generation(), 4u);  // pn 5, 9, 13, 17 start generations 1..4
  // Key phase bits alternate per generation.
  EXPECT_EQ(packets[0][0] & kHeaderKeyPhaseBit, 0);
  EXPECT_EQ(packets[4][0] & kHeaderKeyPhaseBit, kHeaderKeyPhaseBit);
  EXPECT_EQ(packets[8][0] & kHeaderKeyPhaseBit, 0);
  // Packets 5..8 are under generation 1: the first key must not open them.
  {
    PacketOpener fresh(TestKeys());
    auto p = packets[4];
    p[0] ^= kHeaderKeyPhaseBit;  // pretend generation 0
    PacketHeader h;
    EXPECT_FALSE(fresh.Open(3, absl::MakeSpan(p), &h).ok());
  }
  for (uint64_t i = 0; i < packets.size(); ++i) {
    if (i == 7) continue;  // delivered late, below
    PacketHeader h;
    auto payload = opener.Open(3, absl::MakeSpan(packets[i]), &h);
    ASSERT_TRUE(payload.ok()) << "pn " << i + 1 << ": " << payload.status();
    EXPECT_EQ(Text(*payload), "p" + std::to_string(i + 1));
  }
  EXPECT_EQ(opener.key_generation(), 4u);
  // Packet 8 (generation 1) arrives after the receiver moved to generation 4:
  // only the previous generation is kept, so it is refused, not misparsed.
  PacketHeader h;
  EXPECT_FALSE(opener.Open(3, absl::MakeSpan(packets[7]), &h).ok());
}

TEST(UdpCryptoTest, LatePacketOfThePreviousGenerationOpens) {
  PacketSealer sealer(TestKeys(), 4);
  PacketOpener opener(TestKeys());
  std::vector<std::vector<uint8_t>> packets;
  for (uint64_t pn = 1; pn <= 6; ++pn) packets.push_back(Sealed(sealer, 3, pn, "x"));
  PacketHeader h;
  for (int i : {0, 1, 2, 4, 5}) ASSERT_TRUE(opener.Open(3, absl::MakeSpan(packets[i]), &h).ok());
  EXPECT_EQ(opener.key_generation(), 1u);
  EXPECT_TRUE(opener.Open(3, absl::MakeSpan(packets[3]), &h).ok());  // pn 4, generation 0
  EXPECT_EQ(opener.key_generation(), 1u);
}

TEST(UdpCryptoTest, ExportedKeysSplitPerDirection) {
  std::vector<uint8_t> exported(kExportLength);
  std::iota(exported.begin(), exported.end(), 0);
  auto keys = SplitExportedKeys(exported);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(keys->dialer_to_listener.key[0], 0);
  EXPECT_EQ(keys->dialer_to_listener.iv[0], 32);
  EXPECT_EQ(keys->listener_to_dialer.key[0], 44);
  EXPECT_EQ(keys->listener_to_dialer.iv[11], 87);
  EXPECT_FALSE(SplitExportedKeys(absl::MakeSpan(exported).subspan(1)).ok());
  EXPECT_NE(NextKey(keys->dialer_to_listener.key), keys->dialer_to_listener.key);
}

}  // namespace
}  // namespace longhaul::transport::udp
