// provider.h: the softverbs objects behind the libibverbs ABI structures.
//
// Every public verbs object is allocated as its ABI struct (ibv_pd, ibv_mr,
// ibv_cq_ex, ibv_qp_ex, ...) followed by softverbs state, so a pointer a
// client hands back converts to ours with one cast. Verbs functions return
// errors the way rdma-core documents for each verb.
//
// Thread safety: as libibverbs(7): all verbs are thread-safe. Posting to one
// QP from several threads or processes is serialised by the QP's send lock in
// shared memory; polling one CQ by its poll lock.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <type_traits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/capture_ring.h"
#include "common/access.h"
#include "common/completion.h"
#include "common/device_info.h"
#include "common/paths.h"
#include "common/protocol.h"
#include "common/shm_layout.h"
#include "common/sys.h"
#include "common/verbs_current.h"
#include "verbs/fault_ops.h"

struct svx_object;

namespace sv::verbs {

using shm::Cqe;
using shm::MrEntry;
using shm::QpEntry;

// The device's names and identity: common/device_info.h.
constexpr const char* kDeviceName = dev::kName;
constexpr uint32_t kVendorId = dev::kVendorId;
constexpr uint32_t kVendorPartId = dev::kVendorPartId;
constexpr uint32_t kGidTableLen = dev::kGidTableLen;
// Address handles one context may hold (ibv_device_attr.max_ah, enforced by ibv_create_ah).
constexpr uint32_t kMaxAh = 65536;

// ---- The daemon connection ----------------------------------------------

class DaemonConn {
 public:
  // Connects to the user's daemon of this network namespace, starting it if
  // none answers (common/paths.h); EXDEV if only another namespace's answers.
  int open();
  int fd() const { return sock_.get(); }
  const std::string& dir() const { return dir_; }  // the daemon's directory
  // Receives the async events waiting on the socket without blocking.
  void drain_events();
  // The device fails (a fault plan's device_fatal): the connection is shut
  // down, which the context's watchdog sees, and every later request fails
  // with EIO, as uverbs' commands do after the device is disassociated.
  void fail_device();
  // The id the daemon gave this connection (Hello's or ImportContext's
  // reply); in a forked child, its own connection's, made now. 0 if none.
  uint32_t client_id();
  void set_client_id(uint32_t id) {
    std::lock_guard<std::mutex> g(mu_);
    client_id_ = id;
  }
  // Called (under the connection's lock) for each async event the daemon sends.
  std::function<void(const proto::AsyncEventMsg&)> on_event;

  // Sends `req` (its header is filled in here) and waits for the reply, both
  // typed by the op's declaration (proto::Command<op>, common/protocol.h),
  // which also says how many descriptors go each way. Returns the transport
  // error, else the reply's status; EBADF (nothing sent) for descriptors the
  // op does not take; EPROTO for a reply whose descriptors are not as
  // declared. The reply's descriptors go to `recv_fds` (closed if null).
  template <proto::Op op>
  int call(typename proto::Command<op>::Req& req, typename proto::Command<op>::Rep& rep,
           std::span<const int> send_fds = {}, std::vector<Fd>* recv_fds = nullptr) {
    using C = proto::Command<op>;
    if (!C::info.in.allows(send_fds.size())) return EBADF;
    proto::init_header(req, op);
    std::vector<Fd> fds;
    if (int e = raw_call(&req, sizeof(req), &rep, sizeof(rep), send_fds, &fds)) return e;
    if (!proto::reply_matches<C>(rep, fds.size())) return EPROTO;
    if (recv_fds) *recv_fds = std::move(fds);
    return 0;
  }

  // One request of a batch (call_batch): typed as call() types it.
  struct Batched {
    void* req;
    size_t req_len;
    void* rep;
    size_t rep_len;
    std::span<const int> send_fds;
    std::vector<Fd>* recv_fds;  // the reply's descriptors; closed if null
    bool (*matches)(const void* rep, size_t nfds);  // the op's reply declaration
    bool optional = false;  // its failure is its own (status), not the batch's
    int status = 0;         // filled in by call_batch: as call() would return it
  };
  template <proto::Op op>
  static Batched batched(typename proto::Command<op>::Req& req, typename proto::Command<op>::Rep& rep,
                         std::span<const int> send_fds = {}, std::vector<Fd>* recv_fds = nullptr) {
    using C = proto::Command<op>;
    proto::init_header(req, op);
    return {&req, sizeof req, &rep, sizeof rep, send_fds, recv_fds,
            [](const void* r, size_t n) {
              return proto::reply_matches<C>(*static_cast<const typename C::Rep*>(r), n);
            }};
  }
  // Sends every request of `calls` before it waits for the first reply, so
  // that a connection's set-up costs one round trip, not one per request;
  // the daemon serves them in order, as if called one after the other.
  // Each call's status is filled in; returns the first failure of a call
  // not `optional` (ENODEV and the like for a call that never went out),
  // else 0.
  int call_batch(std::span<Batched> calls);

