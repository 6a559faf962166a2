// protocol.h: the control protocol between libibverbs.so.1 (client) and
// softverbsd. Documented in docs/PROTOCOL.md.
//
// One request per SOCK_SEQPACKET message, answered by exactly one reply with
// the same op and seq. Every message starts with Header. Each op has a fixed
// request and reply struct; the daemon rejects a request whose length is not
// exactly sizeof(its struct), whose magic or version differ, or which
// carries file descriptors it did not ask for. Handles are daemon-assigned
// and meaningful only to the client that holds them. Each op's contract is
// declared once, in the op table (common/op_table.h, included at the end).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/shm_layout.h"

namespace sv::proto {

constexpr uint32_t kMagic = 0x53565250;  // "SVRP"
constexpr uint16_t kVersion = 1;
constexpr size_t kMaxMessage = 1024;

enum class Op : uint16_t {
  Hello = 1,       // reply fd: the user's device segment
  AllocPd,
  DeallocPd,
  RegBacking,      // fd: the process's backing memfd
  RegMr,
  DeregMr,
  CreateChannel,   // fd: the channel's eventfd
  DestroyChannel,
  CreateCq,        // reply fd: CQ segment
  DestroyCq,
  CreateQp,        // reply fd: QP segment
  ModifyQp,
  DestroyQp,
  ConnectPeer,     // reply fds: peer QP segment, peer recv CQ segment, [peer channel eventfd]
  GetMrBacking,    // reply fd: backing memfd holding the MR
  PeerError,       // move the connected peer QP to ERR (remote error detected by a requester)
  Status,
  Accounts,        // locked-memory charges per process
  AllocMw,
  DeallocMw,
  BindMw,
  InvalidateKey,
  ClaimSocket,     // the client's end of this connection, by inode
  ImportContext,   // fd: another process's command socket (ibv_import_device)
  QueryPd,         // is this PD in my context?
  QueryMr,         // ibv_import_mr
  ImportCq,        // reply fd: CQ segment
  ImportQp,        // reply fd: QP segment
  RegShmid,        // named shared memory region: create or attach; reply fd: the region
  RegShared,       // register an existing MR's pages again (at another address)
  ConnectUd,       // UD: reach QP `handle2` from my UD QP `handle`; reply fds as ConnectPeer
  RegAsync,        // fd: the context's async wake-up socket (a socketpair end), signalled when an AsyncEvent is sent
  AsyncEvent,      // daemon -> client, unsolicited (seq 0): an affiliated async event
  CreateSrq,       // reply fd: SRQ segment
  DestroySrq,
  SrqLimit,        // a sender found the SRQ below its armed limit: tell its holders
  NsPublish,       // the namespace (docs/SHARING.md): publish an object I hold under a name
  NsUnpublish,
  NsOpen,          // attach this (fresh) connection to the context of a published object
  NsList,          // list the namespace, a page at a time
  ImportSrq,       // reply fd: SRQ segment
  ImportChannel,   // reply fd: the completion channel's eventfd
  Mediate,         // carry out one RC/UC operation towards a peer of another user
  ResizeCq,        // a new, pending segment for a CQ; reply fd: that segment
  ResizeCqDone,    // commit (the CQ moves to the pending segment) or abort a ResizeCq
  GetCq,           // the current segment of a CQ I may complete into; reply fd: the segment
  CqError,         // a producer overran the CQ (IBTA 11.4.2.1): CQ error event, its QPs to ERR
  AttachMcast,     // ibv_attach_mcast: my UD QP joins a multicast group
  DetachMcast,
  OpenXrcd,        // fd (optional, has_fd): the file whose inode names the XRC domain
  CloseXrcd,
  ConnectXrc,      // XRC: reach SRQ `srqn` through my XRC_SEND QP's target; reply fds as ConnectPeer
  OpenQp,          // ibv_open_qp: an XRC target QP of my XRC domain; reply fd: QP segment
  RoceAttach,      // RoCEv2 (docs/ROCE.md): reply fds: the UDP socket on the GID's address, the arrival socket
  PollCq,          // a CQ another user granted me by name: the daemon pops up to `max` completions for me
  ReregMr,         // ibv_rereg_mr: change an MR's PD, access or translation in place; its keys stay
  AllocDm,         // ibv_alloc_dm: device memory; reply fd: its memfd (sealed at its size)
  FreeDm,
  ImportDm,        // ibv_import_dm: a DM of my context by handle; reply fd: its memfd
  RegDmMr,         // ibv_reg_dm_mr: a zero-based MR over part of a DM
  Netns,           // the caller's network namespace: EXDEV if the daemon serves another (common/paths.h)
  MediatePost,     // Mediate without a reply: pipelined (docs/PERFORMANCE.md, "Between users"); the outcome in the QP segment and CQ
  MediateGone,     // can connection `client` still finish pipelined requests on my QP? 0: never again; EBUSY: it can
  PostRing,        // this connection's request ring for MediatePost; reply fds: the ring's memfd, its wake-up socket
  CmBind,          // rdma_cm (system daemon): hold a port; reply fd: the listening socket the daemon made for it
  CmUnbind,        // give a held port back
  Wake,            // reply fd: this connection's wake socket; a pid comes when another process leaves its context
  Refused,         // daemon -> client, unsolicited (seq 0), then the daemon closes: why it will not serve
  ResList,         // the objects of one kind the caller may see, a page at a time (`rdma resource`)
  WireCounters,    // the port's RoCEv2 counters of the caller's own QPs (`rdma statistic show`)
  ResizeSrq,       // a new, pending segment for an SRQ (IBV_SRQ_MAX_WR); reply fd: that segment
  ResizeSrqDone,   // commit (the SRQ moves to the pending segment) or abort a ResizeSrq
  GetSrq,          // the current segment of an SRQ I hold or reach; reply fd: the segment
  Counters,        // the port's counters and, a page at a time, each QP's (common/counters.h), of the caller's own QPs
  RegOdpMr,        // an on-demand-paging MR: the registrant's address space, nothing pinned (docs/MEMORY.md)
  kCount
};

struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t op;
  uint32_t seq;
  int32_t status;  // replies: 0 or a positive errno
};

