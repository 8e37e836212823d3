#ifndef LONGHAUL_CLIENT_CLI_OUTPUT_H_
#define LONGHAUL_CLIENT_CLI_OUTPUT_H_

// How the CLI shows things: JSON objects for --json, a progress bar on a
// terminal, plain lines otherwise.

#include "absl/strings/string_view.h"
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "longhaul/v1/control.pb.h"

namespace longhaul::cli {

// A flat JSON object built in insertion order.
class JsonObject {
 public:
  JsonObject& Add(absl::string_view key, absl::string_view value);
  JsonObject& Add(absl::string_view key, const char* value) { return Add(key, absl::string_view(value)); }
  JsonObject& Add(absl::string_view key, double value);
  JsonObject& Add(absl::string_view key, uint64_t value);
  JsonObject& Add(absl::string_view key, int value) { return Add(key, static_cast<uint64_t>(value)); }
  JsonObject& Add(absl::string_view key, bool value);
  // `raw` is already JSON (an array or an object).
  JsonObject& AddRaw(absl::string_view key, std::string raw);
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

std::string JsonString(absl::string_view s);
std::string JsonArray(const std::vector<std::string>& raw_items);

// The JSON a transfer is shown as: id, state, bytes, files, seconds,
// goodput_mbit, resent_bytes and more.
JsonObject TransferJson(const v1::TransferStatus& status);

// "RUNNING", "COMPLETED"...
std::string StateName(v1::TransferState state);

// One line of a live progress bar (no newline), sized for `width` columns.
std::string ProgressBar(const v1::TransferStatus& status, int width);
// A plain progress line for logs.
std::string ProgressLine(const v1::TransferStatus& status);
// The progress line, then one line per destination of a fan-out and one
// per entry the transfer skipped (`longhaul status`).
std::string StatusText(const v1::TransferStatus& status);
// "\n  skipped PATH: WHY" for each entry the transfer skipped.
std::string SkippedLines(const v1::TransferStatus& status);
// "SITE:/EXPORT/PATH".
std::string DestinationText(const v1::Destination& destination);
// Fan-out: "\n  STATE PCT% SITE:/EXPORT/PATH (relayed by SITE)" for each
// destination.
std::string DestinationLines(const v1::TransferStatus& status);
// The closing summary of a transfer.
std::string Summary(const v1::TransferStatus& status);
// A --dry-run's answer: what would be sent, replaced, deleted and pruned.
std::string DryRunText(const v1::TransferStatus& status);

}  // namespace longhaul::cli

#endif  // LONGHAUL_CLIENT_CLI_OUTPUT_H_
