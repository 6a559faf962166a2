// device.h: the process's softverbs device as the drop-in librdmacm uses
// it (device.cc), and librdmacm's error convention.
//
// Contract: device() opens softverbs' device once per process and keeps it
// open until exit (like librdmacm, which opens every device at its first
// call); it is thread safe.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>

namespace sv::rdmacm {

// The process's softverbs context and its default PD (ids' `verbs` and `pd`),
// opened on first use; nullptr (errno set) if the device cannot be opened.
ibv_context* device();
ibv_pd* default_pd();
// Whether the device's port is down (a fault plan's port rule, docs/LAB.md:
// the state ibv_query_port(3) reports).
bool port_down();
// A second context on the same device, whose async events only the CM reads
// (the application may read those of device()); nullptr on failure.
ibv_context* open_watch_context();

// librdmacm's convention: -1 with errno.
inline int fail(int e) {
  errno = e;
  return -1;
}

}  // namespace sv::rdmacm
