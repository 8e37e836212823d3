// Pull and third-party copy: a site asks another site to push one of its
// exports' paths to a destination (`longhaul cp SITE:/EXPORT/PATH
// SITE:/EXPORT/PATH`). The protocol is a REMOTE channel carrying
// RemoteSubmitRequest, RemoteGetRequest and RemoteCancelRequest
// (proto/longhaul/v1/peer.proto); the requester is the site the channel's TLS
// certificate names, never a name inside a message.
#ifndef LONGHAUL_DAEMON_TRANSFER_REMOTE_COPY_H_
#define LONGHAUL_DAEMON_TRANSFER_REMOTE_COPY_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/config.h"
#include "daemon/transport/transport.h"
#include "longhaul/v1/control.pb.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::daemon {

// The source side's decision on a RemoteSubmitRequest's spec from
// `requester`, before any file is looked at:
//  - the spec names its source by source_export and source_path only (no
//    `sources`), and no requester other than `requester` (requested_by);
//  - the export exists here and lists `requester` in `readers`;
//  - source_path is relative and clean (no "", "." or ".." components) and
//    does not start with this site's own `.longhaul` (staging, trash);
//  - the destination is another site than this one.
// Returns the export. The caller then resolves the path strictly inside that
// export with SourceAccess (symlinks judged by their targets, the daemon's
// secrets and the export's .longhaul refused) and submits an ordinary push.
// Refusals are PermissionDenied or InvalidArgument, worded for the
// requester's operator: what to change and at which site.
absl::StatusOr<const ExportConfig*> CheckRemoteSubmit(const DaemonConfig& config,
                                                      const std::string& requester,
                                                      const v1::TransferSpec& spec);

// The absolute path below `e` that a checked spec names.
std::string RemoteSourcePath(const ExportConfig& e, const v1::TransferSpec& spec);

// The largest REMOTE message a daemon reads, either way (proto/FRAMES.md):
// a request is a spec and an id, an answer one transfer's status, fitted to
// it by the source (FitRemoteStatus). A message declaring more is refused
// before it is read.
inline constexpr uint32_t kMaxRemoteMessage = 64u << 10;

// The longest error text of a remote transfer that a status carries, and so
// that the requester keeps and journals; a longer one is cut.
inline constexpr size_t kMaxRemoteError = 4u << 10;

// The requester's side of one REMOTE request: dials `site` over `transport`,
// sends `request` and returns the source's answer, its errors prefixed with
// the site's name (Call). An answer over kMaxRemoteMessage is refused unread
// (InvalidArgument naming the site and the limit). A source that has not
// answered within `timeout` has its channel aborted: DeadlineExceeded, so a
// stalled peer cannot hold the caller (a control call, a status) for longer.
// The status returned is fitted to kMaxRemoteMessage (FitRemoteStatus).
absl::StatusOr<v1::TransferStatus> CallRemote(transport::Transport& transport,
                                              const PeerConfig& site, v1::PeerMessage request,
                                              absl::Duration timeout = absl::Seconds(30));

// Makes `status` serialize to at most `max_bytes`: cuts its error texts at
// kMaxRemoteError, then, while it is still longer, drops the spec (a
// requester keeps its own), lists fewer skipped entries (the last one then
// says how many more there are) and fewer destinations. A source fits each
// answer before sending it; a requester keeps only fitted statuses, so what
// it holds and journals per remote transfer stays bounded whatever a source
// sends.
void FitRemoteStatus(v1::TransferStatus& status, size_t max_bytes);

// Cuts `text` to at most `max_bytes` (>= 16) on a UTF-8 character boundary,
// ending it with " [cut]" when anything was cut.
void CutText(std::string& text, size_t max_bytes);

}  // namespace longhaul::daemon

#endif  // LONGHAUL_DAEMON_TRANSFER_REMOTE_COPY_H_
