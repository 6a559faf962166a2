// libFuzzer target: the daemon's decoding and validation of control
// messages (Server::handle), fed arbitrary bytes as if from a hostile
// client. Any crash, leak or sanitizer report is a bug; each one found
// becomes a regression test in tests/verbs/daemon_test.cc.
//
// The first input byte chooses how many descriptors (0-2) accompany the
// message (bits 0-1), of which kind (bits 2-3: an eventfd, a memfd sealed as
// the library seals its backing, an unsealed memfd that its sender could
// truncate, a socket), and which of two clients sends it (bit 4): one of
// this process's user and one of another user (nobody), each in its own
// context, so that the checks keeping users apart are fed forged handles,
// keys and names of the other user's objects too.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/server.h"

namespace {

constexpr uid_t kOtherUser = 65534;

struct Harness {
  sv::daemon::Server server{"/tmp/softverbs-fuzz-unused", 0};
  uint32_t client[2] = {0, 0};
  Harness() {
    server.registry().init();
    connect();
  }
  void connect() {
    client[0] = server.registry().add_client(::getpid(), ::getuid());
    client[1] = server.registry().add_client(::getpid(), kOtherUser);
  }
  void reconnect() {
    for (uint32_t c : client) server.registry().remove_client(c);
    connect();
  }
};

int make_fd(unsigned kind) {
  switch (kind) {
    case 1:
    case 2: {
      int fd = ::memfd_create("control-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd >= 0 && ::ftruncate(fd, 1 << 20) != 0) {
      }
      if (fd >= 0 && kind == 1) ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL);
      return fd;
    }
    case 3: {
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return -1;
      ::close(sv[1]);
      return sv[0];
    }
    default: return ::eventfd(0, EFD_CLOEXEC);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness h;
  if (size == 0) return 0;
  const unsigned count = (data[0] & 3) % 3, kind = (data[0] >> 2) & 3, who = (data[0] >> 4) & 1;
  std::vector<sv::Fd> fds;
  for (unsigned i = 0; i < count; ++i) fds.emplace_back(make_fd(kind));
  uint8_t out[sv::proto::kMaxMessage];
  std::vector<int> out_fds;
  size_t n = h.server.handle(h.client[who], data + 1, size - 1, fds, out, out_fds);
  if (n > sizeof(out)) __builtin_trap();
  // The reply is as the op table declares (common/protocol.h): a failure
  // carries no descriptor; a success is the op's reply struct with the
  // descriptors it declares.
  if (n != 0) {
    sv::proto::Header rh;
    std::memcpy(&rh, out, sizeof rh);
    const sv::proto::OpInfo* op = sv::proto::op_info(rh.op);
    if (rh.status != 0 && !out_fds.empty()) __builtin_trap();
    if (rh.status == 0 && (!op || n != op->rep_size || !op->out.allows(out_fds.size()))) __builtin_trap();
  }
  // Start from clean clients now and then so that objects do not pile up.
  static unsigned runs = 0;
  if (++runs % 256 == 0) h.reconnect();
  return 0;
}
