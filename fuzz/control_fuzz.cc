// libFuzzer target: the daemon's decoding and validation of control
// messages (Server::handle), fed arbitrary bytes as if from a hostile
// client. Any crash, leak or sanitizer report is a bug; each one found
// becomes a regression test in tests/verbs/daemon_test.cc.
//
// The first input byte chooses how many descriptors (0-2) accompany the
// message, so that the descriptor checks are exercised too, and of which
// kind: an eventfd, a memfd sealed as a backing must be, or an unsealed one.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "daemon/server.h"

namespace {

struct Harness {
  sv::daemon::Server server{"/tmp/softverbs-fuzz-unused", 0};
  uint32_t client = 0;
  Harness() {
    server.registry().init();
    client = server.registry().add_client(::getpid(), ::getuid());
  }
};

int make_fd(int kind) {
  if (kind == 0) return ::eventfd(0, EFD_CLOEXEC);
  int fd = ::memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd >= 0 && ::ftruncate(fd, 1 << 16) == 0 && kind == 1) ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness h;
  if (size == 0) return 0;
  std::vector<sv::Fd> fds;
  // Descriptors of three kinds (RegBacking accepts only the sealed memfd).
  for (int i = 0; i < (data[0] % 3); ++i) fds.emplace_back(make_fd((data[0] / 3 + i) % 3));
  uint8_t out[sv::proto::kMaxMessage];
  std::vector<int> out_fds;
  size_t n = h.server.handle(h.client, data + 1, size - 1, fds, out, out_fds);
  if (n > sizeof(out)) __builtin_trap();
  // Start each input from a clean client so that objects do not pile up.
  static unsigned runs = 0;
  if (++runs % 256 == 0) {
    h.server.registry().remove_client(h.client);
    h.client = h.server.registry().add_client(::getpid(), ::getuid());
  }
  return 0;
}
