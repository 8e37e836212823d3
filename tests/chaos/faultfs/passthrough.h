// The FUSE operations of longhaul-faultfs: a passthrough of a backing
// directory whose data mutations go through FaultState's undo log and whose
// operations may fail with injected EIO.

#ifndef LONGHAUL_TESTS_CHAOS_FAULTFS_PASSTHROUGH_H_
#define LONGHAUL_TESTS_CHAOS_FAULTFS_PASSTHROUGH_H_

#define FUSE_USE_VERSION 35
#include <fuse.h>

#include "tests/chaos/faultfs/fault_state.h"

namespace longhaul::faultfs {

struct PassthroughContext {
  int backing_fd = -1;  // O_PATH|O_DIRECTORY on the backing directory
  FaultState* state = nullptr;
};

// The operations; fuse_new's private data must be a PassthroughContext*.
const fuse_operations& PassthroughOperations();

}  // namespace longhaul::faultfs

#endif  // LONGHAUL_TESTS_CHAOS_FAULTFS_PASSTHROUGH_H_
