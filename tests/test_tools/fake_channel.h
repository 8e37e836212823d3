// An in-memory connected pair of transport::Channels, for tests that run
// both ends of a peer session in one process without sockets.
//
// What one end writes the other reads, in order, with no limit on what may
// be buffered (a Write never waits for the reader). The ends fail the way a
// TCP+TLS channel does:
//  - Close() (or destroying an end) is a clean end of stream: the peer reads
//    what was written, then Unavailable ("... closed the connection").
//  - Abort() fails the aborting end's pending and future calls with
//    Cancelled, and the peer's reads, once they have taken what arrived, and
//    writes with Unavailable: a Read blocked on either end returns.
//  - CutAfterWrittenBytes(n) models a link cut: the write that crosses the
//    n-th byte delivers the bytes up to it and fails, and from then on both
//    ends' writes fail and their reads fail once they have taken what arrived,
//    all with Unavailable.
//
// Thread-safe, more than the Channel contract asks: any thread may call any
// method of either end.
#ifndef LONGHAUL_TESTS_TEST_TOOLS_FAKE_CHANNEL_H_
#define LONGHAUL_TESTS_TEST_TOOLS_FAKE_CHANNEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/transport/transport.h"

namespace longhaul::transport::testing {

// The state the two ends of a pair share. Opaque outside fake_channel.cc.
class FakeConnection;

class FakeChannel final : public Channel {
 public:
  // Use MakeChannelPair.
  FakeChannel(std::shared_ptr<FakeConnection> connection, int side, std::string peer_site,
              std::string peer_address);
  // Closes this end: the peer reads what was written, then end of stream,
  // and its writes fail.
  ~FakeChannel() override;
  FakeChannel(const FakeChannel&) = delete;
  FakeChannel& operator=(const FakeChannel&) = delete;

  // wire::ByteStream
  absl::Status Write(absl::Span<const absl::Span<const uint8_t>> parts) override;
  absl::Status ReadExactly(absl::Span<uint8_t> out) override;
  const std::string& peer_site() const override { return peer_site_; }

  // Channel
  void Abort() override;
  const std::string& peer_address() const override { return peer_address_; }
  LinkStats Stats() const override { return {}; }

  // Ends this end's writes (a half close, like shutdown(SHUT_WR)): the peer
  // reads what was written, then end of stream. This end still reads what
  // the peer writes. Idempotent; a Write after it is FailedPrecondition.
  void Close();
  // The connection is cut once this end has written `bytes` more bytes (see
  // the file comment). 0 cuts it now.
  void CutAfterWrittenBytes(uint64_t bytes);

  // What this end has written and read so far, and the size of every
  // ReadExactly asked of it, in order.
  uint64_t bytes_written() const;
  uint64_t bytes_read() const;
  std::vector<size_t> read_sizes() const;
  // Waits until a ReadExactly on this end waits for bytes that have not
  // arrived; false if `timeout` passed first.
  bool WaitForBlockedRead(absl::Duration timeout) const;

  // Aborts both ends of this end's connection, whoever owns them, for as
  // long as either end exists (FakeTransport::Shutdown).
  std::weak_ptr<FakeConnection> connection() const { return connection_; }
  static void AbortConnection(FakeConnection& connection);

 private:
  const std::shared_ptr<FakeConnection> connection_;
  const int side_;  // 0 or 1: which end of connection_ this is
  const std::string peer_site_;
  const std::string peer_address_;
};

struct ChannelPair {
  std::unique_ptr<FakeChannel> a;
  std::unique_ptr<FakeChannel> b;
};

// A connected pair: `a` reports `peer_site_a` as its peer_site() (the site
// that holds `b`), and `b` reports `peer_site_b`. peer_address() is
// "fake:" + the peer site unless given.
ChannelPair MakeChannelPair(const std::string& peer_site_a, const std::string& peer_site_b);
ChannelPair MakeChannelPair(const std::string& peer_site_a, const std::string& peer_address_a,
                            const std::string& peer_site_b, const std::string& peer_address_b);

}  // namespace longhaul::transport::testing

#endif  // LONGHAUL_TESTS_TEST_TOOLS_FAKE_CHANNEL_H_
