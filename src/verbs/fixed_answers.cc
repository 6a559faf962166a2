// Verbs whose answer does not depend on the device's state: fork support,
// sysfs, enhanced connection establishment (ECE) and data ordering.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>

#include "common/verbs_current.h"

extern "C" {

// Registered pages are shared-file pages whose fork behaviour softverbs
// controls itself (docs/MEMORY.md): a child gets a private copy of them, as
// with ordinary memory. So fork needs no preparation, and softverbs answers
// as rdma-core does on kernels with fork-safe pinning: ibv_fork_init() is a
// successful no-op and ibv_is_fork_initialized() says IBV_FORK_UNNEEDED.
int ibv_fork_init(void) { return 0; }

ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

// softverbs' device has no sysfs directory.
int ibv_read_sysfs_file(const char*, const char*, char*, size_t) {
  errno = ENOENT;
  return -1;
}

int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }

// Data of one QP lands in order: the requester copies each message front to
// back, last byte last. ibv_query_qp_data_in_order(3) of rdma-core v64:
// unknown flags answer 0; IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS asks for
// the capability bits: a whole message in order, and so (rdma-core adds it
// whenever WHOLE_MSG holds) every aligned 128 bytes; without it, 1.
int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t flags) {
  namespace abi = sv::abi;
  if (flags & ~uint32_t(abi::kInOrderReturnCaps | abi::kInOrderDeviceOnly)) return 0;
  if (flags & abi::kInOrderReturnCaps) return abi::kInOrderWholeMsg | abi::kInOrderAligned128;
  return 1;
}

}  // extern "C"
