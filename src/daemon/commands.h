// commands.h: the daemon's side of the op table (common/protocol.h): one
// handler per op, and the generic code that checks each request against the
// op's declaration (length, descriptors carried in), calls the handler, and
// checks the reply against it (descriptors carried out) before it is sent,
// as the kernel's uverbs checks a method's attributes before its handler runs.
//
// Contract: the loop's thread only (the registry is not locked).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"
#include "daemon/registry.h"
#include "daemon/roce_port.h"

namespace sv::daemon {

// What a handler may use.
struct CommandEnv {
  Registry& registry;
  RocePort& roce;
  uint32_t client;
  std::vector<Fd>& in_fds;    // the request's: as many as the op declares
  std::vector<int>& out_fds;  // the reply's (the registry's descriptors; sent as duplicates)
  // Mediate: where a copy for the copy worker goes (null: carry it out now).
  std::unique_ptr<MediationJob>* deferred;
  // PostRing: the server makes the connection's ring (empty: EOPNOTSUPP,
  // as for a request not read from a connection).
  std::function<int(proto::PostRingReply&, std::vector<int>&)> post_ring = {};
  std::function<int(std::vector<int>&)> wake = {};  // Op::Wake: the connection's wake socket
};

// Runs one request whose header (magic, version) is valid: EOPNOTSUPP for
// an unknown op or one the daemon only sends, EBADF for descriptors the op
// does not take, EINVAL for a length other than its request's; else its
// handler. A reply whose descriptors do not match the declaration is not
// sent: it becomes EIO (a daemon bug). Returns the reply's length in `out`
// (at least a Header; at most kMaxMessage).
size_t run_command(CommandEnv& env, const proto::Header& h, const uint8_t* msg, size_t len, uint8_t* out);

// What the last request that reached its handler did with the handle fields
// its op declares (common/op_handles.h; bit i: field i), for the test that
// holds every handler to its declaration (commands_test.cc): the fields it
// used, and the lookups by owner it made on its own (objects.h).
struct HandleAudit {
  uint16_t op = 0;
  uint32_t declared = 0, used = 0;
  uint64_t own_lookups = 0;
  bool not_served = false;  // the op is switched off here (commands.cc, served<op>): nothing resolved
};
const HandleAudit& last_handle_audit();

}  // namespace sv::daemon
