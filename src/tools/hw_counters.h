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
// connection to the daemon (0 or an errno); a daemon that is not running
// counted nothing, and none is started for asking. Failures are silent
// but for one line on stderr: the files keep what they said.
void start_hw_counters_refresh(const std::string& port_dir, std::function<int(Fd&)> connect, int period_ms = 1000);

// Writes the counters of `port` (counters::kNames' order) into port_dir's
// hw_counters files, each replaced whole (a reader never sees half of
// one); 0 or an errno.
int write_hw_counters(const std::string& port_dir, const uint64_t* port);

}  // namespace sv::tools