struct Empty {
  Header h;
};

// ImportContext's reply: the id the daemon gave this connection, as Hello's
// (a pipelined run names its connection with it, MediateGoneReq).
struct ClientReply {
  Header h;
  uint32_t client_id;
  uint32_t pad;
};

struct HelloReply {
  Header h;
  uint32_t client_id;
  uint32_t pid;
  uint64_t boot_id;
};

struct HandleReq {  // DeallocPd, DeregMr, DestroyChannel, DestroyCq, DestroyQp, ConnectPeer
  Header h;
  uint32_t handle;
  uint32_t reserved;
};

struct PeerErrorReq {  // the requester's QP, and the status its request completed with
  Header h;
  uint32_t handle;
  uint32_t wc_status;  // ibv_wc_status: chooses the responder's async event (access::responder_event)
};

struct HandleReply {  // AllocPd, RegBacking, CreateChannel
  Header h;
  uint32_t handle;
  uint32_t reserved;
};

struct RegMrReq {
  Header h;
  uint32_t pd;
  uint32_t backing;
  uint64_t addr;    // registrant's address (== backing file offset)
  uint64_t length;
  uint64_t iova;
  uint32_t access;
  uint32_t flags;  // RegOdpMr: kRegThroughOwner or 0; others: 0
};
// RegOdpMr for memory that cannot become the backing file's (shared
// mappings, hugetlb, stacks: docs/MEMORY.md, "Every kind of memory"): the
// MR is reached through its owner's address space as an ODP MR is, but it
// is no ODP MR to the application: IBV_ACCESS_ON_DEMAND is refused with
// it, and its pages count against RLIMIT_MEMLOCK as the kernel's pinning.
inline constexpr uint32_t kRegThroughOwner = 1;

struct RegMrReply {
  Header h;
  uint32_t handle;
  uint32_t key;
};

