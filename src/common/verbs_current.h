// verbs_current.h: the parts of today's libibverbs ABI (rdma-core up to
// v64) that the verbs.h softverbs builds against (Debian 12: rdma-core 44)
// does not declare. Programs built against a newer verbs.h pass these
// values and structures to our libibverbs.so.1, so their layout is ABI: each
// is declared here under our own name, with a static_assert where it extends
// a v44 structure. Values: rdma-core v64 libibverbs/verbs.h and the kernel's
// include/uapi/rdma/ib_user_verbs.h (IB_UVERBS_DEVICE_*).
//
// Own names (sv::abi::...), never the C names: a build against a newer
// verbs.h would otherwise see two definitions.
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sv::abi {

// --- Work requests and completions (IBTA 9.4.7 FLUSH, 9.4.8 ATOMIC WRITE) ---
inline constexpr int kWrFlush = 14;         // IBV_WR_FLUSH (IBV_WR_ATOMIC_WRITE is 15, in v44)
inline constexpr int kWcFlush = 8;          // IBV_WC_FLUSH (IBV_WC_ATOMIC_WRITE is 9, in v44)
inline constexpr uint64_t kQpExWithFlush = 1u << 11;  // IBV_QP_EX_WITH_FLUSH

// ibv_wr_flush's placement type (a bit mask) and selectivity level.
inline constexpr uint8_t kFlushGlobal = 1u << 0;      // IBV_FLUSH_GLOBAL
inline constexpr uint8_t kFlushPersistent = 1u << 1;  // IBV_FLUSH_PERSISTENT
inline constexpr uint8_t kFlushRange = 0;             // IBV_FLUSH_RANGE
inline constexpr uint8_t kFlushMr = 1;                // IBV_FLUSH_MR

// --- Access flags (ibv_reg_mr, ibv_modify_qp's qp_access_flags) ---
inline constexpr unsigned kAccessFlushGlobal = 1u << 8;      // IBV_ACCESS_FLUSH_GLOBAL
inline constexpr unsigned kAccessFlushPersistent = 1u << 9;  // IBV_ACCESS_FLUSH_PERSISTENT

// --- Device capabilities (ibv_device_attr_ex::device_cap_flags_ex) ---
inline constexpr uint64_t kDeviceFlushGlobal = 1ull << 38;      // IB_UVERBS_DEVICE_FLUSH_GLOBAL
inline constexpr uint64_t kDeviceFlushPersistent = 1ull << 39;  // IB_UVERBS_DEVICE_FLUSH_PERSISTENT
inline constexpr uint64_t kDeviceAtomicWrite = 1ull << 40;      // IB_UVERBS_DEVICE_ATOMIC_WRITE
inline constexpr uint32_t kOdpSupportFlush = 1u << 6;           // IBV_ODP_SUPPORT_FLUSH
inline constexpr uint32_t kOdpSupportAtomicWrite = 1u << 7;     // IBV_ODP_SUPPORT_ATOMIC_WRITE

// --- ibv_query_qp_data_in_order (v44 declares the call, not its flags) ---
inline constexpr int kInOrderReturnCaps = 1 << 0;    // IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS
inline constexpr int kInOrderDeviceOnly = 1 << 1;    // IBV_QUERY_QP_DATA_IN_ORDER_DEVICE_ONLY
inline constexpr int kInOrderWholeMsg = 1 << 0;      // IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG
inline constexpr int kInOrderAligned128 = 1 << 1;    // IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES

// --- ibv_qp_ex: v64 appends wr_flush after v44's last member ---
using WrFlushFn = void (*)(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type,
                           uint8_t level);
struct QpExCurrent {
  ibv_qp_ex v44;  // up to and including wr_atomic_write
  WrFlushFn wr_flush;
};
static_assert(offsetof(QpExCurrent, wr_flush) == sizeof(ibv_qp_ex), "wr_flush follows v44's ibv_qp_ex");
static_assert(offsetof(ibv_qp_ex, wr_atomic_write) + sizeof(void*) == sizeof(ibv_qp_ex),
              "v44's ibv_qp_ex ends with wr_atomic_write");

// --- ibv_port_attr: v64 appends active_speed_ex (ibv_query_port passes
// the caller's size, so a v44 caller's shorter struct is never overrun) ---
struct PortAttrCurrent {
  ibv_port_attr v44;
  uint32_t active_speed_ex;
};
static_assert(offsetof(PortAttrCurrent, active_speed_ex) == sizeof(ibv_port_attr));

// --- Memory registration (IBVERBS_1.15, 1.17) ---
struct Dmah {  // struct ibv_dmah: the application sees only this
  ibv_context* context;
};
struct Buf;  // struct ibv_buf: opaque

enum : uint64_t {  // enum ibv_mr_init_attr_mask
  kRegMrMaskIova = 1u << 0,
  kRegMrMaskAddr = 1u << 1,
  kRegMrMaskFd = 1u << 2,
  kRegMrMaskFdOffset = 1u << 3,
  kRegMrMaskDmah = 1u << 4,
  kRegMrMaskBuf = 1u << 5,
};
struct MrInitAttr {  // struct ibv_mr_init_attr
  size_t length;
  int access;
  uint64_t comp_mask;
  uint64_t iova;
  void* addr;
  int fd;
  uint64_t fd_offset;
  Dmah* dmah;
  Buf* buf;
};
static_assert(sizeof(MrInitAttr) == 72 && offsetof(MrInitAttr, buf) == 64);

enum : uint32_t {  // enum ibv_dmah_init_attr_mask
  kDmahMaskCpuId = 1u << 0,
  kDmahMaskPh = 1u << 1,
  kDmahMaskTphMemType = 1u << 2,
};
inline constexpr uint8_t kTphMemVolatile = 0;    // IBV_TPH_MEM_TYPE_VM
inline constexpr uint8_t kTphMemPersistent = 1;  // IBV_TPH_MEM_TYPE_PM
struct DmahInitAttr {  // struct ibv_dmah_init_attr
  uint32_t comp_mask;
  uint32_t cpu_id;
  uint8_t ph;
  uint8_t tph_mem_type;
};
static_assert(sizeof(DmahInitAttr) == 12);

// --- verbs_context: it "grows up", so v64's new ops come before v44's first
// member (query_port). verbs_get_ctx_op() in a v64 verbs.h finds an op
// present only when verbs_context::sz reaches back to it. ---
struct VerbsContextV64Ops {  // in memory order, lowest address first
  void (*free_buf)(Buf* buf);
  void* (*alloc_buf)(ibv_pd* pd, size_t size, Buf** buf);
  int (*dm_export_dmabuf_fd)(ibv_dm* dm);
  ibv_mr* (*reg_mr_ex)(ibv_pd* pd, MrInitAttr* attr);
  int (*dealloc_dmah)(Dmah* dmah);
  Dmah* (*alloc_dmah)(ibv_context* context, DmahInitAttr* attr);
};
struct VerbsContextCurrent {
  VerbsContextV64Ops v64;
  verbs_context v44;  // from query_port on; v44.context is what clients hold
};
static_assert(offsetof(VerbsContextCurrent, v44) == 6 * sizeof(void*));
static_assert(offsetof(verbs_context, query_port) == 0, "v44's verbs_context starts with query_port");

// --- librdmacm (RDMACM_1.4): rdma_cm_event_type after TIMEWAIT_EXIT (15),
// and rdma_cm_event's param union, which gained `uint64_t arg` (the value
// of rdma_write_cm_event) at its start. ---
inline constexpr int kCmEventAddrinfoResolved = 16;  // RDMA_CM_EVENT_ADDRINFO_RESOLVED
inline constexpr int kCmEventAddrinfoError = 17;     // RDMA_CM_EVENT_ADDRINFO_ERROR
inline constexpr int kCmEventUser = 18;              // RDMA_CM_EVENT_USER
inline constexpr int kCmEventInternal = 19;          // RDMA_CM_EVENT_INTERNAL (librdmacm's own)
// An event's type as an int: v44's enum rdma_cm_event_type stops at 15, so
// reading 16 and above through the enum is undefined (UBSan's -fsanitize=enum
// says so); every read of a type that may be a v64 one goes through here.
template <class CmEvent>
int cm_event_type(const CmEvent& e) {
  static_assert(sizeof(e.event) == sizeof(int));
  int t;
  std::memcpy(&t, &e.event, sizeof t);
  return t;
}
inline constexpr int kRaiSa = 0x10;                  // RAI_SA: resolve through the IB SA
inline constexpr int kRaiDns = 0x20;                 // RAI_DNS (the default; excludes RAI_SA)

}  // namespace sv::abi
