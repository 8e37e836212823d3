// Naming rules for checkpoint directories, shared by the CLI (which picks
// the checkpoints to send) and the destination (which prunes old ones).
#ifndef LONGHAUL_COMMON_CHECKPOINTS_H_
#define LONGHAUL_COMMON_CHECKPOINTS_H_

#include <string_view>

#include "absl/status/status.h"

namespace longhaul {

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