// ibv_rereg_mr(3): the MR `handle` changes what `flags` (IBV_REREG_MR_CHANGE_*)
// names, in place: pd (CHANGE_PD), access (CHANGE_ACCESS), backing, addr,
// length and iova (CHANGE_TRANSLATION, as in RegMrReq). The reply is
// RegMrReply with the same handle and key.
struct ReregMrReq {
  Header h;
  uint32_t handle;
  uint32_t flags;
  uint32_t pd;
  uint32_t backing;
  uint64_t addr;
  uint64_t length;
  uint64_t iova;
  uint32_t access;
  uint32_t reserved;
};

struct CreateCqReq {
  Header h;
  uint32_t cqe;
  uint32_t channel;  // 0 = none
};

struct CreateCqReply {
  Header h;
  uint32_t handle;
  uint32_t capacity;
  uint64_t segment_size;
};

struct CreateQpReq {
  Header h;
  uint32_t pd;
  uint32_t send_cq;
  uint32_t recv_cq;
  uint32_t srq;
  uint32_t qp_type;
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
  uint32_t sq_sig_all;
  uint32_t xrcd;  // IBV_QPT_XRC_RECV: the XRC domain handle (no PD, no CQs)
};

struct CreateQpReply {
  Header h;
  uint32_t qpn;
  uint32_t sq_capacity;
  uint32_t rq_capacity;
  uint32_t reserved;
  uint64_t segment_size;
};

// The attributes of ibv_modify_qp that the daemon keeps; attr_mask says which are set.
struct ModifyQpReq {
  Header h;
  uint32_t qpn;
  uint32_t attr_mask;
  uint32_t qp_state;
  uint32_t cur_qp_state;
  uint32_t path_mtu;
  uint32_t qkey;
  uint32_t rq_psn;
  uint32_t sq_psn;
  uint32_t dest_qp_num;
  uint32_t qp_access_flags;
  uint16_t pkey_index;
  uint8_t port_num;
  uint8_t max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t min_rnr_timer;
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint8_t ah_port_num;
  uint8_t ah_is_global;
  uint8_t ah_sgid_index;
  uint8_t ah_dgid[16];
  uint16_t ah_dlid;
  uint8_t sq_draining;
  // To ERR because this QP's responder detected an error on the wire: the
  // ibv_wc_status the requester completes with (IBV_WC_REM_*), which chooses
  // the affiliated async event the daemon raises (access::responder_event); 0 otherwise.
  uint8_t responder_status;
};

// fds: the peer's QP segment, its receive CQ segment, then its SRQ segment
// if has_srq, then its CQ's channel eventfd if has_channel.
struct ConnectPeerReply {
  Header h;
  uint32_t peer_qpn;
  uint32_t peer_recv_cq;
  uint64_t qp_segment_size;
  uint64_t cq_segment_size;
  uint32_t has_channel;
  uint32_t has_srq;
  uint64_t srq_segment_size;
  uint32_t srq_handle;
  // 1: the peer belongs to another user. No descriptor comes with the reply;
  // each operation goes through the daemon (Op::Mediate), which applies the
  // keys' bounds to the peer's memory itself.
  uint32_t mediated;
  uint32_t pd;  // ConnectXrc: the XRC SRQ's PD (receive buffers are checked against it); else 0
  uint32_t min_rnr_timer;  // mediated: the peer's (its QP entry is not in the requester's device segment)
};

struct ResizeCqReq {  // reply: CreateCqReply
  Header h;
  uint32_t handle;
  uint32_t cqe;
};

struct ResizeCqDoneReq {
  Header h;
  uint32_t handle;
  uint32_t commit;  // 1: the caller moved every completion into the pending segment; 0: abort
};

struct ResizeSrqReq {  // reply: CreateSrqReply
  Header h;
  uint32_t handle;
  uint32_t max_wr;
};

struct ResizeSrqDoneReq {
  Header h;
  uint32_t handle;
  uint32_t commit;  // 1: the caller moved every posted receive into the pending segment; 0: abort
};

struct McastReq {  // AttachMcast, DetachMcast
  Header h;
  uint32_t qpn;
  uint16_t lid;
  uint16_t reserved;
  uint8_t gid[16];
};