  // Sends `req` and waits for nothing: an op the daemon never answers
  // (Op::MediatePost). The connection orders it with every other request:
  // a later call's reply means the daemon has run it. 0 or the send's error.
  template <proto::Op op>
  int post(typename proto::Command<op>::Req& req) {
    proto::init_header(req, op);
    return raw_post(&req, sizeof(req));
  }

  // As call() without descriptors, but runs `work()` (returning int, into
  // `*work_result`) after the request is sent and before the reply is
  // awaited, the connection held meanwhile: the caller's own work overlaps
  // the daemon's (a registration converts its pages while the daemon
  // records it). `*work_result` is left alone when nothing was sent.
  template <proto::Op op, class F>
  int call_during(typename proto::Command<op>::Req& req, typename proto::Command<op>::Rep& rep, F&& work,
                  int* work_result) {
    using C = proto::Command<op>;
    proto::init_header(req, op);
    std::vector<Fd> fds;
    Work w{[](void* f) { return (*static_cast<std::remove_reference_t<F>*>(f))(); }, &work, work_result};
    if (int e = raw_call(&req, sizeof(req), &rep, sizeof(rep), {}, &fds, &w)) return e;
    if (!proto::reply_matches<C>(rep, fds.size())) return EPROTO;
    return 0;
  }

 private:
  struct Work {
    int (*run)(void*);
    void* ctx;
    int* result;
  };
  int raw_post(void* req, size_t req_len);
  int send_locked(void* req, size_t req_len, std::span<const int> send_fds);
  int raw_call(void* req, size_t req_len, void* rep, size_t rep_len, std::span<const int> send_fds,
               std::vector<Fd>* recv_fds, const Work* work = nullptr);
  int raw_call_locked(void* req, size_t req_len, void* rep, size_t rep_len, std::span<const int> send_fds,
                      std::vector<Fd>* recv_fds, const Work* work);
  // With mu_ held: waits for the reply to request `seq` (async events on the
  // way dispatched); its status, or the transport's error (then *broken is
  // set, when given: no later reply can be read).
  int recv_reply_locked(uint32_t seq, void* rep, size_t rep_len, std::vector<Fd>* recv_fds, bool* broken);
  // The request ring (Op::PostRing, daemon/post_ring.h): pipelined requests
  // go there instead of the socket once the daemon gave one; with mu_ held.
  struct PostRing {
    Mapping map;
    Fd efd;  // the ring's wake-up socket (ours to signal)
    proto::PostRingHeader* hdr = nullptr;
    uint8_t* slots = nullptr;
    uint32_t capacity = 0;
    uint64_t tail = 0;  // ours: the daemon never writes it
  };
  void open_ring_locked();
  int ring_push_locked(const void* req, size_t req_len);
  std::unique_ptr<PostRing> ring_;
  bool ring_refused_ = false;  // the daemon gave none: the socket it is
  bool dispatch_event(const uint8_t* buf, size_t len);
  // In a child forked after open(): a connection of its own, joined to the
  // same context (the inherited socket is its parent's).
  int reattach_after_fork();
  int connect_dir(const RunDir& dir, bool system, bool may_start);
  std::string dir_;
  Fd sock_;
  Fd inherited_;  // a forked child: its parent's socket, kept open (the context's cmd_fd names it)
  std::mutex mu_;
  uint32_t seq_ = 0;
  // e, after saying why once when the daemon would not serve us: its
  // connection closed on the first request (seq 1) of the connection.
  int refused(int e, uint32_t seq) const;
  int take_refusal(const uint8_t* buf, size_t len) const;
  uint32_t owner_pid_ = 0;  // the process whose connection sock_ is
  std::atomic<bool> failed_{false};  // fail_device()
  uint32_t client_id_ = 0;
};

// ---- A CQ ring as a producer sees it (local or a peer's) -------------------

struct ContextState;

// One mapped CQ segment. A resized CQ gets a new segment; the old ones stay
// mapped until the view dies, since another thread may still be reading them.
struct CqSegment {
  Mapping map;
  shm::CqSegmentHeader* hdr = nullptr;
  shm::Ring<Cqe> ring;
};

struct CqView {
  ContextState* cs = nullptr;  // the connection to fetch a moved segment on
  uint32_t handle = 0;         // the daemon's CQ handle
  int channel_fd = -1;  // the channel's wake-up socket to signal when armed (borrowed or owned by `channel_owned`)
  Fd channel_owned;

