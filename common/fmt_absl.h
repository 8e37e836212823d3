#ifndef LONGHAUL_COMMON_FMT_ABSL_H_
#define LONGHAUL_COMMON_FMT_ABSL_H_

// Debian's abseil is built with its own absl::string_view (not an alias of
// std::string_view), which {fmt} cannot print by itself. Status messages are
// absl::string_view, so every file that logs one includes this.

#include <string_view>

#include "absl/strings/string_view.h"
#include "spdlog/fmt/fmt.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.data(), s.size()), ctx);
  }
};

#endif  // LONGHAUL_COMMON_FMT_ABSL_H_