struct CreateSrqReq {
  Header h;
  uint32_t pd;
  uint32_t max_wr;
  uint32_t max_sge;
  uint32_t srq_limit;
  uint32_t srq_type;  // IBV_SRQT_BASIC or IBV_SRQT_XRC
  uint32_t xrcd;      // XRC: the XRC domain handle
  uint32_t cq;        // XRC: the CQ its receives complete into
  uint32_t reserved;
};

struct OpenXrcdReq {
  Header h;
  uint32_t oflags;  // O_CREAT, O_EXCL
  uint32_t has_fd;  // 1: an fd comes with the request; 0: a private domain (fd -1)
};

struct ConnectXrcReq {
  Header h;
  uint32_t qpn;   // my XRC_SEND QP, or my XRC_RECV QP whose initiator is on the wire (its own domain's SRQ)
  uint32_t srqn;  // the remote XRC SRQ
};

struct OpenQpReq {
  Header h;
  uint32_t qpn;
  uint32_t xrcd;
};

struct CreateSrqReply {
  Header h;
  uint32_t handle;
  uint32_t capacity;
  uint64_t segment_size;
};

// One send work request towards a peer the requester may not map (another
// user's QP): the daemon checks both sides' keys and copies. sge: the
// requester's local list (lkeys of its own MRs).
struct MediateReq {
  Header h;
  uint32_t qpn;        // the requester's QP
  uint32_t opcode;     // IBV_WR_*
  uint32_t send_flags;
  uint32_t imm_data;   // as in ibv_send_wr (network order)
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t num_sge;
  uint64_t compare_add;
  uint64_t swap;
  shm::Sge sge[shm::kMaxSge];
  uint32_t inline_len;  // IBV_SEND_INLINE: the payload is here, not in sge
  // MediatePost only: the requester's run of pipelined requests this one
  // belongs to (a failed or stalled request stops the rest of its run),
  // and the wr_id its send completion carries.
  uint32_t epoch;
  uint64_t wr_id;
  uint8_t inline_data[shm::kMaxInline];
};
static_assert(sizeof(MediateReq) <= kMaxMessage);

// MediateGone: a sharer of an RC QP whose pipelined run was sent by a
// process that died asks whether that run's connection (the client id the
// sender wrote beside its run, QpSegmentHeader::med_client) can still
// finish any of it; only once it cannot may the sharer complete the rest
// in error without a completion coming twice.
struct MediateGoneReq {
  Header h;
  uint32_t qpn;     // the asker's QP
  uint32_t client;  // the connection that sent the run
};

// PostRing's reply: the connection's request ring (PostRingHeader, then
// `capacity` slots of one MediateReq each; the daemon's memfd, sealed at
// `size`) and the eventfd that wakes the daemon when the header asks.
struct PostRingReply {
  Header h;
  uint32_t capacity;
  uint32_t slot_size;
  uint64_t size;
};

// rdma_cm ports (docs/RDMACM.md, "Users"): with the system daemon every
// user's rdma_cm ids meet in the daemon's rendezvous directory, which only
// the daemon writes. CmBind asks it to hold (port space, port, address) for
// the caller: `family` AF_INET or AF_INET6, `addr` the address (4 or 16
// bytes; all zero: the wildcard), port 0 for an ephemeral one. The reply
// names the port and carries the listening socket made for it.
struct CmBindReq {
  Header h;
  uint32_t ps;      // RDMA_PS_TCP, _UDP, _IB or _IPOIB
  uint16_t port;    // host order; 0: the daemon picks one in 32768..60999
  uint16_t family;  // AF_INET or AF_INET6
  uint8_t addr[16];
};
struct CmBindReply {
  Header h;
  uint16_t port;
  uint16_t reserved[3];
};
// CmUnbind: the same fields as the CmBind that held the port (port set).