  int attach(int fd, uint64_t size);  // maps a CQ segment and makes it current
  shm::CqSegmentHeader* hdr() const { return cur.load(std::memory_order_acquire)->hdr; }
  shm::Ring<Cqe>& ring() const { return cur.load(std::memory_order_acquire)->ring; }
  // Appends a completion and raises the CQ's event if it is armed; follows
  // a resize. Returns false on overrun (the ring is full; IBTA 11.4.2.1 CQ
  // overrun), after reporting the CQ error to the daemon.
  // `clear`: see shm::push_completion.
  bool push(const ibv_wc& wc, bool solicited, shm::OwedRecord clear = {});
  // Takes up to n of the oldest completions (one: pop); follows a resize.
  int poll(Cqe* out, int n);
  // As poll(), the work completions only, straight into `out` (ibv_poll_cq).
  int poll_wc(ibv_wc* out, int n);
  bool pop(Cqe& out);
  // A hint: start taking the slot the next push fills (see Ring::prefetch_next_push).
  void prefetch_push() const { cur.load(std::memory_order_acquire)->ring.prefetch_next_push(); }
  // After a resize committed (hdr()->moved): maps the CQ's current segment.
  bool follow(CqSegment* from);

  std::atomic<CqSegment*> cur{nullptr};
  std::atomic<bool> error_reported{false};  // CqError sent (the daemon acts once per CQ anyway)
  std::mutex mu;  // guards segs
  std::vector<std::unique_ptr<CqSegment>> segs;
};

// ---- Objects ---------------------------------------------------------------

struct Context;
struct DmahState;  // ibv_alloc_dmah (mr_ex.cc)
struct Cq;

// A thread domain (ibv_alloc_td(3)): objects created in a parent domain
// that has one are used by one thread at a time, the application promises,
// so they may skip their locks.
struct Td {
  ibv_td td;
  std::atomic<uint32_t> users;  // parent domains holding it
};

struct Pd {
  ibv_pd pd;
  uint32_t handle;
  // A parent domain (ibv_alloc_parent_domain(3)) stands for the protection
  // domain `protection` (and carries its daemon handle) with thread domain
  // `td` (or none); it exists in this process only.
  Pd* protection;
  Td* td;
  std::atomic<uint32_t> parents;  // parent domains over this PD
};

struct Mr {
  ibv_mr mr;
  uint32_t handle;
  void* reg_addr;   // what MemBacking acquired
  size_t reg_len;
  void* map_addr;   // a mapping the library made for this MR (shared regions), unmapped at dereg
  size_t map_len;
  DmahState* dmah;  // the DMA handle it was registered with (ibv_reg_mr_ex), counted
};

struct Ah {
  ibv_ah ah;
  ibv_ah_attr attr;
};

struct Channel {
  ibv_comp_channel ch;  // ch.fd: the reading end of its wake-up pair (sys.h)
  int wake;             // the signalled end (owned; closed with the channel)
  uint32_t handle;
  Context* ctx;
  // Adaptive spinning in ibv_get_cq_event: how many waits in a row the spin
  // did not catch (then spinning pauses; see cq.cc).
  uint32_t spin_misses;
  uint32_t waits;
};

struct CqState {
  Context* ctx;
  uint32_t handle;
  Channel* channel;
  ibv_cq* ibcq = nullptr;
  CqView view;
  // Extended polling (ibv_start_poll): the completion being read, and when
  // it was taken from the ring (the completion timestamp softverbs reports).
  Cqe cur{};
  uint64_t cur_ns = 0;
  // A QP on the wire completes into this CQ: polling it also receives and
  // progresses the wire QPs (roce_poll, docs/ROCE.md).
  std::atomic<bool> wire{false};
  // Another user's CQ granted by name (svx_open): nothing of it is mapped
  // here (`view` is empty); the daemon polls it for this process (PollCq).
  bool granted = false;
  // QPs destroyed by this process whose completions may still wait in the
  // ring, or be on their way to it from a peer that took a receive before
  // the destroy: pollers drop them (cq.cc, forget_qp_completions). `gone_n`
  // is read on every poll, the list only while it is not 0.
  struct GoneQp {
    uint32_t qpn;
    uint64_t since_ns;
  };
  std::atomic<uint32_t> gone_n{0};
  std::mutex gone_mu;
  std::vector<GoneQp> gone;
  uint32_t plan_ordinal = 0;  // the process's n-th CQ, for a fault plan's cq_err (fault_events.h)
};

struct Cq {
  ibv_cq_ex cq;  // ibv_cq at offset 0
  CqState* st;
};

// A connected peer QP on this host, as the requester sees it.
struct Peer {
  // What every post reads comes first.
  uint32_t qpn;
  uint32_t pd = 0;  // XRC: the PD receive buffers are checked against (the SRQ's); 0: the QP's
  const QpEntry* entry;
  // The peer belongs to another user: nothing of it is mapped here, and each
  // operation goes through the daemon (requester_daemon.cc execute_mediated).
  // Its QP entry is in its own user's device segment, not ours: `entry` is
  // null, and min_rnr_timer comes from the daemon's ConnectPeer reply.
  bool mediated = false;
  uint8_t min_rnr_timer = 0;
  Mapping seg;
  shm::QpSegmentHeader* hdr;
  shm::Ring<shm::RecvWqe> rq;
  CqView recv_cq;
  // The peer's SRQ, if its receives come from one.
  Mapping srq_seg;
  shm::SrqSegmentHeader* srq_hdr = nullptr;
  shm::Ring<shm::RecvWqe> srq;
  uint32_t srq_handle = 0;
  std::vector<Mapping> srq_old;  // segments the SRQ was resized away from (srq.cc follow_peer_srq)
};

// One segment of an SRQ: resizing (ibv_modify_srq with IBV_SRQ_MAX_WR)
// moves it to a new one; the old ones stay mapped until the handle goes,
// for threads still looking at them.
struct SrqSegment {
  Mapping seg;
  shm::SrqSegmentHeader* hdr = nullptr;
  shm::Ring<shm::RecvWqe> ring;
};

struct SrqState {
  Context* ctx;
  uint32_t handle;
  std::atomic<SrqSegment*> cur{nullptr};
  std::mutex mu;  // resizing and following
  std::vector<std::unique_ptr<SrqSegment>> segs;
  uint32_t max_sge;
  uint32_t srq_type = IBV_SRQT_BASIC;
  SrqSegment& now() const { return *cur.load(std::memory_order_acquire); }
  uint32_t plan_ordinal = 0;  // the process's n-th SRQ, for a fault plan's srq_limit (fault_events.h)
};

// The segment of an SRQ that has moved on from `from` (GetSrq); false if
// the daemon does not give it.
bool follow_srq(SrqState& st, SrqSegment* from);
void follow_if_moved(SrqState& st);

struct Srq {
  ibv_srq srq;
  SrqState* st;
};

// A view of another process's registered memory, by key.
struct Window {
  uint32_t key;
  uint32_t generation;  // of the key's entry when it was mapped
  uint64_t file_base;   // file offset mapped at `map.get()`
  Mapping map;
  uint8_t* at(uint64_t file_offset) const { return map.as<uint8_t>() + (file_offset - file_base); }
  // Is it a view of the key's entry as it is now? An MR re-registered in
  // place (ibv_rereg_mr keeps its keys) may have moved in its file, or to
  // another one; the daemon changes the generation on every write.
  bool current(uint32_t k, const MrEntry& e) const { return key == k && generation == e.generation; }
};

struct QpOps;  // transport.h

// This process's state of one QP: its rings, its peer and the requester's
// progress. Owned by the QpHandle the application holds (self points back).
struct ProcessQp {
  // What every post reads comes first, on two cache lines.
  Context* ctx;
  uint32_t qpn;
  ibv_qp_type type;
  Pd* pd;
  Cq* send_cq;
  const QpEntry* entry;
  shm::QpSegmentHeader* hdr;
  shm::Ring<shm::SendWqe> sq;
  ibv_qp_cap cap;
  bool sq_sig_all;
  // Created in a thread domain: posts skip the send lock unless the progress
  // thread has the QP (in_progress_list). Such a QP cannot be imported.
  bool lockless = false;
  std::atomic<bool> on_wire{false};  // RoCEv2: the engine in roce_link.cc carries this QP's sends
  std::atomic<uint8_t> roce_lane{0};  // which RoCE thread (roce_link.cc's lane) serves it, once on_wire
  bool block_self_mcast = false;     // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: no multicast to itself
  // Requester state, guarded by hdr->send_lock.
  std::unique_ptr<Peer> peer;
  std::shared_ptr<Window> last_window;
  // The last RDMA WRITE's key and (address -> pointer) offset: only a hint,
  // to start fetching the next target line for writing before the checks
  // that translate its address for real (requester.cc fast_post). Written
  // under the send lock, read before it (relaxed: a stale hint costs only
  // a useless prefetch).
  std::atomic<uint32_t> hint_rkey{0};
  std::atomic<uintptr_t> hint_delta{0};
  // The path its send work requests take, chosen at create, modify (RTR,
  // RESET) and peer connection (transport.h choose_transport). Read by
  // every post, next to the hints (which a WRITE reads too).
  std::atomic<const QpOps*> ops{nullptr};

