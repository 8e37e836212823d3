#ifndef LONGHAUL_COMMON_CHECK_H_
#define LONGHAUL_COMMON_CHECK_H_

// LONGHAUL_CHECK(condition) << message: a broken internal invariant, which
// means a bug, is fatal (STYLE.md, Errors). When `condition` is false it
// writes "<file>:<line>: check failed: <condition>: <message>" to stderr and
// aborts; the message operands are evaluated only then. Not for errors a
// peer, a caller or the system can cause: those are a Status. Debian's
// abseil has no absl/log, hence this one.

#include <sstream>

namespace longhaul::check_internal {

// Collects the message of a failed check; its destructor aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure();

  std::ostream& stream() { return message_; }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream message_;
};

}  // namespace longhaul::check_internal

#define LONGHAUL_CHECK(condition) \
  while (!(condition))            \
  ::longhaul::check_internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#endif  // LONGHAUL_COMMON_CHECK_H_
