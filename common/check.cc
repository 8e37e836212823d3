#include "common/check.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace longhaul::check_internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition)
    : file_(file), line_(line), condition_(condition) {}

CheckFailure::~CheckFailure() {
  const std::string message = message_.str();
  std::fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file_, line_, condition_,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace longhaul::check_internal