  Cq* recv_cq;
  Srq* srq = nullptr;
  Mapping seg;
  shm::Ring<shm::RecvWqe> rq;

  std::mutex attr_mu;  // guards attr
  ibv_qp_attr attr{};

  // More requester state, guarded by hdr->send_lock.
  std::map<uint32_t, std::unique_ptr<Peer>> ud_peers;  // UD destinations by QPN; XRC_SEND: by remote SRQ number
  uint32_t rnr_left = 0;     // RNR retries left for the WQE at the head
  uint32_t retry_left = 0;   // transport retries left
  bool head_started = false;
  // Completions in error from the process's fault plan (fault_ops.h):
  // null unless the plan names this QP.
  std::unique_ptr<QpFaults> faults;
  // A key of the request being carried out named on-demand-paging memory
  // (requester.cc stops there, requester_odp.cc takes the request).
  bool odp_seen = false;
  uint64_t next_try_ns = 0;
  // Pipelined requests to another user's QP (requester_daemon.cc): a run
  // ended with requests sent back unexecuted (RNR, responder not ready);
  // the head goes through the daemon alone, with its retry timer, until done.
  bool med_sync_head = false;
  uint64_t med_asked_ns = 0;  // when the daemon was last asked whether a dead sender's run can still finish
  std::atomic<bool> in_progress_list{false};  // read by posters, written by the progress thread
  struct QpHandle* self = nullptr;

