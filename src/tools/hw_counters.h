// hw_counters.h: keeps the hw_counters files of `softverbs run`'s sysfs view
// (/sys/class/infiniband/sv0/ports/1/hw_counters/NAME, as rxe's; written
// with 0 by tools/sysfs_view.h) up to date while the program runs.
#pragma once

#include <functional>
#include <string>

#include "common/sys.h"

namespace sv::tools {

// Starts a process, detached from the caller (not its child: the program
// `softverbs run` becomes never sees it), that rewrites the port's counter
// files in `port_dir` (…/ports/1) from the daemon every `period_ms` while
// the caller's process lives, then exits. `connect` opens a control
// connection to the daemon (0 or an errno). The daemon of `daemon_dir` is
// asked only while it runs (it holds its lock): one that is not running
// counted nothing (zeros), and none is started for asking, not even by
// socket activation. Failures are silent but for one line on stderr: the
// files keep what they said.
void start_hw_counters_refresh(const std::string& port_dir, const std::string& daemon_dir,
                               std::function<int(Fd&)> connect, int period_ms = 1000);

// Whether a process holds the flock of `lock_file` (the daemon's
// daemon.lock), as /proc/locks says: asked without taking it, which could
// make a daemon starting meanwhile give up.
bool lock_is_held(const std::string& lock_file);

// Writes the counters of `port` (counters::kNames' order) into port_dir's
// hw_counters files, each replaced whole (a reader never sees half of
// one); 0 or an errno.
int write_hw_counters(const std::string& port_dir, const uint64_t* port);

}  // namespace sv::tools
