// identity.h: what decides a client's locked-memory limit, read through
// its pidfd and /proc when it connects and again at each registration
// (Registry::add_client, MemoryRegions::charge_memlock).
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "daemon/registry.h"

namespace sv::daemon {

// What decides `pid`'s locked-memory limit now (through the pidfd and
// /proc). True only if the process behind `pidfd` was alive until
// everything was read, so that the pid was not reused by another process
// meanwhile. `want_caps`: whether CAP_IPC_LOCK is looked up (out.ipc_lock
// is false otherwise).
bool read_identity(pid_t pid, int pidfd, ConnectIdentity& out, bool want_caps = true);

// The same read through /proc/PID/status, as on kernels without
// PIDFD_GET_INFO (before 6.13): read_identity's fallback, and its tests'
// reference.
bool read_identity_proc(pid_t pid, int pidfd, ConnectIdentity& out);

// The locked-memory limit that a charge bringing the client's process to
// `total` locked bytes meets: RLIMIT_MEMLOCK, or unlimited with
// CAP_IPC_LOCK (consulted only for a total beyond RLIMIT_MEMLOCK, as the
// kernel does), decided for the process that connected.
uint64_t memlock_limit(pid_t pid, int pidfd, const ConnectIdentity& at_connect, uint64_t total);

// Whether `pid` (the process behind `pidfd`, alive until the answer was
// read) is in this daemon's pid namespace, as sv::same_pid_namespace
// answers, at a connection's cost of one readlink(2) where it can: the
// link /proc/PID/ns/pid against the daemon's own, both read through a
// /proc of the daemon's own namespace (looked at once). The link needs
// ptrace's read access to the process; without it (another user's process
// to a daemon without CAP_SYS_PTRACE, a process in a user namespace of its
// own) sv::same_pid_namespace reads /proc/PID/status, which anyone may.
int client_in_pid_namespace(pid_t pid, int pidfd, bool& same);

}  // namespace sv::daemon
