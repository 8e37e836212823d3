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

// The rate to show: the recent one while chunks move, "avg R" (over the
// time it ran) for an ended transfer that moved bytes, else "".
std::string RateText(const v1::TransferStatus& status);
// One line of a live progress bar (no newline) that fits in `width` columns
// (at most width - 1 used, for width >= 20): the least important fields go
// first, and an error is cut to fit, naming `longhaul status ID`.
std::string ProgressBar(const v1::TransferStatus& status, int width);
// A plain progress line for logs.
std::string ProgressLine(const v1::TransferStatus& status);
// The progress line, then where the bytes come from and go to, the last
// error, one line per destination of a fan-out and one per entry the
// transfer skipped (`longhaul status`).
std::string StatusText(const v1::TransferStatus& status);
// "SRC... -> SITE:/EXPORT/PATH (+ --also ...)": what a spec copies where.
std::string SpecText(const v1::TransferSpec& spec);
// "\n  skipped PATH: WHY" for each entry the transfer skipped.
std::string SkippedLines(const v1::TransferStatus& status);
// "SITE:/EXPORT/PATH".
std::string DestinationText(const v1::Destination& destination);
// Fan-out: "\n  STATE PCT% SITE:/EXPORT/PATH (relayed by SITE)" for each
// destination.
std::string DestinationLines(const v1::TransferStatus& status);
// The closing summary of a transfer.
std::string Summary(const v1::TransferStatus& status);
// `text` with each line wider than `width` - 1 columns broken between words
// (continuations indented), and a word wider than a line cut, so that a
// terminal never wraps it (width >= 20).
std::string Fold(absl::string_view text, int width);
// The summary with the source and destination lines (-v).
std::string DetailText(const v1::TransferStatus& status);
// A --dry-run's answer: what would be sent, replaced, deleted and pruned.
std::string DryRunText(const v1::TransferStatus& status);

}  // namespace longhaul::cli

#endif  // LONGHAUL_CLIENT_CLI_OUTPUT_H_
