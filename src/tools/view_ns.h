// view_ns.h: the device where tools look for it, for one program: `softverbs
// run` calls enter_view() before it executes the program, which then sees
//   /dev/infiniband/uverbs0                a bind mount of /dev/null (the
//                                          read/write character device that
//                                          UCX and others stat and access)
//   /sys/class/infiniband/sv0/...          the device's sysfs attributes
//   /sys/class/infiniband_verbs/...        (tools/sysfs_view.h)
// in a private mount namespace: nothing on the host changes, and the view
// ends with the program (and whatever it starts, such as the daemon).
//
// As root the namespace is a mount namespace only. As another user it is a
// user namespace too, whose only uid and gid are the caller's own, mapped to
// themselves (setgroups denied, as user_namespaces(7) requires): the program
// runs as the same user, without capabilities, and the daemon's SO_PEERCRED
// sees the real uid. In it /dev and /sys/class are each a tmpfs holding a
// bind mount (or a copy of the symlink) of every real entry, plus ours; a
// real /dev/infiniband or /sys/class/infiniband is rebuilt entry by entry
// the same way, so that its devices stay visible.
#pragma once

#include <string>

namespace sv::view {

// Enters a new namespace with the view. 0, or an errno with `why` saying
// what failed; then the process is as it was, as far as the program can tell
// (it may be in a namespace of its own, with the host's mounts unchanged).
// The test hook SOFTVERBS_VIEW_REFUSE=1 refuses it as a kernel without
// unprivileged user namespaces would (EPERM).
int enter_view(std::string& why);

// The /sys/class part of the view under ROOT/sys/class, in the current
// mount namespace (a container's, from the runtime's createContainer hook:
// tools/oci_hook.h), with this network namespace's GIDs. 0 (also when the
// view is there already), or an errno with `why`; on failure nothing
// changed.
int add_sysfs_view(const std::string& root, std::string& why);

}  // namespace sv::view
