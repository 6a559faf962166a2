#include "attack.h"

#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace svsec {

std::string build_bin(const char* name) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  buf[n > 0 ? n : 0] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/')) + "/../bin/" + name;
}

int wait_for(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

ibv_context* open_dev() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  ibv_context* c = l && n > 0 ? ibv_open_device(l[0]) : nullptr;
  if (l) ibv_free_device_list(l);
  return c;
}

bool become_nobody() {
  return setgroups(0, nullptr) == 0 && setgid(kNobody) == 0 && setuid(kNobody) == 0;
}

int sealed_backing(size_t len) {
  int fd = memfd_create("softverbs-test-backing", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, off_t(len)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

SystemDaemon::SystemDaemon() {
  char tmpl[] = "/tmp/softverbs-system-XXXXXX";
  dir = mkdtemp(tmpl);
  chmod(dir.c_str(), 0755);
  std::string bin = build_bin("softverbsd");
  pid = fork();
  if (pid == 0) {
    unsetenv("SOFTVERBSD_IDLE");  // set by the test main; it would override --idle 0
    execl(bin.c_str(), "softverbsd", "--system", "--foreground", "--dir", dir.c_str(), "--idle", "0",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 500 && access(socket().c_str(), F_OK) != 0; ++i) usleep(10000);
  setenv("SOFTVERBS_SYSTEM", "1", 1);
  setenv("SOFTVERBS_SYSTEM_DIR", dir.c_str(), 1);
}

SystemDaemon::~SystemDaemon() {
  unsetenv("SOFTVERBS_SYSTEM");
  unsetenv("SOFTVERBS_SYSTEM_DIR");
  if (pid > 0) {
    kill(pid, SIGTERM);
    wait_for(pid);
  }
  std::string cmd = "rm -rf " + dir;
  if (std::system(cmd.c_str())) {
  }
}

bool SystemDaemon::alive() const {
  if (pid <= 0) return false;
  int st = 0;
  return waitpid(pid, &st, WNOHANG) == 0;
}

Child::Child(bool as_nobody, std::function<int(int sock)> body) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    close(sv[0]);
    char go = 0;
    if (read(sv[1], &go, 1) != 1) _exit(99);
    if (as_nobody && !become_nobody()) _exit(98);
    _exit(body(sv[1]));
  }
  close(sv[1]);
  sock_ = sv[0];
}

Child::~Child() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    wait();
  }
}

void Child::start() {
  char go = 1;
  if (write(sock_, &go, 1) != 1) std::perror("Child::start");
}

int Child::wait() {
  if (sock_ >= 0) close(sock_);
  sock_ = -1;
  int st = wait_for(pid_);
  pid_ = -1;
  return st;
}

bool send_bytes(int sock, const void* p, size_t n, std::span<const int> fds) {
  return sv::send_message(sock, p, n, fds) == 0;
}

bool recv_bytes(int sock, void* p, size_t n, std::vector<sv::Fd>* fds) {
  std::vector<sv::Fd> got;
  size_t len = 0;
  if (sv::recv_message(sock, p, n, &len, got) != 0 || len != n) return false;
  if (fds) *fds = std::move(got);
  return true;
}

RawConn::RawConn(const std::string& socket_path) { sv::connect_seqpacket(socket_path, sock_); }

int RawConn::send_raw(const void* msg, size_t len, std::span<const int> fds, std::vector<sv::Fd>* got, void* reply,
                      size_t reply_len) {
  if (sv::send_message(sock_.get(), msg, len, fds) != 0) return -1;
  uint8_t buf[sv::proto::kMaxMessage];
  for (;;) {
    size_t n = 0;
    std::vector<sv::Fd> fdv;
    if (sv::recv_message(sock_.get(), buf, sizeof(buf), &n, fdv) != 0 || n < sizeof(sv::proto::Header)) return -1;
    sv::proto::Header h;
    std::memcpy(&h, buf, sizeof(h));
    if (h.seq == 0 && h.op == uint16_t(sv::proto::Op::AsyncEvent)) continue;  // unsolicited
    if (got) *got = std::move(fdv);
    if (reply) std::memcpy(reply, buf, std::min(n, reply_len));
    return h.status;
  }
}

}  // namespace svsec