  // Extended QPs (qp_ex.cc): the IBV_QP_EX_WITH_* ops allowed, 0 for a QP
  // not created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, and the batch being
  // built between ibv_wr_start and ibv_wr_complete/abort.
  uint64_t send_ops = 0;
  std::shared_ptr<struct WrBatch> batch;

  // Capture (capture.h), under the send lock: the PSN and the responder's
  // MSN of the packets rendered, from the QP's SQ PSN at its first one.
  uint32_t cap_psn = 0, cap_msn = 0;
  bool cap_started = false;
};

// What ibv_create_qp returns to the application: the ibv_qp_ex it holds,
// in today's layout (abi::QpExCurrent: rdma-core v64 appends wr_flush to
// v44's struct, and a program built against it calls through that member),
// and this process's state of the QP.
struct QpHandle {
  ibv_qp_ex qpx;            // ibv_qp at offset 0; up to wr_atomic_write
  abi::WrFlushFn wr_flush;  // abi::QpExCurrent::wr_flush
  ProcessQp* st;
};
static_assert(offsetof(QpHandle, wr_flush) == offsetof(abi::QpExCurrent, wr_flush) &&
                  offsetof(QpHandle, qpx) == offsetof(abi::QpExCurrent, v44),
              "the application's ibv_qp_ex has v64's layout");

struct AsyncQueue {
  std::mutex mu;
  std::deque<ibv_async_event> events;
  // Events from the daemon, not yet matched to this process's handles (the
  // match takes the context lock, which the connection lock must not wait for).
  std::deque<proto::AsyncEventMsg> raw;
};

struct ContextState {
  ~ContextState();
  DaemonConn conn;
  // Set when the daemon is gone (IBV_EVENT_DEVICE_FATAL): every later verb fails.
  std::atomic<bool> dead{false};
  std::thread watchdog;
  Fd watchdog_stop;
  // The daemon sends a byte here when another process leaves the context
  // (Op::Wake): the watchdog then gives this process's progress thread the
  // QPs that process may have left work on (progress_adopt).
  Fd wake;
  // Capture (capture.h): the ring this user's `softverbs capture` made, while
  // it is there; the rings mapped, with when each was retired (unmapped a
  // second later, at a later change); its path; and the watchdog's inotify
  // descriptor on /dev/shm. capture_rings is guarded by mu.
  std::atomic<capture::Ring*> capture{nullptr};
  std::vector<std::pair<std::unique_ptr<capture::Ring>, uint64_t>> capture_rings;
  std::string capture_path;
  Fd capture_watch;
  uint64_t boot_id = 0;
  Mapping device_map;
  // A file of this user's (its device segment, or a lock file in /dev/shm),
  // opened by this process: the flock(2) that RDMA atomics on
  // on-demand-paging memory take (requester_odp.cc, context.cc
  // open_odp_lock). -1 if none could be opened.
  Fd odp_lock;
  const MrEntry* mr_table = nullptr;
  const QpEntry* qp_table = nullptr;
  const shm::McgEntry* mcg_table = nullptr;
  // The context's async fd (ibv_context::async_fd, polled and read by the
  // application) and the other end of its wake-up pair (sys.h), signalled
  // by the daemon (RegAsync) and by this library.
  Fd async_fd;
  Fd async_wake;
  AsyncQueue async;
  std::atomic<uint32_t> ahs{0};  // address handles held (at most kMaxAh)

