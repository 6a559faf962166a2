// softverbs doctor: checks what a user's set-up needs, one line per check
// with its verdict (ok, warn, FAIL) and what to do about a failure:
//   - the runtime directory, as the library chooses it (common/paths.h):
//     a real directory, the user's, mode 0700;
//   - the daemon there: whether it answers, which network namespace it
//     serves (proto::Op::Netns), whether it shares this process's pid
//     namespace (socket(7) SO_PEERCRED names no pid, 0, for a process of a
//     pid namespace this one cannot see) and user namespace;
//   - RLIMIT_MEMLOCK (getrlimit(2)) against what registrations will need;
//   - UDP 4791 (RoCEv2): free, held by this daemon, or by another process
//     (common/port_holder.h);
//   - /dev/infiniband/uverbs0 and /sys/class/infiniband/sv0, as
//     `softverbs run` shows them;
//   - the softverbs CDI specs in /etc/cdi and /var/run/cdi, their devices
//     and their trust domains' directories;
//   - which libibverbs.so.1 a verbs program loads (ldd(1)), under
//     `softverbs run` and as it is run now.
// Exit status 0 when no check failed (warnings allowed), 1 otherwise, 2
// for a usage error. softverbs(1) documents each line.
#pragma once

#include <string>

namespace sv::tools {

struct DoctorPaths {
  std::string lib_dir;  // softverbs' libibverbs.so.1 and librdmacm.so.1 (what `softverbs run` puts first)
  std::string tool;     // this softverbs binary (to ask `softverbs run` itself)
};

int doctor_main(int argc, char** argv, const DoctorPaths& paths);

}  // namespace sv::tools
