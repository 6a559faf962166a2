/* softverbs.h: softverbs' extensions to the verbs API, for sharing verbs
 * objects between processes (docs/SHARING.md).
 *
 * Contract: link with softverbs' libibverbs.so.1 (symbols at SOFTVERBS_1.0).
 * All calls are thread-safe. Every process that holds an object is equal:
 * any holder may destroy it, which destroys it for all; a holder's later use
 * of a destroyed object fails with an error, never a crash. "Unimport"
 * releases only the calling process's handle. When every process holding a
 * context has exited, the daemon frees whatever is left of it.
 *
 * rdma-core's own sharing calls (ibv_import_device, ibv_import_pd,
 * ibv_import_mr, ibv_unimport_pd, ibv_unimport_mr) work unchanged; these add
 * CQs and QPs and a way to hand a set of objects over a unix socket.
 */
#ifndef SOFTVERBS_SOFTVERBS_H
#define SOFTVERBS_SOFTVERBS_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Import a CQ of an imported (shared) context by its handle (cq->handle in
 * the creating process). Any holder may poll it; every completion is seen
 * by exactly one poller. Imported CQs have no completion channel. */
struct ibv_cq *svx_import_cq(struct ibv_context *context, uint32_t cq_handle);
void svx_unimport_cq(struct ibv_cq *cq);

/* Import a QP of a shared context by its number. Any holder may post to it
 * (posts are serialised as between threads) and modify it. Its CQs and PD
 * are imported too if this process has no handle for them yet. */
struct ibv_qp *svx_import_qp(struct ibv_context *context, uint32_t qp_num);
void svx_unimport_qp(struct ibv_qp *qp);

/* Import an SRQ of a shared context by its handle (srq->handle in the
 * creating process), with its PD. Any holder may post receives to it and
 * modify or query it; the QPs attached to it take receives from it,
 * whichever process posted them. Unimport releases only this handle. */
struct ibv_srq *svx_import_srq(struct ibv_context *context, uint32_t srq_handle);
void svx_unimport_srq(struct ibv_srq *srq);

/* Import a completion channel of a shared context by its handle
 * (svx_comp_channel_handle in the creating process). The channel is the
 * same in every holder: CQs imported after it (svx_import_cq, svx_unpack:
 * pack the channel before its CQs) are bound to it, any holder may arm them
 * and wait with ibv_get_cq_event, and each event goes to one waiter.
 * svx_unimport_comp_channel releases only this handle (EBUSY while this
 * process's CQs use it). */
struct ibv_comp_channel *svx_import_comp_channel(struct ibv_context *context, uint32_t handle);
int svx_unimport_comp_channel(struct ibv_comp_channel *channel);
uint32_t svx_comp_channel_handle(struct ibv_comp_channel *channel);

/* The local handle of a QP of this context by number (for example the
 * qp_num of a completion of a shared CQ), importing it if needed.
 * NULL with errno EINVAL if the context has no such QP. */
struct ibv_qp *svx_resolve_qp(struct ibv_context *context, uint32_t qp_num);

enum svx_object_type {
  SVX_OBJ_PD = 1,
  SVX_OBJ_MR = 2,
  SVX_OBJ_CQ = 3,
  SVX_OBJ_QP = 4,
  SVX_OBJ_SRQ = 5,
  SVX_OBJ_CHANNEL = 6,
};

struct svx_object {
  enum svx_object_type type;
  union {
    struct ibv_pd *pd;
    struct ibv_mr *mr;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_srq *srq;
    struct ibv_comp_channel *channel;
    void *ptr;
  };
};

#define SVX_MAX_PACKED 64

/* Pack a context and up to SVX_MAX_PACKED of its objects into one message on
 * a connected unix-domain socket (the context's command fd travels as
 * SCM_RIGHTS). Returns 0 or an errno value. */
int svx_pack(int sock, struct ibv_context *context, const struct svx_object *objects, int count);

/* The inverse: receive one packed message, import the context and each
 * object. *count is set to the number of objects; objects[i] matches the
 * sender's order. Returns 0 or an errno value. */
int svx_unpack(int sock, struct ibv_context **context, struct svx_object *objects, int max, int *count);

#define SVX_SHMID_MAX 64