// The request ring (docs/PROTOCOL.md, "The request ring"): MediatePost
// requests the client writes into shared memory instead of the socket. The
// daemon reads `tail` and each slot once, copying the slot out before any
// check (the client can write all of it at any time), and never reads back
// what it wrote itself (`head`, `wake`): it keeps its own head.
struct PostRingHeader {
  uint32_t magic;
  uint32_t capacity;
  alignas(64) std::atomic<uint64_t> tail;  // the client's: requests written
  alignas(64) std::atomic<uint64_t> head;  // the daemon's: requests taken (published for the client)
  std::atomic<uint32_t> wake;              // the daemon's: 1 while it may sleep (write the eventfd)
};
constexpr uint32_t kPostRingMagic = 0x53565052;  // "SVPR"
constexpr uint32_t kPostRingSlots = 256;
constexpr size_t kPostRingHeaderSize = 192;
static_assert(sizeof(PostRingHeader) <= kPostRingHeaderSize);

enum MediateOutcome : uint32_t { kMediateDone = 0, kMediateRnr = 1, kMediateRetry = 2, kMediateError = 3 };

struct MediateReply {
  Header h;
  uint32_t outcome;     // MediateOutcome
  uint32_t wc_status;   // the requester's completion status when kMediateError
  uint32_t peer_error;  // the responder detected the error (it went to ERR)
  uint32_t byte_len;
};

struct ImportSrqReply {
  Header h;
  uint32_t pd;
  uint32_t max_sge;
  uint64_t segment_size;
};

struct AsyncEventMsg {
  Header h;
  uint32_t event_type;  // enum ibv_event_type
  uint32_t element;     // QPN for QP events, CQ handle for CQ events, 0 for the device
};

// Refused: sent at most once, without blocking (MSG_DONTWAIT), on a
// connection the daemon then closes, so that the library can say why and
// what to do (a client that does not know the op only sees the connection
// closed). h.status: the errno the library returns (EPERM, EMFILE).
// `theirs` and `mine`: what differs between the client and the daemon
// (kRefusedPidNamespace: the inodes of the client's pid namespace, 0 if the
// daemon could not read it, and of the daemon's; kRefusedUser: the client's
// uid and the daemon's), otherwise 0.
struct RefusedMsg {
  Header h;
  uint32_t reason;  // kRefused*
  uint32_t reserved;
  uint64_t theirs;
  uint64_t mine;
};
constexpr uint32_t kRefusedPidNamespace = 1;  // the client is in another pid namespace
constexpr uint32_t kRefusedUser = 2;          // a user's daemon, and the client is another user's
constexpr uint32_t kRefusedConnections = 3;   // the user's connection quota is reached
constexpr uint32_t kRefusedUnmappedUser = 4;  // a daemon in a user namespace that cannot name the client's uid

struct ConnectUdReq {
  Header h;
  uint32_t qpn;   // mine
  uint32_t dest;  // the destination UD QP
};

// RoCEv2: QP `qpn` (mine) talks to another host from local GID `sgid`. The
// daemon owns UDP port 4791 and forwards arriving datagrams for the QPN to
// this connection's arrival socket, each prefixed by a RoceArrival.
struct RoceAttachReq {
  Header h;
  uint32_t qpn;
  uint8_t sgid[16];
  uint32_t flags;  // kRoceSecondAddress: a UD QP attached already, on its other family's address
  // Which of the process's RoCE threads serves the QP (below kRoceMaxLanes):
  // a client of the port's own user gets one steered socket per lane, and
  // the QP's datagrams reach that lane's socket (docs/ROCE.md, "Several
  // engine threads"). Ignored for clients that are forwarded.
  uint32_t lane;
};
enum : uint32_t { kRoceSecondAddress = 1 };
constexpr uint32_t kRoceMaxLanes = 8;

struct RoceAttachReply {
  Header h;
  // The wire faults of the daemon's plan for this QP (SOFTVERBS_FAULTS or
  // SOFTVERBS_FAULT_PLAN, common/fault_plan.h): per million.
  uint32_t drop_ppm;
  uint32_t dup_ppm;
  uint32_t reorder_ppm;
  uint32_t reorder_delay_us;
  uint64_t seed;
  // kRoceSteered: the first fd is the client's own socket in the port's
  // SO_REUSEPORT group, to which the daemon steers the datagrams of the
  // client's QPNs: the client receives on it (and sends); given only to a
  // client of the daemon's own user (daemon/roce_port.cc, client_socket).
  // Without it, the first fd is the client's own socket bound to the
  // address at another port, in no group, for sending only; arrivals come
  // on the arrival socket (always passed: the fallback).
  uint32_t flags;
  uint32_t corrupt_ppm;  // the fault plan again: corruption (an ICRC the receiver rejects)
};
enum : uint32_t { kRoceSteered = 1 };

