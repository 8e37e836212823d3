#pragma once

#include <string_view>

namespace longhaul {

// The version of this build, as `--version` prints it: the CMake project
// version, followed by `git describe` of the checkout in parentheses when the
// build had one, e.g. "0.1.0 (v0.1.0-12-g4f1d687-dirty)". Static storage.
std::string_view Version();

}  // namespace longhaul