/* Seed 000: register a named shared memory region. Ids are per user: each
 * user has its own id space, and no user attaches another's region. The
 * first caller (any process of the user, in any context) creates a zero-filled region of
 * `length` bytes under the byte-array `id` (1 to SVX_SHMID_MAX bytes); later
 * callers attach to it, in any order, with `length` no larger than the
 * region (0: all of it). The library maps the region in the caller and
 * registers it; mr->addr is where. The region is tied to no context and is
 * freed when its last registration is deregistered. *created (if not NULL)
 * tells whether this call created it. NULL with errno on failure (EINVAL:
 * bad id or length, or larger than the existing region). */
struct ibv_mr *svx_reg_shmid(struct ibv_pd *pd, const void *id, size_t id_len, size_t length,
                             unsigned int access, int *created);

/* Seed 000's reg_shared: register the pages of an existing MR (for example
 * one imported from another process) again, with its own keys and access,
 * at `addr` in this process. With addr == NULL the library maps the pages
 * itself. A non-NULL addr must map the very same pages (same file, same
 * offsets), else EINVAL; a PD of another device is refused with EINVAL. */
struct ibv_mr *svx_reg_shared(struct ibv_mr *mr, struct ibv_pd *pd, void *addr, unsigned int access);

/* The namespace (seed 002): publish an object this process holds under a
 * path-like name ("/app/mr0": components of [A-Za-z0-9._-], at most
 * SVX_NAME_MAX-1 bytes), owned by the caller's user, with `group` (-1: the
 * caller's group; otherwise one the caller belongs to, unless root) and
 * permission bits `mode` (0..0777; r = may open for reading, w = for
 * writing). The name goes away with the object or with svx_unpublish.
 * Publishing never replaces or opens an existing name.
 * Returns 0 or an errno value: EEXIST (the name is taken), EINVAL (bad name,
 * mode, or an object that is not this context's), EPERM (group). */
#define SVX_NAME_MAX 128
#define SVX_OPEN_READ 4
#define SVX_OPEN_WRITE 2
/* svx_open: the caller expects an object of its own user; a name another
 * user published fails with EPERM (and grants nothing). */
#define SVX_OPEN_OWN 0x100
int svx_publish(struct ibv_context *context, const char *name, const struct svx_object *object,
                unsigned int mode, int group);

/* Quota: a user holds at most SOFTVERBSD_QUOTA_NAME names (4096 by default
 * on the system daemon); one more fails with EDQUOT. */

/* Remove a name (only its owner or root may). 0, ENOENT or EPERM. */
int svx_unpublish(struct ibv_context *context, const char *name);

/* rdma_cm ports on the system daemon (used by softverbs' librdmacm; see
 * docs/RDMACM.md, "Users"): hold (port space `ps`, `port`, address `addr`:
 * AF_INET or AF_INET6, port ignored; the wildcard for any) for this
 * process; port 0 picks one. 0 with *port_out and *fd_out (the listening
 * unix socket of the port, the caller's to accept on and close), or an
 * errno: EACCES (a port below 1024, not root), EADDRINUSE, ENOMEM (the
 * user's quota of ports), EOPNOTSUPP (not the system daemon). */
int svx_cm_bind(struct ibv_context *context, int ps, const struct sockaddr *addr, uint16_t *port_out, int *fd_out);
/* Give a port held with svx_cm_bind back (its address and port). */
int svx_cm_unbind(struct ibv_context *context, int ps, const struct sockaddr *addr, uint16_t port);

/* Open a published object by name: checks `access` (SVX_OPEN_READ and/or
 * SVX_OPEN_WRITE) against the entry's mode with the caller's real
 * credentials (from the socket, as the kernel gives them), then returns a
 * new context that shares the object's context (as ibv_import_device does)
 * and the object imported into it (*object; an MR comes with its PD). Close
 * the context with ibv_close_device when done. NULL with errno: ENOENT (no
 * such name), EACCES (the mode denies it), EPERM (the mode allows it but
 * the object belongs to another user: sharing memory between users needs a
 * path the daemon carries out, which is not built yet; see docs/SHARING.md),
 * EINVAL (bad name or access). Root is not special: it never joins another
 * user's context. With SVX_OPEN_OWN in `access`, a name another user
 * published fails with EPERM (no grant). Between users only a CQ is granted
 * this way, for reading (in a context of the caller's own, nothing mapped:
 * ibv_poll_cq goes through the daemon, ibv_req_notify_cq is EOPNOTSUPP);
 * another user's memory is reached through its keys over a connection. */
struct ibv_context *svx_open(const char *name, int access, struct svx_object *object);

#ifdef __cplusplus
}
#endif

#endif /* SOFTVERBS_SOFTVERBS_H */
