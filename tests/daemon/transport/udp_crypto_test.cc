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

TEST(UdpCryptoTest, GatherSealEqualsSealOfTheWholePayload) {
  PacketSealer whole(TestKeys(), kDefaultKeyUpdateInterval);
  PacketSealer gather(TestKeys(), kDefaultKeyUpdateInterval);
  std::vector<uint8_t> plain(3000);
  std::iota(plain.begin(), plain.end(), 0);
  std::vector<uint8_t> a(kHeaderSize + plain.size() + kAeadTagSize);
  std::memcpy(a.data() + kHeaderSize, plain.data(), plain.size());
  ASSERT_TRUE(whole.Seal(9, 3, absl::MakeSpan(a), plain.size()).ok());
  // 11 bytes of prefix in the packet, the rest from two places elsewhere (a ring that wraps).
  std::vector<uint8_t> b(a.size());
  std::memcpy(b.data() + kHeaderSize, plain.data(), 11);
  const absl::Span<const uint8_t> tail[] = {absl::MakeConstSpan(plain).subspan(11, 1001),
                                            absl::MakeConstSpan(plain).subspan(1012)};
  auto size = gather.SealGather(9, 3, absl::MakeSpan(b), 11, tail);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, a.size());
  EXPECT_EQ(a, b);
}

// Opens `packet` with payload bytes [from, end) scattered over pieces of `sizes`.
std::vector<uint8_t> OpenScattered(PacketOpener& opener, std::vector<uint8_t> packet, size_t from,
                                   const std::vector<size_t>& sizes, absl::Status* status,
                                   std::vector<uint8_t>* in_place) {
  const size_t payload_length = packet.size() - kPacketOverhead;
  std::vector<uint8_t> out(payload_length - from, 0xEE);
  size_t seen_head = 0;
  auto scatter = [&](absl::Span<const uint8_t> head, size_t length) {
    seen_head = head.size();
    EXPECT_EQ(length, payload_length);
    Scatter s;
    s.from = from;
    size_t at = 0;
    for (size_t n : sizes) {
      s.pieces[s.count++] = absl::MakeSpan(out.data() + at, n);
      at += n;
    }
    return s;
  };
  PacketHeader h;
  Scatter used;
  auto payload = opener.Open(7, absl::MakeSpan(packet), &h, scatter, &used);
  EXPECT_EQ(seen_head, std::min(payload_length, PacketOpener::kHeadBytes));
  *status = payload.status();
  if (payload.ok()) {
    EXPECT_EQ(used.count, sizes.size());
  }
  *in_place = packet;
  return out;
}

TEST(UdpCryptoTest, OpenDecryptsTheTailStraightIntoItsPieces) {
  PacketSealer sealer(TestKeys(), kDefaultKeyUpdateInterval);
  PacketOpener opener(TestKeys());
  std::string text(5000, 'x');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 23);
  uint64_t pn = 1;
  // The scattered part starting inside and past the in-place head, in one piece or several.
  for (size_t from : {size_t{0}, size_t{11}, PacketOpener::kHeadBytes - 5, PacketOpener::kHeadBytes,
                      size_t{1000}}) {
    for (const std::vector<size_t>& split :
         {std::vector<size_t>{text.size() - from},
          std::vector<size_t>{1, 3, 17, text.size() - from - 21}}) {
      auto packet = Sealed(sealer, 7, pn++, text);
      absl::Status status;
      std::vector<uint8_t> in_place;
      auto out = OpenScattered(opener, packet, from, split, &status, &in_place);
      ASSERT_TRUE(status.ok()) << status << " from " << from;
      EXPECT_EQ(Text(out), text.substr(from)) << "from " << from;
      EXPECT_EQ(
          Text(absl::MakeConstSpan(in_place).subspan(kHeaderSize, std::min(from, text.size()))),
          text.substr(0, from));
    }
  }
}

TEST(UdpCryptoTest, TamperedPacketFailsWhenScatteredAndLeavesTheDatagramAsItWas) {
  PacketSealer sealer(TestKeys(), kDefaultKeyUpdateInterval);
  PacketOpener opener(TestKeys());
  const std::string text(2000, 'q');
  const auto original = Sealed(sealer, 7, 1, text);
  for (size_t i :
       {size_t{10}, size_t{kHeaderSize + 3}, size_t{kHeaderSize + 1500}, original.size() - 1}) {
    auto packet = original;
    packet[i] ^= 0x10;
    absl::Status status;
    std::vector<uint8_t> in_place;
    OpenScattered(opener, packet, 100, {text.size() - 100}, &status, &in_place);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << "byte " << i;
    // The head was decrypted in place and put back: the datagram holds the ciphertext again.
    EXPECT_EQ(in_place, packet) << "byte " << i;
  }
  absl::Status status;
  std::vector<uint8_t> in_place;
  auto out = OpenScattered(opener, original, 100, {text.size() - 100}, &status, &in_place);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(Text(out), text.substr(100));
}

}  // namespace
}  // namespace longhaul::transport::udp
