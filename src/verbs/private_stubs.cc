// IBVERBS_PRIVATE_64 (and, through private_compat.cc, _33, _34, _57,
// _59): libibverbs' private provider ABI (rdma-core v33 to v64).
//
// Debian's real provider libraries (libmlx5.so.1, libefa.so.1, libmana.so.1,
// libmlx4.so.1 and the plug-ins in libibverbs/) import these, and clients
// such as perftest, UCX's libuct_ib and libfabric link libmlx5/libefa
// directly.  Their symbols must therefore resolve when those libraries load.
// Our devices are never mlx5/efa/... devices, so none of these is reached in
// practice; each fails cleanly if it is:
//   - ibv_cmd_* and execute_ioctl return EOPNOTSUPP (they return errno
//     values in rdma-core) and set errno; ibv_cmd_poll_cq, which returns a
//     completion count, returns -1;
//   - pointer results are NULL with errno = EOPNOTSUPP;
//   - void functions do nothing.
// ibv_query_gid_type, ibv_wr_opcode_str and verbs_register_driver_NN are
// real and live elsewhere.
//
// Prototypes follow rdma-core v64's libibverbs/driver.h, cmd_ioctl.h and
// dmabuf_heap.h, which are not installed; the types they use beyond
// verbs.h are declared here as incomplete structs, since only pointers to
// them are passed. Where a prototype changed between releases (a trailing
// argument added), every caller's arguments are ignored alike.

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>

// rdma-core driver.h types.
struct verbs_sysfs_dev;
struct verbs_context_ops;
struct verbs_xrcd;
struct verbs_mr;
struct verbs_cq;
struct verbs_srq;
struct verbs_qp;
struct verbs_flow_action;
struct verbs_dm;
struct verbs_counters;
struct ibv_command_buffer;
struct verbs_create_cq_prov_attr;
struct verbs_dmah;
struct ibv_dmah_init_attr;
struct ibv_mr_init_attr;
struct ibv_dmabuf_heap;

// Kernel uverbs command/response structs (rdma-core kern-abi.h and
// <rdma/ib_user_verbs.h>).  Several share a name with a verb; as struct tags
// they do not clash with the functions.
struct ibv_get_context;
struct ibv_query_port;
struct ibv_alloc_pd;
struct ibv_open_xrcd;
struct ibv_reg_mr;
struct ibv_rereg_mr;
struct ibv_alloc_mw;
struct ibv_create_cq;
struct ibv_create_cq_ex;
struct ibv_resize_cq;
struct ibv_modify_cq;
struct ibv_create_srq;
struct ibv_create_xsrq;
struct ibv_modify_srq;
struct ibv_query_srq;
struct ibv_create_qp;
struct ibv_create_qp_ex;
struct ibv_open_qp;
struct ibv_query_qp;
struct ibv_modify_qp;
struct ibv_modify_qp_ex;
struct ibv_create_wq;
struct ibv_modify_wq;
struct ib_uverbs_get_context_resp;
struct ib_uverbs_ex_query_device_resp;
struct ib_uverbs_alloc_pd_resp;
struct ib_uverbs_open_xrcd_resp;
struct ib_uverbs_reg_mr_resp;
struct ib_uverbs_rereg_mr_resp;
struct ib_uverbs_alloc_mw_resp;
struct ib_uverbs_create_cq_resp;
struct ib_uverbs_ex_create_cq_resp;
struct ib_uverbs_resize_cq_resp;
struct ib_uverbs_create_srq_resp;
struct ib_uverbs_create_qp_resp;
struct ib_uverbs_ex_create_qp_resp;
struct ib_uverbs_ex_modify_qp_resp;
struct ib_uverbs_create_ah_resp;
struct ib_uverbs_ex_create_wq_resp;
struct ib_uverbs_ex_create_rwq_ind_table_resp;

namespace {

int unsupported() {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}

}  // namespace

