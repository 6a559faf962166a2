// identity.h: what decides a client's locked-memory limit, read through
// /proc when it connects and again at each registration (Registry::add_client,
// Registry::reg_mr).
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "daemon/registry.h"

namespace sv::daemon {

// What decides `pid`'s locked-memory limit now, read through /proc. True
// only if the process behind `pidfd` was alive until everything was read,
// so that the pid was not reused by another process meanwhile.
bool read_identity(pid_t pid, int pidfd, ConnectIdentity& out);

// The locked-memory limit of a client in bytes: RLIMIT_MEMLOCK, or
// unlimited with CAP_IPC_LOCK, decided for the process that connected.
uint64_t memlock_limit(pid_t pid, int pidfd, const ConnectIdentity& at_connect);

}  // namespace sv::daemon