  std::mutex mu;  // guards the maps below
  uint32_t backing = 0;  // this process's backing file as registered on this connection
  uint32_t backing_pid = 0;  // the process that registered it (a forked child has its own)
  std::map<uint32_t, Fd> foreign_backings;                      // backing id -> fd
  std::unordered_map<uint32_t, std::shared_ptr<Window>> windows;  // key -> window
  std::vector<CqState*> cqs;
  // This process's handles of the context's objects, for import and
  // resolution (svx_resolve_qp): daemon handle -> local object.
  std::map<uint32_t, Pd*> pds;
  std::map<uint32_t, Cq*> cq_handles;
  std::map<uint32_t, QpHandle*> qp_handles;
  std::map<uint32_t, ibv_srq*> srq_handles;
  std::map<uint32_t, Channel*> channel_handles;
  // Backing files this process has mapped itself (named regions): backing id
  // -> (base address, file offset of base).
  std::map<uint32_t, std::pair<uint8_t*, uint64_t>> local_views;

  const MrEntry* mr(uint32_t key) const {
    return access::lookup(key, [this](uint32_t slot) -> const MrEntry& { return mr_table[slot]; });
  }
  const QpEntry* qp_slot(uint32_t qpn) const { return &qp_table[qpn & (shm::kQpTableSize - 1)]; }
};

// Laid out as rdma-core v64's verbs_context (sv::abi::VerbsContextCurrent):
// the ops added since v44 sit before v44's verbs_context, and v.sz counts
// them, so a client's verbs_get_ctx_op() of either release finds its ops.
struct Context {
  abi::VerbsContextV64Ops v64;
  verbs_context v;  // v.context is what clients hold
  ContextState* st;
};
static_assert(offsetof(Context, v) == offsetof(abi::VerbsContextCurrent, v44));

inline Context* to_ctx(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(Context, v) -
                                    offsetof(verbs_context, context));
}
inline ContextState& ctx_state(ibv_context* c) { return *to_ctx(c)->st; }
inline Pd* to_pd(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
inline Td* to_td(ibv_td* t) { return reinterpret_cast<Td*>(t); }
inline Mr* to_mr(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
inline Cq* to_cq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline QpHandle* to_qp(ibv_qp* q) { return reinterpret_cast<QpHandle*>(q); }
inline Channel* to_channel(ibv_comp_channel* c) { return reinterpret_cast<Channel*>(c); }

// After the device is gone (daemon dead), destroying an object frees this
// process's side of it and succeeds, as rdma-core allows destroys after a
// device disassociation; otherwise the daemon's answer stands.
inline int destroy_result(const ContextState& st, int e) { return (e && st.dead.load()) ? 0 : e; }

// ---- Internal entry points shared between files ----------------------------

// Thread and parent domains (mr.cc)
ibv_td* alloc_td(ibv_context* c, ibv_td_init_attr* attr);
int dealloc_td(ibv_td* td);
ibv_pd* alloc_parent_domain(ibv_context* c, ibv_parent_domain_init_attr* attr);

// Device memory (dm.cc; ibv_alloc_dm(3))
ibv_dm* alloc_dm(ibv_context* c, ibv_alloc_dm_attr* attr);
int free_dm(ibv_dm* dm);
ibv_mr* reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned int access);

// Context (context.cc)
ibv_context* open_context(ibv_device* dev);
// Opens a context on a new daemon connection. With import_fd >= 0 it joins
// the context whose command socket that is (ibv_import_device); with `ns`
// it joins the context of a published object (svx_open) and fills ns->rep.
struct NsAttach {
  const char* name;
  uint32_t access;
  proto::NsOpenReply rep;
  uint32_t flags = 0;  // proto::kNsOwn
};
ibv_context* make_context(int import_fd, NsAttach* ns = nullptr);
// Imports one object of a shared context into this process (sharing.cc).
int import_object(ibv_context* c, uint32_t type, uint32_t handle, ::svx_object& obj);
int close_context(ibv_context* ctx);
int query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len);
int query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* in, ibv_device_attr_ex* attr,
                    size_t attr_size);