// Exported through libibverbs.map even if the build uses -fvisibility=hidden.
#pragma GCC visibility push(default)
extern "C" {

// --- Variables ---------------------------------------------------------------

// A bool object (1 byte, .bss) in rdma-core; libmlx5 imports it.
bool verbs_allow_disassociate_destroy = false;

// --- Provider framework ------------------------------------------------------

void __verbs_log(struct verbs_context * /*ctx*/, uint32_t /*level*/,
                 const char * /*fmt*/, ...) {}

void *_verbs_init_and_alloc_context(struct ibv_device * /*device*/,
                                    int /*cmd_fd*/, size_t /*alloc_size*/,
                                    struct verbs_context * /*context_offset*/,
                                    uint32_t /*driver_id*/) {
  errno = EOPNOTSUPP;
  return nullptr;
}

void verbs_uninit_context(struct verbs_context * /*context*/) {}

void verbs_set_ops(struct verbs_context * /*vctx*/,
                   const struct verbs_context_ops * /*ops*/) {}

void verbs_init_cq(struct ibv_cq * /*cq*/, struct ibv_context * /*context*/,
                   struct ibv_comp_channel * /*channel*/,
                   void * /*cq_context*/) {}

struct ibv_context *verbs_open_device(struct ibv_device * /*device*/,
                                      void * /*private_data*/) {
  errno = EOPNOTSUPP;
  return nullptr;
}

// Like ibv_read_sysfs_file: bytes read, or -1 with errno set.
int ibv_read_ibdev_sysfs_file(char * /*buf*/, size_t /*size*/,
                              struct verbs_sysfs_dev * /*sysfs_dev*/,
                              const char * /*fnfmt*/, ...) {
  errno = EOPNOTSUPP;
  return -1;
}

// --- ioctl command buffers ---------------------------------------------------

// Not a verb: sizes the caller's on-stack attribute array as its own
// attributes plus those of any linked buffers, which only execute_ioctl
// would append.  Our execute_ioctl never does, so the caller's count is
// enough (and avoids depending on ibv_command_buffer's layout).
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
                                     struct ibv_command_buffer * /*link*/) {
  return num_attrs;
}

int execute_ioctl(struct ibv_context * /*context*/,
                  struct ibv_command_buffer * /*cmd*/) {
  return unsupported();
}

// --- Context and device ------------------------------------------------------

