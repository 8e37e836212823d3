// Naming rules for checkpoint directories and their commit markers, shared
// by the CLI (which picks the checkpoints to send) and the daemons (which
// publish markers last and prune old checkpoints).
#ifndef LONGHAUL_COMMON_CHECKPOINTS_H_
#define LONGHAUL_COMMON_CHECKPOINTS_H_

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace longhaul {

// The commit-marker globs a daemon publishes last unless its configuration
// names others (transfer.commit_last): PyTorch DCP's `.metadata`, the index
// of sharded safetensors/Hugging Face checkpoints, and a plain `COMPLETE`.
// `longhaul sync --keep` also uses them to tell a finished checkpoint.
inline constexpr std::array<std::string_view, 3> kDefaultCommitMarkers = {
    ".metadata", "*.index.json", "COMPLETE"};

// True when `path` (a '/'-separated file path inside a checkpoint or a
// transfer) is a commit marker by one of the fnmatch(3) `globs`: a glob
// matches its base name, or its whole path with '/' matched only by '/'.
bool IsCommitMarker(const std::vector<std::string>& globs, std::string_view path);

// A glob that matches `path` and nothing else: fnmatch's special characters
// (`*`, `?`, `[`, `\`) are escaped with a backslash.
std::string GlobMatchingOnly(std::string_view path);

// Natural order of checkpoint names: runs of digits compare as numbers, so
// "step-9" < "step-10" < "step-100". A strict weak order. Digit runs compare by value (leading zeros ignored,
// then by length of the run so "01" < "1" stays a strict order); everything
// else compares bytewise.
bool NaturalLess(std::string_view a, std::string_view b);

// A commit marker names a file inside a checkpoint ("model.index.json",
// "meta/.done"): empty, or relative with no leading or trailing '/', no "."
// or ".." component and no NUL. InvalidArgument, saying so, otherwise.
absl::Status ValidateCheckpointMarker(std::string_view marker);

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_CHECKPOINTS_H_