void push_async_event(ContextState& st, const ibv_async_event& ev);
void start_watchdog(ContextState& st);

void fill_device_attr(ibv_device_attr& a);

// Registration and DMA handles of IBVERBS_1.15-1.17 (mr_ex.cc), the
// verbs_context ops v64 added; reg_mr is ibv_reg_mr_iova2's (mr.cc).
ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access);
ibv_mr* reg_odp_mr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access, uint32_t flags = 0);
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge);
ibv_mr* reg_mr_ex(ibv_pd* pd, abi::MrInitAttr* attr);
ibv_mr* reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
abi::Dmah* alloc_dmah(ibv_context* c, abi::DmahInitAttr* attr);
int dealloc_dmah(abi::Dmah* dmah);
void release_dmah(DmahState* dmah);  // an MR registered with it is gone
void* alloc_buf(ibv_pd* pd, size_t size, abi::Buf** buf);
void free_buf(abi::Buf* buf);
int dm_export_dmabuf_fd(ibv_dm* dm);

// CQs (cq.cc)
int poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
ibv_cq* create_cq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector);
ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
int resize_cq(ibv_cq* cq, int cqe);
void clean_cq(ibv_cq* cq, uint32_t qpn);  // a QP reset: its waiting completions go
void forget_qp_completions(Cq* cq, uint32_t qpn);  // a QP destroyed: its completions go, now and later
void keep_qp_completions(Cq* cq, uint32_t qpn);    // a new QP of that number

// QPs (qp.cc, requester.cc)
ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
// post_send for ibv_wr_complete: every WR of the chain is checked, and room
// for all of them in the send queue, before any runs; on error none was posted.
int post_send_all(ibv_qp* qp, ibv_send_wr* wr);
// Extended QPs (qp_ex.cc): the supported IBV_QP_EX_WITH_* ops of a QP type,
// and filling in the ibv_wr_* builders of a QP created with send_ops_flags.
uint64_t supported_send_ops(ibv_qp_type type);
void init_qp_ex(QpHandle* qp, uint64_t send_ops);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
int resize_srq(SrqState& st, uint32_t max_wr, uint32_t limit);
bool push_after_resize(SrqState& st, const ibv_recv_wr& wr, uint32_t num_sge);
// Runs the QP's queued work requests; returns true while some remain queued.
bool progress_qp(ProcessQp& qp);
void flush_qp(ProcessQp& qp);
// The QP to ERR (the daemon's table, ibv_qp::state), then its queues flushed.
void move_to_error(ProcessQp& qp);
// Its halves: the QP's state is ERR (its queues untouched); its send and
// receive queues flushed.
void enter_error_state(ProcessQp& qp);
void flush_queues(ProcessQp& qp);
void progress_register(ProcessQp* qp);
void progress_unregister(ProcessQp* qp);
// Processes `gone` left the context: every QP this process holds that has
// work waiting (queued requests, a torn receive, a request whose executor
// died, a pipelined run) and whose queue one of them (or a dead process)
// carried last goes to this process's progress thread, which carries it
// out or completes it, as the next post would.
void progress_adopt(ContextState& st, std::span<const uint32_t> gone);

inline QpHandle* to_qp_from_state(ProcessQp& q) { return q.self; }
ibv_wc_opcode send_wc_opcode(uint32_t op);
void flush_sq_locked(ProcessQp& q);
// With the send lock held: completes in error a request whose previous
// holder of the lock died carrying it out (sq_running, requester.cc).
void complete_dead_run(ProcessQp& q);
// SOFTVERBS_TEST_DIE, read at load (srq.cc): 0, or where a test kills this process.
extern const int g_die_at;
void flush_rq(ProcessQp& q);
void flush_peer_rq(Peer& p);

// Receive side of a peer (srq.cc): the next receive WQE from its RQ or SRQ
// (raising the SRQ limit event when it falls below the armed limit), and
// mapping the peer's segments from a ConnectPeer/ConnectUd reply.
bool pop_peer_recv(ProcessQp& q, Peer& p, shm::RecvWqe& out);
int attach_peer(ContextState& cs, Peer& p, const proto::ConnectPeerReply& rep, std::vector<Fd>& fds);

// This process's handle of a PD / CQ (created here or imported): allocated,
// filled in, and registered in the context's maps. NULL with errno on failure.
ibv_pd* new_pd_handle(ibv_context* c, uint32_t handle);
// This process's handle of PD `handle` of a shared context, imported if needed.
ibv_pd* import_pd_handle(ibv_context* c, uint32_t handle);
ibv_srq* new_srq_handle(ibv_pd* pd, uint32_t handle, uint32_t max_sge, void* srq_context, int fd, uint64_t size);
ibv_cq* new_cq_handle(ibv_context* c, std::unique_ptr<CqState> st, uint32_t capacity, ibv_comp_channel* channel,
                      void* cq_context);

