// The private provider ABI of every rdma-core release since v33, side by
// side. rdma-core names its private version node after IBVERBS_PABI_VERSION
// (CMakeLists.txt), which changes whenever a private symbol changes:
//   IBVERBS_PRIVATE_33  v33
//   IBVERBS_PRIVATE_34  v34-v56 (Debian 12's v44 among them)
//   IBVERBS_PRIVATE_57  v57-v58
//   IBVERBS_PRIVATE_59  v59-v63
//   IBVERBS_PRIVATE_64  v64
// A provider library or pyverbs built against any of them imports its
// symbols at its release's node, so this library defines each symbol at
// every node whose release's libibverbs.map lists it: the newest node is
// the default version (libibverbs.map, IBVERBS_PRIVATE_64), each older one
// a non-default version (sym@IBVERBS_PRIVATE_NN) made here by an alias:
// a one-instruction entry that jumps to the default definition. A jump
// keeps every argument as the caller passed it, variadic ones too.
//
// The node lists mirror the releases' maps (libibverbs/libibverbs.map.in at
// each tag); tests/abi/ checks the built library against them.
//
// verbs_register_driver_NN is called by a provider's constructor: softverbs
// is the only device, so registration does nothing, at every node.

// Each group: the symbols of the listed nodes (besides the data object
// verbs_allow_disassociate_destroy, below). The maps of v33-v56 also list
// ibv_cmd_query_device, which no release since v33 defines, so no library
// exported it and none is here.
// In IBVERBS_PRIVATE_33, 34, 57 and 59:
#define SV_PRIVATE_SINCE_33(X)                                                                           \
  X(__ioctl_final_num_attrs) X(_verbs_init_and_alloc_context) X(execute_ioctl) X(ibv_cmd_advise_mr)    \
  X(ibv_cmd_alloc_dm) X(ibv_cmd_alloc_mw) X(ibv_cmd_alloc_pd) X(ibv_cmd_attach_mcast)                  \
  X(ibv_cmd_close_xrcd) X(ibv_cmd_create_ah) X(ibv_cmd_create_counters) X(ibv_cmd_create_cq)           \
  X(ibv_cmd_create_cq_ex) X(ibv_cmd_create_flow) X(ibv_cmd_create_flow_action_esp)                     \
  X(ibv_cmd_create_qp) X(ibv_cmd_create_qp_ex) X(ibv_cmd_create_qp_ex2) X(ibv_cmd_create_rwq_ind_table) \
  X(ibv_cmd_create_srq) X(ibv_cmd_create_srq_ex) X(ibv_cmd_create_wq) X(ibv_cmd_dealloc_mw)            \
  X(ibv_cmd_dealloc_pd) X(ibv_cmd_dereg_mr) X(ibv_cmd_destroy_ah) X(ibv_cmd_destroy_counters)          \
  X(ibv_cmd_destroy_cq) X(ibv_cmd_destroy_flow) X(ibv_cmd_destroy_flow_action) X(ibv_cmd_destroy_qp)   \
  X(ibv_cmd_destroy_rwq_ind_table) X(ibv_cmd_destroy_srq) X(ibv_cmd_destroy_wq)                        \
  X(ibv_cmd_detach_mcast) X(ibv_cmd_free_dm) X(ibv_cmd_get_context) X(ibv_cmd_modify_cq)               \
  X(ibv_cmd_modify_flow_action_esp) X(ibv_cmd_modify_qp) X(ibv_cmd_modify_qp_ex) X(ibv_cmd_modify_srq) \
  X(ibv_cmd_modify_wq) X(ibv_cmd_open_qp) X(ibv_cmd_open_xrcd) X(ibv_cmd_poll_cq) X(ibv_cmd_post_recv) \
  X(ibv_cmd_post_send) X(ibv_cmd_post_srq_recv) X(ibv_cmd_query_context) X(ibv_cmd_query_device_any)   \
  X(ibv_cmd_query_mr) X(ibv_cmd_query_port) X(ibv_cmd_query_qp) X(ibv_cmd_query_srq)                   \
  X(ibv_cmd_read_counters) X(ibv_cmd_reg_dm_mr) X(ibv_cmd_reg_mr) X(ibv_cmd_req_notify_cq)             \
  X(ibv_cmd_rereg_mr) X(ibv_cmd_resize_cq) X(ibv_query_gid_type) X(ibv_read_ibdev_sysfs_file)          \
  X(verbs_init_cq) X(verbs_open_device) X(verbs_set_ops) X(verbs_uninit_context)