// Prefix of each datagram on an arrival socket: the sender's address; for
// a multicast datagram (docs/ROCE.md, "Multicast") also the IP group it
// was sent to and the member QP (of this connection) it is for, one copy
// per member: to_len 0 for every other datagram.
struct RoceArrival {
  uint8_t from[28];  // sockaddr_in or sockaddr_in6
  uint32_t from_len;
  uint8_t to[28];    // the group (port 4791), of from's family
  uint32_t to_len;
  uint32_t qpn;      // the member QP: the BTH's DestQP is the multicast QPN
};

struct GetMrBackingReq {
  Header h;
  uint32_t key;
  uint32_t reserved;
};

struct GetMrBackingReply {
  Header h;
  uint32_t backing;
  uint32_t reserved;
};

struct StatusReply {
  Header h;
  uint32_t clients;
  uint32_t pds;
  uint32_t mrs;
  uint32_t cqs;
  uint32_t qps;
  uint32_t channels;
  uint32_t backings;
  uint32_t regions;  // named shared memory regions
  uint32_t daemon_pid;
  uint32_t served_as;  // kServedAs* bits: which daemon answers (softverbs status)
};
// Netns: a network namespace as stat(2) of /proc/self/ns/net names it
// (sv::NetnsId). The request carries the caller's; the reply the daemon's,
// with status EXDEV when they differ (the caller must find its own
// namespace's daemon) unless the request's `flags` has kNetnsQuery (only
// asking: softverbs status).
struct NetnsMsg {
  Header h;
  uint64_t dev;
  uint64_t ino;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kNetnsQuery = 1;
constexpr uint32_t kServedAsSystem = 1;     // the system daemon (--system), else a user's
constexpr uint32_t kServedAsActivated = 2;  // its socket came from systemd (socket activation)

// Device memory (ibv_alloc_dm(3)): memory the daemon allocates and owns,
// reached by the processes of its context through a mapping of its memfd and
// by keys of MRs registered over it (RegDmMr). Each user may hold at most
// kMaxDmSize bytes of it, every allocation counted in whole pages; that is
// what ibv_query_device_ex reports as max_dm_size.
constexpr uint64_t kMaxDmSize = 4ull << 20;
constexpr uint32_t kMaxDmLogAlign = 12;  // a DM starts a page of its own

struct AllocDmReq {
  Header h;
  uint64_t length;         // 1..kMaxDmSize
  uint32_t log_align_req;  // at most kMaxDmLogAlign
  uint32_t comp_mask;      // none defined: 0
};

struct DmReply {  // AllocDm, ImportDm
  Header h;
  uint32_t handle;
  uint32_t backing;   // the DM's backing: MR-table entries of MRs over it name it
  uint64_t length;    // the DM's length as allocated
  uint64_t map_size;  // the memfd's size (length rounded up to pages)
};

struct RegDmMrReq {
  Header h;
  uint32_t pd;
  uint32_t dm;
  uint64_t offset;  // into the DM
  uint64_t length;  // offset + length within the DM; 0 allowed (a key for no byte)
  uint32_t access;  // must hold IBV_ACCESS_ZERO_BASED
  uint32_t reserved;
};

struct AllocMwReq {
  Header h;
  uint32_t pd;
  uint32_t type;  // IBV_MW_TYPE_1 or IBV_MW_TYPE_2
};

struct BindMwReq {
  Header h;
  uint32_t mw;       // window handle
  uint32_t qpn;      // the binding QP (type 2: the QP the window is bound to)
  uint32_t mr_key;   // 0 with length 0: unbind (type 1)
  uint32_t new_key;  // type 2: the key the application chose (same index); type 1: ignored
  uint64_t addr;
  uint64_t length;
  uint32_t access;
  uint32_t reserved;
};

struct KeyReply {  // AllocMw, BindMw
  Header h;
  uint32_t handle;
  uint32_t key;
};

struct InvalidateReq {
  Header h;
  uint32_t key;
  uint32_t qpn;     // the caller's QP
  uint32_t remote;  // 1: SEND_WITH_INV: the window belongs to the QP's peer
  uint32_t reserved;
};

struct ClaimSocketReq {
  Header h;
  uint64_t inode;
};

struct QueryMrReply {
  Header h;
  uint32_t pd;
  uint32_t key;
  uint64_t addr;
  uint64_t length;
  uint32_t access;
  uint32_t reserved;
};

struct ImportCqReply {
  Header h;
  uint32_t capacity;
  uint32_t channel;  // the CQ's completion channel, 0 if none
  uint64_t segment_size;
};

struct ImportQpReply {
  Header h;
  uint32_t pd;
  uint32_t send_cq;
  uint32_t recv_cq;
  uint32_t qp_type;
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t sq_sig_all;
  uint32_t reserved;
  uint64_t segment_size;
};

constexpr size_t kMaxShmidLen = 64;

struct RegShmidReq {
  Header h;
  uint32_t pd;
  uint32_t access;
  uint64_t length;
  uint64_t iova;       // where the caller mapped... 0: the reply says the size, map, then RegMr
  uint32_t id_len;
  uint8_t id[kMaxShmidLen];
  uint32_t reserved;
};

struct RegShmidReply {
  Header h;
  uint32_t backing;   // the region as a backing file of this context
  uint32_t created;   // 1 if this call created the region
  uint64_t length;    // the region's size
};

struct RegSharedReq {
  Header h;
  uint32_t key;       // the existing MR
  uint32_t pd;
  uint64_t iova;      // the new registration's address
  uint32_t access;
  uint32_t reserved;
};

// Locked memory charged for registrations (RLIMIT_MEMLOCK, as the kernel
// charges pinned pages), per registering process.
struct AccountEntry {
  uint32_t pid;
  uint32_t uid;
  uint64_t locked_bytes;
  uint64_t limit_bytes;  // UINT64_MAX: unlimited (RLIM_INFINITY or CAP_IPC_LOCK)
};
constexpr size_t kMaxAccounts = 32;

struct AccountsReply {
  Header h;
  uint32_t count;  // entries used; processes beyond kMaxAccounts are summed into `others_bytes`
  uint32_t reserved;
  uint64_t others_bytes;
  AccountEntry entries[kMaxAccounts];
};
static_assert(sizeof(AccountsReply) <= kMaxMessage);

// ---- The namespace ----------------------------------------------------------
constexpr size_t kMaxNsName = 128;  // including the terminating NUL
enum NsKind : uint32_t { kNsPd = 1, kNsMr = 2, kNsCq = 3, kNsQp = 4, kNsSrq = 5, kNsChannel = 6 };
constexpr uint32_t kNsRead = 4, kNsWrite = 2;  // as the r and w permission bits

struct NsPublishReq {
  Header h;
  uint32_t kind;
  uint32_t handle;
  uint32_t mode;   // 0..0777
  int32_t group;   // -1: the caller's gid
  char name[kMaxNsName];  // NUL-terminated
};

// NsOpen flags: the caller expects an object of its own user (SVX_OPEN_OWN);
// a name another user published is refused with EPERM.
constexpr uint32_t kNsOwn = 1;

struct NsNameReq {  // NsUnpublish, NsOpen
  Header h;
  uint32_t access;  // NsOpen: kNsRead | kNsWrite
  uint32_t flags;   // NsOpen: kNsOwn; 0 otherwise
  char name[kMaxNsName];
};

struct NsOpenReply {
  Header h;
  uint32_t kind;
  uint32_t handle;
};

struct NsListReq {
  Header h;
  uint32_t reserved[2];
  char after[kMaxNsName];  // the page starts after this name ("": the first)
};

struct NsListEntry {
  char name[kMaxNsName];
  uint32_t kind, handle, uid, gid, mode, reserved;
};
constexpr size_t kNsListPage = 6;

struct NsListReply {
  Header h;
  uint32_t count;  // entries in this page
  uint32_t total;  // entries in the namespace (an indication)
  NsListEntry entries[kNsListPage];
};
static_assert(sizeof(NsListReply) <= kMaxMessage);

// PollCq: a grantee (a process of another user that opened a CQ by name)
// never maps the CQ; the daemon polls it on its behalf, under the CQ's poll
// lock taken with a try-lock (a busy lock answers "nothing now").
constexpr uint32_t kPollCqMax = 16;

struct PollCqReq {
  Header h;
  uint32_t handle;
  uint32_t max;  // 1..kPollCqMax
};

struct PollCqReply {
  Header h;
  uint32_t count;
  uint32_t reserved;
  ibv_wc wc[kPollCqMax];
};
static_assert(sizeof(PollCqReply) <= kMaxMessage);

// ---- Resources (`rdma resource show`, src/nldev/) ---------------------------
// The objects of one kind the caller may see: its own user's, every user's
// for root (uid 0). The daemon serves only processes of its own pid
// namespace, so every pid it reports is one the caller's namespace names.
enum ResKind : uint32_t { kResQp = 1, kResCq = 2, kResMr = 3, kResPd = 4 };

struct ResListReq {
  Header h;
  uint32_t kind;   // kRes*
  uint32_t after;  // the page starts at the first handle above this one (0: the first)
};

// One object. handle: QPN, CQ handle, MR slot (its key's index), PD
// handle. pid: the process that opened its context (0: none left). The
// kind's fields: QP: a = ibv_qp_type, b = ibv_qp_state, c = PD, d = the
// connected QPN, length = its starting SQ PSN << 32 | RQ PSN; CQ: a = capacity, b = references (QPs, SRQs); MR: a = key,
// b = PD, length, iova; PD: b = references (MRs, windows, QPs, SRQs).
struct ResEntry {
  uint32_t handle, pid, uid, context;
  uint32_t a, b, c, d;
  uint64_t length, iova;
};
constexpr size_t kResListPage = 20;

struct ResListReply {
  Header h;
  uint32_t count;  // entries in this page; fewer than kResListPage: the last page
  uint32_t reserved;
  ResEntry entries[kResListPage];
};
static_assert(sizeof(ResListReply) <= kMaxMessage);

// WireCounters: the sums of shm::WireCounter over the QPs the caller may
// see (as ResList: its own user's, every user's for root), the live ones
// and those destroyed since the daemon started.
struct WireCountersReply {
  Header h;
  uint32_t count;  // shm::kWireCounterCount
  uint32_t reserved;
  uint64_t values[16];
};
static_assert(sizeof(WireCountersReply) <= kMaxMessage);

// Counters: the named counters (common/counters.h, counters::kNames' order)
// summed over the QPs the caller may see (as WireCounters: its own user's,
// every user's for root; live and destroyed), and the live ones' own, a
// page at a time by QPN.
constexpr uint32_t kCounterSlots = 24;  // >= counters::kCount
constexpr size_t kCounterPage = 3;
struct CountersReq {
  Header h;
  uint32_t after;  // the page starts at the first QPN above this one (0: the first)
  uint32_t reserved;
};
struct CounterEntry {
  uint32_t qpn, pid, uid, context;  // pid: its context's opener
  uint64_t values[kCounterSlots];
};
struct CountersReply {
  Header h;
  uint32_t count;      // QP entries in this page; fewer than kCounterPage: the last page
  uint32_t ncounters;  // counters::kCount
  uint64_t port[kCounterSlots];
  CounterEntry entries[kCounterPage];
};
static_assert(sizeof(CountersReply) <= kMaxMessage);

template <class T>
inline void init_header(T& m, Op op, uint32_t seq = 0) {
  static_assert(std::is_trivially_copyable_v<T>);
  m.h.magic = kMagic;
  m.h.version = kVersion;
  m.h.op = uint16_t(op);
  m.h.seq = seq;
  m.h.status = 0;
}

}  // namespace sv::proto

// The op table is declared over the messages above; every user of the
// protocol gets it with them.
#include "common/op_table.h"  // IWYU pragma: export
