// Public libibverbs entry points (IBVERBS_1.x) that softverbs does not
// implement yet.
//
// Every symbol the real Debian libibverbs.so.1 exports must exist in ours, or
// programs linked against it fail to load.  The verbs below are exported with
// their exact rdma-core 44 prototypes and fail the way rdma-core reports
// "not supported by this device":
//   - pointer results: NULL with errno = EOPNOTSUPP;
//   - int results: EOPNOTSUPP where the verb returns an errno value, or -1
//     with errno = EOPNOTSUPP where its man page documents -1/errno;
//   - void results: nothing.
// When one of these gets a real implementation, delete its stub here.

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

// Kernel-ABI and SA types named by the historical marshalling helpers; only
// pointers to them appear, so no definition is needed.
struct ib_uverbs_ah_attr;
struct ib_uverbs_qp_attr;
struct ib_user_path_rec;
struct ibv_sa_path_rec;

// Exported through libibverbs.map even if the build uses -fvisibility=hidden.
#pragma GCC visibility push(default)
extern "C" {

// --- Memory ------------------------------------------------------------------

// ibv_reg_dmabuf_mr is in mr_ex.cc, beside ibv_reg_mr_ex's fd registration.

// Declared in rdma-core's private driver.h, exported at IBVERBS_1.1 and used
// by providers.  rdma-core itself returns 0 without doing anything unless
// ibv_fork_init() ran; a software device has no DMA to protect from
// copy-on-write, so the no-op success is the correct answer here too.
int ibv_dontfork_range(void * /*base*/, size_t /*size*/) { return 0; }
int ibv_dofork_range(void * /*base*/, size_t /*size*/) { return 0; }

// --- Address handles -----------------------------------------------------------

// Used by providers' create_ah for RoCE; rdma-core returns a negative errno
// (callers only test for non-zero).
int ibv_resolve_eth_l2_from_gid(struct ibv_context * /*context*/,
                                struct ibv_ah_attr * /*attr*/,
                                uint8_t /*eth_mac*/[ETHERNET_LL_SIZE],
                                uint16_t * /*vid*/) {
  errno = EOPNOTSUPP;
  return -EOPNOTSUPP;
}

// --- Historical helpers, private to rdma-core but exported publicly ----------
// Prototypes from rdma-core's marshall.h / driver.h (not installed).

void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr * /*dst*/,
                                struct ib_uverbs_ah_attr * /*src*/) {}
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr * /*dst*/,
                                struct ib_uverbs_qp_attr * /*src*/) {}
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec * /*dst*/,
                                 struct ib_user_path_rec * /*src*/) {}
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec * /*dst*/,
                               struct ibv_sa_path_rec * /*src*/) {}

// rdma-core returns NULL only when it has no sysfs; our devices are not in
// sysfs, so say so.  (Only Debian's librdmacm imports this.)
const char *ibv_get_sysfs_path(void) {
  errno = EOPNOTSUPP;
  return nullptr;
}

// --- Compat-only symbol ------------------------------------------------------
// The real library exports ibv_register_driver only as the non-default
// version ibv_register_driver@IBVERBS_1.1 (a no-op kept for old libfabric
// usnic providers); it has no default version, hence the .symver alias.
typedef struct ibv_device *(*softverbs_driver_init_func_1_1)(
    const char *uverbs_sys_path, int abi_version);

void softverbs_compat_ibv_register_driver_1_1(
    const char * /*name*/, softverbs_driver_init_func_1_1 /*init_func*/) {}
__asm__(".symver softverbs_compat_ibv_register_driver_1_1,"
        "ibv_register_driver@IBVERBS_1.1");

}  // extern "C"
#pragma GCC visibility pop
