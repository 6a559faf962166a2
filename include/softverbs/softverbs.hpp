// softverbs.hpp: a C++ RAII layer over the verbs calls softverbs adds for
// sharing (softverbs.h) and the ones they build on.
//
// Contract: each handle owns one process's reference to one object. Its
// destructor is the release path: an object this process created is
// destroyed (for every holder, as verbs define), an imported one is only
// unimported. Handles are movable, not copyable. Errors are returned as
// values (std::nullopt / errno); nothing throws. Thread safety as the
// underlying verbs: all calls are thread-safe.
#pragma once

#include <softverbs/softverbs.h>

#include <cerrno>
#include <optional>
#include <utility>
#include <vector>

namespace softverbs {

namespace detail {
template <class T, int (*Destroy)(T*), void (*Unimport)(T*)>
class Handle {
 public:
  Handle() = default;
  Handle(T* p, bool imported) : p_(p), imported_(imported) {}
  Handle(Handle&& o) noexcept : p_(std::exchange(o.p_, nullptr)), imported_(o.imported_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      imported_ = o.imported_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool imported() const { return imported_; }
  // Gives up this process's reference without destroying the object.
  T* release() { return std::exchange(p_, nullptr); }
  void reset() {
    if (!p_) return;
    if (imported_) Unimport(p_);
    else Destroy(p_);
    p_ = nullptr;
  }

 private:
  T* p_ = nullptr;
  bool imported_ = false;
};

inline int close_device(ibv_context* c) { return ibv_close_device(c); }
inline void close_imported(ibv_context* c) { ibv_close_device(c); }
inline void unimport_pd(ibv_pd* p) { ibv_unimport_pd(p); }
inline void unimport_mr(ibv_mr* m) { ibv_unimport_mr(m); }
inline void unimport_cq(ibv_cq* c) { svx_unimport_cq(c); }
inline void unimport_qp(ibv_qp* q) { svx_unimport_qp(q); }
inline void unimport_srq(ibv_srq* s) { svx_unimport_srq(s); }
}  // namespace detail

using Context = detail::Handle<ibv_context, detail::close_device, detail::close_imported>;
using ProtectionDomain = detail::Handle<ibv_pd, ibv_dealloc_pd, detail::unimport_pd>;
using MemoryRegion = detail::Handle<ibv_mr, ibv_dereg_mr, detail::unimport_mr>;
using CompletionQueue = detail::Handle<ibv_cq, ibv_destroy_cq, detail::unimport_cq>;
using QueuePair = detail::Handle<ibv_qp, ibv_destroy_qp, detail::unimport_qp>;
using SharedReceiveQueue = detail::Handle<ibv_srq, ibv_destroy_srq, detail::unimport_srq>;

// Opens the first device (softverbs' sv0).
inline Context open_first_device() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* c = (list && n > 0) ? ibv_open_device(list[0]) : nullptr;
  if (list) ibv_free_device_list(list);
  return Context(c, false);
}

inline Context import_device(int cmd_fd) { return Context(ibv_import_device(cmd_fd), true); }
inline ProtectionDomain import_pd(ibv_context* c, uint32_t h) { return ProtectionDomain(ibv_import_pd(c, h), true); }
inline MemoryRegion import_mr(ibv_pd* pd, uint32_t h) { return MemoryRegion(ibv_import_mr(pd, h), true); }
inline CompletionQueue import_cq(ibv_context* c, uint32_t h) { return CompletionQueue(svx_import_cq(c, h), true); }
inline QueuePair import_qp(ibv_context* c, uint32_t qpn) { return QueuePair(svx_import_qp(c, qpn), true); }
inline SharedReceiveQueue import_srq(ibv_context* c, uint32_t h) { return SharedReceiveQueue(svx_import_srq(c, h), true); }

// What svx_unpack delivered, each object owned as an imported handle.
struct Unpacked {
  Context context;
  struct Channels {
    std::vector<ibv_comp_channel*> v;
    void push_back(ibv_comp_channel* c) { v.push_back(c); }
    ~Channels() {
      for (auto* c : v) svx_unimport_comp_channel(c);
    }
  } channels;
  std::vector<ProtectionDomain> pds;
  std::vector<MemoryRegion> mrs;
  std::vector<CompletionQueue> cqs;
  // Channels are released by ~Unpacked after the CQs (declared first,
  // destroyed last): svx_unimport_comp_channel refuses while CQs use them.
  std::vector<SharedReceiveQueue> srqs;
  std::vector<QueuePair> qps;  // released first: QPs use the SRQs and CQs
};

// Receives one packed message (svx_unpack) and takes ownership of it all.
// Objects are grouped by type, each group in the sender's order.
inline std::optional<Unpacked> unpack(int sock, int* error = nullptr) {
  ibv_context* c = nullptr;
  svx_object objs[SVX_MAX_PACKED];
  int n = 0;
  int e = svx_unpack(sock, &c, objs, SVX_MAX_PACKED, &n);
  if (error) *error = e;
  if (e) return std::nullopt;
  Unpacked u;
  // Members are destroyed in reverse order of declaration: QPs, CQs, MRs,
  // PDs, then the context, as verbs require.
  u.context = Context(c, true);
  for (int i = 0; i < n; ++i) {
    switch (objs[i].type) {
      case SVX_OBJ_PD: u.pds.emplace_back(objs[i].pd, true); break;
      case SVX_OBJ_MR: u.mrs.emplace_back(objs[i].mr, true); break;
      case SVX_OBJ_CQ: u.cqs.emplace_back(objs[i].cq, true); break;
      case SVX_OBJ_QP: u.qps.emplace_back(objs[i].qp, true); break;
      case SVX_OBJ_SRQ: u.srqs.emplace_back(objs[i].srq, true); break;
      case SVX_OBJ_CHANNEL: u.channels.push_back(objs[i].channel); break;
    }
  }
  return u;
}

}  // namespace softverbs