// In IBVERBS_PRIVATE_34, 57 and 59 (added during v34-v56):
#define SV_PRIVATE_SINCE_34(X) \
  X(__verbs_log) X(ibv_cmd_create_cq_ex2) X(ibv_cmd_reg_dmabuf_mr) X(ibv_wr_opcode_str)
// In IBVERBS_PRIVATE_59 (added during v59-v63):
#define SV_PRIVATE_SINCE_59(X)                                                                 \
  X(ibv_cmd_alloc_dmah) X(ibv_cmd_export_dmabuf_fd) X(ibv_cmd_free_dmah) X(ibv_cmd_query_port_speed) \
  X(ibv_cmd_reg_mr_ex)

// sym@IBVERBS_PRIVATE_<node>: an entry that jumps to `sym`'s definition.
#define SV_COMPAT_ENTRY(node, sym, target)                                                 \
  __asm__(".pushsection .text\n"                                                           \
          ".globl sv_compat_" #node "_" #sym "\n"                                          \
          ".type sv_compat_" #node "_" #sym ", @function\n"                                \
          "sv_compat_" #node "_" #sym ":\n"                                                \
          "\tjmp " #target "@PLT\n"                                                        \
          ".size sv_compat_" #node "_" #sym ", . - sv_compat_" #node "_" #sym "\n"          \
          ".symver sv_compat_" #node "_" #sym ", " #sym "@IBVERBS_PRIVATE_" #node "\n"      \
          ".popsection\n");

// verbs_allow_disassociate_destroy@IBVERBS_PRIVATE_<node>: a bool of its own
// per node (a data symbol cannot jump). rdma-core's providers set it at
// load time; softverbs never reads it.
#define SV_COMPAT_FLAG(node)                                                                       \
  __asm__(".pushsection .bss\n"                                                                    \
          ".globl sv_compat_" #node "_allow_disassociate\n"                                        \
          ".type sv_compat_" #node "_allow_disassociate, @object\n"                                \
          ".size sv_compat_" #node "_allow_disassociate, 1\n"                                      \
          "sv_compat_" #node "_allow_disassociate:\n\t.zero 1\n"                                   \
          ".symver sv_compat_" #node "_allow_disassociate, "                                       \
          "verbs_allow_disassociate_destroy@IBVERBS_PRIVATE_" #node "\n"                           \
          ".popsection\n");

#define SV_AT_33(sym) SV_COMPAT_ENTRY(33, sym, sym)
#define SV_AT_34(sym) SV_COMPAT_ENTRY(34, sym, sym)
#define SV_AT_57(sym) SV_COMPAT_ENTRY(57, sym, sym)
#define SV_AT_59(sym) SV_COMPAT_ENTRY(59, sym, sym)

SV_PRIVATE_SINCE_33(SV_AT_33)
SV_PRIVATE_SINCE_33(SV_AT_34)
SV_PRIVATE_SINCE_34(SV_AT_34)
SV_PRIVATE_SINCE_33(SV_AT_57)
SV_PRIVATE_SINCE_34(SV_AT_57)
SV_PRIVATE_SINCE_33(SV_AT_59)
SV_PRIVATE_SINCE_34(SV_AT_59)
SV_PRIVATE_SINCE_59(SV_AT_59)
SV_COMPAT_FLAG(33)
SV_COMPAT_FLAG(34)
SV_COMPAT_FLAG(57)
SV_COMPAT_FLAG(59)

#pragma GCC visibility push(default)
extern "C" {

void verbs_register_driver_33(const void*) {}
void verbs_register_driver_34(const void*) {}
void verbs_register_driver_57(const void*) {}
void verbs_register_driver_59(const void*) {}
void verbs_register_driver_64(const void*) {}

}  // extern "C"
#pragma GCC visibility pop