// This process's handle of an MR (registered here, imported, or over a
// named region); NULL on allocation failure. `reg_addr`/`map_addr` stay
// unset: the caller says what, if anything, dereg must release.
Mr* new_mr_handle(ibv_pd* pd, void* addr, size_t length, uint32_t handle, uint32_t key);

// A receive work request as it sits in a receive queue ring. Only the
// header and the num_sge SGEs in use are filled in, and only those travel
// through the ring (recv_wqe_bytes): a one-SGE receive is one cache line
// for the sender to read, not the five of a full RecvWqe.
inline size_t recv_wqe_bytes(uint32_t num_sge) {
  return offsetof(shm::RecvWqe, sge) + size_t(std::min(num_sge, shm::kMaxSge)) * sizeof(shm::Sge);
}
inline void to_recv_wqe(const ibv_recv_wr& wr, shm::RecvWqe& w) {
  w.wr_id = wr.wr_id;
  w.num_sge = uint32_t(wr.num_sge);
  w.reserved = 0;
  for (int i = 0; i < wr.num_sge; ++i) w.sge[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
}
// Pushes receive `wr` into `ring`, written straight into the slot (no
// RecvWqe built on the stack and copied in: fewer instructions per post).
// `num_sge` is the count the caller validated (at most kMaxSge), read from
// `wr` once: the application may not change it under us and make us write
// past the slot.
inline bool push_recv_wqe(shm::Ring<shm::RecvWqe>& ring, const ibv_recv_wr& wr, uint32_t num_sge) {
  return ring.push_write_then(
      [&wr, num_sge](shm::RecvWqe& w) {
        w.wr_id = wr.wr_id;
        w.num_sge = num_sge;
        w.reserved = 0;
        for (uint32_t i = 0; i < num_sge; ++i) w.sge[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
      },
      [] {});
}
// Copies a receive WQE out of a ring slot, its used part only. num_sge is
// read once: the slot is in memory the poster's peers can write, and the
// copy must not depend on a value that changes under it.
inline void copy_recv_wqe(shm::RecvWqe& out, const shm::RecvWqe& slot) {
  std::memcpy(&out, &slot, offsetof(shm::RecvWqe, sge));
  std::memcpy(out.sge, slot.sge, recv_wqe_bytes(out.num_sge) - offsetof(shm::RecvWqe, sge));
}

// Sharing (sharing.cc, qp.cc)
int attach_qp_segment(ProcessQp& q, int fd, uint64_t size);
Cq* import_cq_handle(ibv_context* c, uint32_t handle);
ibv_qp* import_qp_num(ibv_context* c, uint32_t qpn);

// Multicast (mcast.cc): the QPs attached to the group of a multicast GID
// (or, with gid NULL, LID), read from the daemon's table in shared memory.
// False when no such group exists.
bool mcast_members(const ContextState& cs, const uint8_t* gid, uint16_t lid, std::vector<uint32_t>& out);

// XRC (xrc.cc): the verbs_context ops, and the XRC domain handle of an ibv_xrcd.
ibv_xrcd* open_xrcd(ibv_context* c, ibv_xrcd_init_attr* attr);
int close_xrcd(ibv_xrcd* x);
ibv_srq* create_srq_ex(ibv_context* c, ibv_srq_init_attr_ex* attr);
int get_srq_num(ibv_srq* srq, uint32_t* num);
ibv_qp* open_qp(ibv_context* c, ibv_qp_open_attr* attr);
uint32_t xrcd_handle(ibv_xrcd* x);
// An SRQ of any type (srq.cc); NULL with errno on failure.
ibv_srq* create_srq(ibv_context* c, ibv_pd* pd, ibv_srq_attr& attr, void* srq_context, uint32_t type,
                    uint32_t xrcd, ibv_cq* cq);

// Memory windows (mw.cc)
ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw(ibv_mw* mw);
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind);
int daemon_bind(ProcessQp& q, uint32_t mw_handle, uint32_t new_key, const ibv_mw_bind_info& b, uint32_t* key_out);

// Memory (mr.cc)
int get_backing(ContextState& st);  // registers the process backing on this connection

// Remote memory resolution (peer.cc)
std::shared_ptr<Window> window_for(ContextState& st, const MrEntry& e, uint32_t key);

}  // namespace sv::verbs
