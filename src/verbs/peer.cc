// Reaching other processes' registered memory: a key's MR entry names the
// backing file that holds it; the daemon hands this process the file if the
// key is one it may use, and the MR's pages are mapped once and cached.
#include <sys/mman.h>

#include <cerrno>

#include "verbs/provider.h"

namespace sv::verbs {

std::shared_ptr<Window> window_for(ContextState& st, const MrEntry& e, uint32_t key) {
  std::lock_guard<std::mutex> g(st.mu);
  if (auto it = st.windows.find(key); it != st.windows.end() && it->second->current(key, e)) return it->second;
  uint32_t backing = e.backing;
  uint32_t generation = e.generation;
  uint64_t file_offset = e.file_offset;
  uint64_t length = e.length;
  auto b = st.foreign_backings.find(backing);
  if (b == st.foreign_backings.end()) {
    proto::GetMrBackingReq req{};
    req.key = key;
    proto::GetMrBackingReply rep{};
    std::vector<Fd> fds;
    if (st.conn.call<proto::Op::GetMrBacking>(req, rep, {}, &fds) != 0) return nullptr;
    if (rep.backing != backing) return nullptr;  // the key was reused meanwhile
    b = st.foreign_backings.emplace(backing, std::move(fds[0])).first;
  }
  auto w = std::make_shared<Window>();
  w->key = key;
  w->generation = generation;
  w->file_base = page_down(file_offset);
  uint64_t end = page_up(file_offset + length);
  // Populate only modest windows up front; larger ones fault in as used.
  bool populate = end - w->file_base <= (64ull << 20);
  if (map_shared(b->second.get(), w->file_base, end - w->file_base, PROT_READ | PROT_WRITE, populate, w->map))
    return nullptr;
  // Drop windows of keys that are gone, so churn does not pile up mappings.
  if (st.windows.size() > 1024) {
    std::erase_if(st.windows, [&](auto& kv) { return !st.mr(kv.first); });
  }
  st.windows[key] = w;
  return w;
}

}  // namespace sv::verbs
