// Uses the installed longhaul client API and checks what it returns: parses
// destinations, builds a transfer request, finds no daemon at an address
// where none listens and, given a running daemon's address, lists its (no)
// transfers. Exits 0 only if every check holds.
//   consumer NO_DAEMON_ADDRESS [DAEMON_ADDRESS]
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "longhaul/client.h"
#include "longhaul/exchange.h"
#include "longhaul/v1/control.pb.h"

namespace {

int failures = 0;

void Expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: consumer NO_DAEMON_ADDRESS [DAEMON_ADDRESS]\n");
    return 2;
  }

  absl::StatusOr<longhaul::Destination> dest =
      longhaul::ParseDestination("site-b:/ckpt/run1/step100");
  Expect(dest.ok(), "ParseDestination accepts site:/export/path");
  if (dest.ok()) {
    Expect(dest->site == "site-b", "destination site is site-b");
    Expect(dest->export_name == "ckpt", "destination export is ckpt");
    Expect(dest->path == "run1/step100", "destination path is run1/step100");
  }
  Expect(!longhaul::ParseDestination("no-colon").ok(), "ParseDestination refuses text without ':'");

  Expect(longhaul::IsEndState(longhaul::v1::COMPLETED), "COMPLETED is an end state");
  Expect(!longhaul::IsEndState(longhaul::v1::RUNNING), "RUNNING is not an end state");
  Expect(longhaul::ElementSize(longhaul::DType::kFloat32) == 4, "a float32 is 4 bytes");

  longhaul::v1::TransferSpec spec;
  spec.add_sources("/data/ckpt/step100");
  spec.set_dest_site(dest.ok() ? dest->site : "");
  spec.set_dest_path(dest.ok() ? dest->path : "");
  longhaul::v1::TransferSpec parsed;
  Expect(parsed.ParseFromString(spec.SerializeAsString()) && parsed.sources_size() == 1 &&
             parsed.dest_site() == "site-b" && parsed.dest_path() == "run1/step100",
         "a TransferSpec survives the wire format");

  absl::StatusOr<std::unique_ptr<longhaul::Client>> client =
      longhaul::Client::Connect(argv[1], absl::Milliseconds(200));
  Expect(absl::IsUnavailable(client.status()), "Connect with no daemon is UnavailableError");

  if (argc == 3) {
    client = longhaul::Client::Connect(argv[2]);
    Expect(client.ok(), "Connect reaches the running daemon");
    if (client.ok()) {
      absl::StatusOr<std::vector<longhaul::v1::TransferStatus>> list = (*client)->List(true);
      Expect(list.ok() && list->empty(), "a fresh daemon lists no transfers");
      Expect(absl::IsNotFound((*client)->Get("no-such-transfer").status()),
             "Get of an unknown transfer is NotFound");
    }
  }

  if (failures == 0) std::printf("consumer: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
