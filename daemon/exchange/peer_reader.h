#ifndef LONGHAUL_DAEMON_EXCHANGE_PEER_READER_H_
#define LONGHAUL_DAEMON_EXCHANGE_PEER_READER_H_

// Parsing what a peer sends on an exchange link (proto/EXCHANGE.md): CONTROL
// frames holding a v1::ExchangePeerMessage, each segment's frame followed by
// its payload bytes. ReadPeerMessages checks every header against what the
// peer already sent and the message size limit, and tells an InboundSink
// what arrived; the sink decides where payload bytes go. It touches the link
// only through transport::Channel, so a test or a fuzz target can feed it
// bytes from memory.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/exchange.pb.h"

namespace longhaul::exchange {

// The segment checks of one link, without I/O. Not thread-safe; owned by
// the link's reader.
class SegmentTracker {
 public:
  // What a header asks the reader to do.
  enum class Step {
    kMessage,  // a whole message without payload (total_bytes 0)
    kDiscard,  // DISCARD without payload: drop the segments of msg_id
    kFirst,    // the first segment of a message; its payload follows
    kNext,     // a later segment of a started message; its payload follows
  };

  explicit SegmentTracker(std::string from, uint64_t max_message_bytes)
      : from_(std::move(from)), max_message_bytes_(max_message_bytes) {}

  // Classifies `h`. InvalidArgument (the link must close) for a segment that
  // is empty, over kSegmentBytes, past the message's total or the limit, out
  // of order, or of a message never started. A message is forgotten after
  // its last segment's header or its DISCARD.
  absl::StatusOr<Step> OnHeader(const v1::ExchangePeerMessage& h);

  // Messages started and not finished.
  size_t open_messages() const { return received_.size(); }

 private:
  struct Progress {
    uint64_t total = 0;
    uint64_t received = 0;
  };
  const std::string from_;
  const uint64_t max_message_bytes_;
  absl::flat_hash_map<uint64_t, Progress> received_;
};

// Where the messages read from one link go. Called only by that link's
// reader thread, one call at a time; an implementation that shares state
// with other threads locks it itself.
class InboundSink {
 public:
  // A message with payload whose segments are arriving; the sink's own.
  class Incoming {
   public:
    virtual ~Incoming() = default;
  };

  virtual ~InboundSink() = default;

  // A message without payload, other than DISCARD.
  virtual void OnMessage(const std::string& from, const v1::ExchangePeerMessage& header) = 0;
  // The first segment of a message of header.total_bytes() > 0 bytes.
  virtual std::unique_ptr<Incoming> Begin(const std::string& from,
                                          const v1::ExchangePeerMessage& header) = 0;
  // Where to read payload bytes [received, end) of `in`, or a non-empty
  // prefix of them; nullopt: read and drop them. The span stays valid until Read.
  virtual std::optional<absl::Span<uint8_t>> Into(Incoming& in, uint64_t received, uint64_t end,
                                                  transport::Channel& channel) = 0;
  // After the read into what Into returned; `ok` whether it was filled.
  virtual void Read(Incoming& in, uint64_t bytes, bool ok) = 0;
  // Every payload byte of `in` has been read.
  virtual void Complete(const std::string& from, std::unique_ptr<Incoming> in) = 0;
  // `in` will not complete: its sender discarded it, or the link ended.
  virtual void Abandon(std::unique_ptr<Incoming> in) = 0;
};

// The largest ExchangePeerMessage (a frame's protobuf, not its payload) a
// link reads: a JOIN lists the group's sites and a DONE one digest per part,
// so 1 MiB holds groups of thousands of sites. A frame declaring more ends
// the read before any of it is read.
inline constexpr uint32_t kMaxPeerHeaderBytes = 1u << 20;

// Reads `channel` until it fails or sends something malformed, and returns
// why it stopped. `channel.peer_site()` is the sender of every message.
absl::Status ReadPeerMessages(transport::Channel& channel, uint64_t max_message_bytes,
                              InboundSink& sink);

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_PEER_READER_H_