int ibv_cmd_get_context(struct verbs_context * /*context*/,
                        struct ibv_get_context * /*cmd*/, size_t /*cmd_size*/,
                        struct ib_uverbs_get_context_resp * /*resp*/,
                        size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_query_context(struct ibv_context * /*ctx*/,
                          struct ibv_command_buffer * /*driver*/) {
  return unsupported();
}

int ibv_cmd_query_device_any(struct ibv_context * /*context*/,
                             const struct ibv_query_device_ex_input * /*input*/,
                             struct ibv_device_attr_ex * /*attr*/,
                             size_t /*attr_size*/,
                             struct ib_uverbs_ex_query_device_resp * /*resp*/,
                             size_t * /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_query_port(struct ibv_context * /*context*/, uint8_t /*port_num*/,
                       struct ibv_port_attr * /*port_attr*/,
                       struct ibv_query_port * /*cmd*/, size_t /*cmd_size*/) {
  return unsupported();
}

// --- PD, XRCD ----------------------------------------------------------------

int ibv_cmd_alloc_pd(struct ibv_context * /*context*/, struct ibv_pd * /*pd*/,
                     struct ibv_alloc_pd * /*cmd*/, size_t /*cmd_size*/,
                     struct ib_uverbs_alloc_pd_resp * /*resp*/,
                     size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_dealloc_pd(struct ibv_pd * /*pd*/) { return unsupported(); }

int ibv_cmd_open_xrcd(struct ibv_context * /*context*/,
                      struct verbs_xrcd * /*xrcd*/, int /*vxrcd_size*/,
                      struct ibv_xrcd_init_attr * /*attr*/,
                      struct ibv_open_xrcd * /*cmd*/, size_t /*cmd_size*/,
                      struct ib_uverbs_open_xrcd_resp * /*resp*/,
                      size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_close_xrcd(struct verbs_xrcd * /*xrcd*/) { return unsupported(); }

// --- MR, MW, DM --------------------------------------------------------------

int ibv_cmd_reg_mr(struct ibv_pd * /*pd*/, void * /*addr*/, size_t /*length*/,
                   uint64_t /*hca_va*/, int /*access*/,
                   struct verbs_mr * /*vmr*/, struct ibv_reg_mr * /*cmd*/,
                   size_t /*cmd_size*/,
                   struct ib_uverbs_reg_mr_resp * /*resp*/,
                   size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_rereg_mr(struct verbs_mr * /*vmr*/, uint32_t /*flags*/,
                     void * /*addr*/, size_t /*length*/, uint64_t /*hca_va*/,
                     int /*access*/, struct ibv_pd * /*pd*/,
                     struct ibv_rereg_mr * /*cmd*/, size_t /*cmd_sz*/,
                     struct ib_uverbs_rereg_mr_resp * /*resp*/,
                     size_t /*resp_sz*/) {
  return unsupported();
}

int ibv_cmd_dereg_mr(struct verbs_mr * /*vmr*/) { return unsupported(); }

int ibv_cmd_query_mr(struct ibv_pd * /*pd*/, struct verbs_mr * /*vmr*/,
                     uint32_t /*mr_handle*/) {
  return unsupported();
}

int ibv_cmd_advise_mr(struct ibv_pd * /*pd*/,
                      enum ibv_advise_mr_advice /*advice*/,
                      uint32_t /*flags*/, struct ibv_sge * /*sg_list*/,
                      uint32_t /*num_sge*/) {
  return unsupported();
}

int ibv_cmd_reg_dmabuf_mr(struct ibv_pd * /*pd*/, uint64_t /*offset*/,
                          size_t /*length*/, uint64_t /*iova*/, int /*fd*/,
                          int /*access*/, struct verbs_mr * /*vmr*/) {
  return unsupported();
}

int ibv_cmd_alloc_mw(struct ibv_pd * /*pd*/, enum ibv_mw_type /*type*/,
                     struct ibv_mw * /*mw*/, struct ibv_alloc_mw * /*cmd*/,
                     size_t /*cmd_size*/,
                     struct ib_uverbs_alloc_mw_resp * /*resp*/,
                     size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_dealloc_mw(struct ibv_mw * /*mw*/) { return unsupported(); }

int ibv_cmd_alloc_dm(struct ibv_context * /*ctx*/,
                     const struct ibv_alloc_dm_attr * /*dm_attr*/,
                     struct verbs_dm * /*dm*/,
                     struct ibv_command_buffer * /*link*/) {
  return unsupported();
}

int ibv_cmd_free_dm(struct verbs_dm * /*dm*/) { return unsupported(); }

int ibv_cmd_reg_dm_mr(struct ibv_pd * /*pd*/, struct verbs_dm * /*dm*/,
                      uint64_t /*offset*/, size_t /*length*/,
                      unsigned int /*access*/, struct verbs_mr * /*vmr*/,
                      struct ibv_command_buffer * /*link*/) {
  return unsupported();
}

int ibv_cmd_reg_mr_ex(struct ibv_pd * /*pd*/, struct verbs_mr * /*vmr*/,
                      struct ibv_mr_init_attr * /*mr_init_attr*/) {
  return unsupported();
}

int ibv_cmd_export_dmabuf_fd(struct ibv_context * /*ctx*/, off_t /*pg_off*/) {
  errno = EOPNOTSUPP;
  return -1;  // an fd or -1 in rdma-core
}

int ibv_cmd_alloc_dmah(struct ibv_context * /*ctx*/, struct verbs_dmah * /*st*/,
                       struct ibv_dmah_init_attr * /*attr*/) {
  return unsupported();
}

int ibv_cmd_free_dmah(struct verbs_dmah * /*dmah*/) { return unsupported(); }

int ibv_cmd_query_port_speed(struct ibv_context * /*context*/,
                             uint32_t /*port_num*/, uint64_t * /*speed*/) {
  return unsupported();
}

// --- dma-buf heaps (confidential-computing shared buffers) ---------------------

struct ibv_dmabuf_heap *ibv_dmabuf_heap_cc_shared_init(void) {
  errno = EOPNOTSUPP;
  return nullptr;
}

void ibv_dmabuf_heap_destroy(struct ibv_dmabuf_heap * /*heap*/) {}

void *ibv_dmabuf_heap_alloc(struct ibv_dmabuf_heap * /*heap*/, size_t /*size*/,
                            int *dmabuf_fd) {
  if (dmabuf_fd) *dmabuf_fd = -1;
  errno = EOPNOTSUPP;
  return nullptr;
}

void ibv_dmabuf_heap_free(void * /*buf*/, size_t /*size*/, int /*dmabuf_fd*/) {}

// --- CQ ----------------------------------------------------------------------

int ibv_cmd_create_cq(struct ibv_context * /*context*/, int /*cqe*/,
                      struct ibv_comp_channel * /*channel*/,
                      int /*comp_vector*/, struct ibv_cq * /*cq*/,
                      struct ibv_create_cq * /*cmd*/, size_t /*cmd_size*/,
                      struct ib_uverbs_create_cq_resp * /*resp*/,
                      size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_create_cq_ex(struct ibv_context * /*context*/,
                         const struct ibv_cq_init_attr_ex * /*cq_attr*/,
                         struct verbs_cq * /*cq*/,
                         struct ibv_create_cq_ex * /*cmd*/,
                         size_t /*cmd_size*/,
                         struct ib_uverbs_ex_create_cq_resp * /*resp*/,
                         size_t /*resp_size*/, uint32_t /*cmd_flags*/) {
  return unsupported();
}

int ibv_cmd_create_cq_ex2(struct ibv_context * /*context*/,
                          const struct ibv_cq_init_attr_ex * /*cq_attr*/,
                          struct verbs_create_cq_prov_attr * /*prov_attr*/,
                          struct verbs_cq * /*cq*/,
                          struct ibv_create_cq_ex * /*cmd*/,
                          size_t /*cmd_size*/,
                          struct ib_uverbs_ex_create_cq_resp * /*resp*/,
                          size_t /*resp_size*/, uint32_t /*cmd_flags*/,
                          struct ibv_command_buffer * /*driver*/) {
  return unsupported();
}

// Returns a completion count, so failure is -1 (as in rdma-core).
int ibv_cmd_poll_cq(struct ibv_cq * /*cq*/, int /*ne*/,
                    struct ibv_wc * /*wc*/) {
  errno = EOPNOTSUPP;
  return -1;
}

int ibv_cmd_req_notify_cq(struct ibv_cq * /*cq*/, int /*solicited_only*/) {
  return unsupported();
}

int ibv_cmd_resize_cq(struct ibv_cq * /*cq*/, int /*cqe*/,
                      struct ibv_resize_cq * /*cmd*/, size_t /*cmd_size*/,
                      struct ib_uverbs_resize_cq_resp * /*resp*/,
                      size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_destroy_cq(struct ibv_cq * /*cq*/) { return unsupported(); }

int ibv_cmd_modify_cq(struct ibv_cq * /*cq*/,
                      struct ibv_modify_cq_attr * /*attr*/,
                      struct ibv_modify_cq * /*cmd*/, size_t /*cmd_size*/) {
  return unsupported();
}

// --- SRQ ---------------------------------------------------------------------

int ibv_cmd_create_srq(struct ibv_pd * /*pd*/, struct ibv_srq * /*srq*/,
                       struct ibv_srq_init_attr * /*attr*/,
                       struct ibv_create_srq * /*cmd*/, size_t /*cmd_size*/,
                       struct ib_uverbs_create_srq_resp * /*resp*/,
                       size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_create_srq_ex(struct ibv_context * /*context*/,
                          struct verbs_srq * /*srq*/,
                          struct ibv_srq_init_attr_ex * /*attr_ex*/,
                          struct ibv_create_xsrq * /*cmd*/,
                          size_t /*cmd_size*/,
                          struct ib_uverbs_create_srq_resp * /*resp*/,
                          size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_modify_srq(struct ibv_srq * /*srq*/,
                       struct ibv_srq_attr * /*srq_attr*/,
                       int /*srq_attr_mask*/, struct ibv_modify_srq * /*cmd*/,
                       size_t /*cmd_size*/) {
  return unsupported();
}

int ibv_cmd_query_srq(struct ibv_srq * /*srq*/,
                      struct ibv_srq_attr * /*srq_attr*/,
                      struct ibv_query_srq * /*cmd*/, size_t /*cmd_size*/) {
  return unsupported();
}

int ibv_cmd_destroy_srq(struct ibv_srq * /*srq*/) { return unsupported(); }

int ibv_cmd_post_srq_recv(struct ibv_srq * /*srq*/,
                          struct ibv_recv_wr * /*wr*/,
                          struct ibv_recv_wr ** /*bad_wr*/) {
  return unsupported();
}

// --- QP ----------------------------------------------------------------------

int ibv_cmd_create_qp(struct ibv_pd * /*pd*/, struct ibv_qp * /*qp*/,
                      struct ibv_qp_init_attr * /*attr*/,
                      struct ibv_create_qp * /*cmd*/, size_t /*cmd_size*/,
                      struct ib_uverbs_create_qp_resp * /*resp*/,
                      size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_create_qp_ex(struct ibv_context * /*context*/,
                         struct verbs_qp * /*qp*/,
                         struct ibv_qp_init_attr_ex * /*attr_ex*/,
                         struct ibv_create_qp * /*cmd*/, size_t /*cmd_size*/,
                         struct ib_uverbs_create_qp_resp * /*resp*/,
                         size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_create_qp_ex2(struct ibv_context * /*context*/,
                          struct verbs_qp * /*qp*/,
                          struct ibv_qp_init_attr_ex * /*qp_attr*/,
                          struct ibv_create_qp_ex * /*cmd*/,
                          size_t /*cmd_size*/,
                          struct ib_uverbs_ex_create_qp_resp * /*resp*/,
                          size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_open_qp(struct ibv_context * /*context*/, struct verbs_qp * /*qp*/,
                    int /*vqp_sz*/, struct ibv_qp_open_attr * /*attr*/,
                    struct ibv_open_qp * /*cmd*/, size_t /*cmd_size*/,
                    struct ib_uverbs_create_qp_resp * /*resp*/,
                    size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_query_qp(struct ibv_qp * /*qp*/, struct ibv_qp_attr * /*qp_attr*/,
                     int /*attr_mask*/,
                     struct ibv_qp_init_attr * /*qp_init_attr*/,
                     struct ibv_query_qp * /*cmd*/, size_t /*cmd_size*/) {
  return unsupported();
}

int ibv_cmd_modify_qp(struct ibv_qp * /*qp*/, struct ibv_qp_attr * /*attr*/,
                      int /*attr_mask*/, struct ibv_modify_qp * /*cmd*/,
                      size_t /*cmd_size*/) {
  return unsupported();
}

int ibv_cmd_modify_qp_ex(struct ibv_qp * /*qp*/, struct ibv_qp_attr * /*attr*/,
                         int /*attr_mask*/, struct ibv_modify_qp_ex * /*cmd*/,
                         size_t /*cmd_size*/,
                         struct ib_uverbs_ex_modify_qp_resp * /*resp*/,
                         size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_destroy_qp(struct ibv_qp * /*qp*/) { return unsupported(); }

int ibv_cmd_post_send(struct ibv_qp * /*ibqp*/, struct ibv_send_wr * /*wr*/,
                      struct ibv_send_wr ** /*bad_wr*/) {
  return unsupported();
}

int ibv_cmd_post_recv(struct ibv_qp * /*ibqp*/, struct ibv_recv_wr * /*wr*/,
                      struct ibv_recv_wr ** /*bad_wr*/) {
  return unsupported();
}

// --- AH, multicast -----------------------------------------------------------

int ibv_cmd_create_ah(struct ibv_pd * /*pd*/, struct ibv_ah * /*ah*/,
                      struct ibv_ah_attr * /*attr*/,
                      struct ib_uverbs_create_ah_resp * /*resp*/,
                      size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_destroy_ah(struct ibv_ah * /*ah*/) { return unsupported(); }

int ibv_cmd_attach_mcast(struct ibv_qp * /*qp*/, const union ibv_gid * /*gid*/,
                         uint16_t /*lid*/) {
  return unsupported();
}

int ibv_cmd_detach_mcast(struct ibv_qp * /*qp*/, const union ibv_gid * /*gid*/,
                         uint16_t /*lid*/) {
  return unsupported();
}

// --- Flows and flow actions --------------------------------------------------

int ibv_cmd_create_flow(struct ibv_qp * /*qp*/, struct ibv_flow * /*flow_id*/,
                        struct ibv_flow_attr * /*flow_attr*/, void * /*ucmd*/,
                        size_t /*ucmd_size*/) {
  return unsupported();
}

int ibv_cmd_destroy_flow(struct ibv_flow * /*flow_id*/) {
  return unsupported();
}

int ibv_cmd_create_flow_action_esp(struct ibv_context * /*ctx*/,
                                   struct ibv_flow_action_esp_attr * /*attr*/,
                                   struct verbs_flow_action * /*flow_action*/,
                                   struct ibv_command_buffer * /*driver*/) {
  return unsupported();
}

int ibv_cmd_modify_flow_action_esp(struct verbs_flow_action * /*flow_action*/,
                                   struct ibv_flow_action_esp_attr * /*attr*/,
                                   struct ibv_command_buffer * /*driver*/) {
  return unsupported();
}

int ibv_cmd_destroy_flow_action(struct verbs_flow_action * /*action*/) {
  return unsupported();
}

// --- WQ, RWQ indirection tables ----------------------------------------------

int ibv_cmd_create_wq(struct ibv_context * /*context*/,
                      struct ibv_wq_init_attr * /*wq_init_attr*/,
                      struct ibv_wq * /*wq*/, struct ibv_create_wq * /*cmd*/,
                      size_t /*cmd_size*/,
                      struct ib_uverbs_ex_create_wq_resp * /*resp*/,
                      size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_modify_wq(struct ibv_wq * /*wq*/, struct ibv_wq_attr * /*attr*/,
                      struct ibv_modify_wq * /*cmd*/, size_t /*cmd_size*/) {
  return unsupported();
}

int ibv_cmd_destroy_wq(struct ibv_wq * /*wq*/) { return unsupported(); }

int ibv_cmd_create_rwq_ind_table(
    struct ibv_context * /*context*/,
    struct ibv_rwq_ind_table_init_attr * /*init_attr*/,
    struct ibv_rwq_ind_table * /*rwq_ind_table*/,
    struct ib_uverbs_ex_create_rwq_ind_table_resp * /*resp*/,
    size_t /*resp_size*/) {
  return unsupported();
}

int ibv_cmd_destroy_rwq_ind_table(
    struct ibv_rwq_ind_table * /*rwq_ind_table*/) {
  return unsupported();
}

// --- Counters ----------------------------------------------------------------

int ibv_cmd_create_counters(struct ibv_context * /*context*/,
                            struct ibv_counters_init_attr * /*init_attr*/,
                            struct verbs_counters * /*vcounters*/,
                            struct ibv_command_buffer * /*link*/) {
  return unsupported();
}

int ibv_cmd_destroy_counters(struct verbs_counters * /*vcounters*/) {
  return unsupported();
}

int ibv_cmd_read_counters(struct verbs_counters * /*vcounters*/,
                          uint64_t * /*counters_value*/,
                          uint32_t /*ncounters*/, uint32_t /*flags*/,
                          struct ibv_command_buffer * /*link*/) {
  return unsupported();
}

}  // extern "C"
#pragma GCC visibility pop
