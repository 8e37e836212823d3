#include "daemon/exchange/gather_checks.h"

#include "absl/strings/str_cat.h"

namespace longhaul::exchange {

using Msg = v1::ExchangePeerMessage;

absl::Status CheckGatherMessage(const std::string& what, const std::string& from, const Msg& h,
                                uint64_t payload_bytes, const GatherCall& call) {
  const std::string head = absl::StrCat(what, ": ", from);
  if (h.kind() != call.kind) {
    return absl::FailedPreconditionError(absl::StrCat(head, " sent ", Msg::Kind_Name(h.kind()),
                                                      ", expected ", Msg::Kind_Name(call.kind)));
  }
  if (h.generation() != call.generation) {
    return absl::UnavailableError(absl::StrCat(head, " ran it at generation ", h.generation(),
                                               ", this site at ", call.generation));
  }
  if (h.tag() != call.tag) {
    return absl::FailedPreconditionError(
        absl::StrCat(head, " passed tag '", h.tag(), "', this site '", call.tag, "'"));
  }
  if (call.kind == Msg::BCAST_DATA && (h.root() != call.root || from != call.root)) {
    return absl::FailedPreconditionError(absl::StrCat(head, " broadcasts from root '", h.root(),
                                                      "', this site from '", call.root, "'"));
  }
  if (h.count() != call.bytes) {
    return absl::FailedPreconditionError(
        call.kind == Msg::GATHER_DATA
            ? absl::StrCat(head, " contributes ", h.count(), " bytes, this site ", call.bytes,
                           " (every member must pass the same size)")
            : absl::StrCat(head, " broadcasts ", h.count(), " bytes into a buffer of ", call.bytes,
                           " here (every member must pass the same size)"));
  }
  if (payload_bytes != h.count()) {
    return absl::InvalidArgumentError(
        absl::StrCat(head, " sent ", payload_bytes, " bytes of payload for a part of ", h.count()));
  }
  return absl::OkStatus();
}

}  // namespace longhaul::exchange
