#include "common/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace longhaul {
namespace {

TEST(ErrnoStatusTest, MessageCarriesContextAndStrerror) {
  absl::Status s = ErrnoError(ENOENT, "cannot open the state");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), std::string("cannot open the state: ") + std::strerror(ENOENT));
}

TEST(ErrnoStatusTest, PathOverloadNamesWhatAndPath) {
  absl::Status s = ErrnoError(ENOSPC, "cannot write", "/data/x");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), std::string("cannot write /data/x: ") + std::strerror(ENOSPC));
}

TEST(ErrnoStatusTest, ContextOnlyOverloadReadsErrno) {
  errno = ECONNREFUSED;
  absl::Status s = ErrnoError("cannot connect");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), std::string("cannot connect: ") + std::strerror(ECONNREFUSED));
}

TEST(ErrnoStatusTest, CodesCallersBranchOn) {
  EXPECT_EQ(ErrnoCode(EEXIST), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ErrnoCode(EACCES), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoCode(ELOOP), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoCode(EDQUOT), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoCode(EMFILE), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoCode(EAGAIN), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoCode(EADDRINUSE), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoCode(ENAMETOOLONG), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoCode(ENOTDIR), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrnoCode(EROFS), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrnoCode(EIO), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace longhaul
