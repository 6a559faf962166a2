// softverbs: run a program on the softverbs device, or ask the daemon how it is.
//
//   softverbs run [--] CMD [ARGS...]   run CMD with softverbs' libibverbs.so.1 first
//   softverbs status                   objects the daemon holds
//   softverbs stop                     ask the daemon to exit (SIGTERM)
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/paths.h"
#include "common/protocol.h"
#include "common/sys.h"

namespace {

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/'));
}

int run(int argc, char** argv) {
  if (argc > 0 && std::strcmp(argv[0], "--") == 0) {
    argv++;
    argc--;
  }
  if (argc == 0) {
    std::fprintf(stderr, "softverbs run: no command\n");
    return 2;
  }
  std::string lib = self_dir() + "/../lib";
  if (const char* l = std::getenv("SOFTVERBS_LIB")) lib = l;
  std::string path = lib;
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old && *old) path += ":" + std::string(old);
  ::setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  if (!std::getenv("SOFTVERBSD")) ::setenv("SOFTVERBSD", (self_dir() + "/softverbsd").c_str(), 1);
  ::execvp(argv[0], argv);
  std::fprintf(stderr, "softverbs run: %s: %s\n", argv[0], std::strerror(errno));
  return 127;
}

int status() {
  std::string dir = sv::runtime_dir();
  sv::Fd s;
  if (int e = sv::connect_seqpacket(sv::socket_path(dir), s)) {
    std::printf("softverbsd: not running (%s: %s)\n", sv::socket_path(dir).c_str(), std::strerror(e));
    return 1;
  }
  sv::proto::Empty req{};
  sv::proto::init_header(req, sv::proto::Op::Status, 1);
  if (sv::send_message(s.get(), &req, sizeof(req), {}) != 0) return 1;
  sv::proto::StatusReply rep{};
  std::vector<sv::Fd> fds;
  size_t len = 0;
  if (sv::recv_message(s.get(), &rep, sizeof(rep), &len, fds) != 0 || len != sizeof(rep) || rep.h.status) {
    std::printf("softverbsd: bad status reply\n");
    return 1;
  }
  std::printf("softverbsd at %s\n", dir.c_str());
  std::printf("  clients %u (this query included)\n  pds %u\n  mrs %u\n  cqs %u\n  qps %u\n  channels %u\n  backings %u\n",
              rep.clients, rep.pds, rep.mrs, rep.cqs, rep.qps, rep.channels, rep.backings);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: softverbs run [--] CMD [ARGS...] | softverbs status\n");
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "run") return run(argc - 2, argv + 2);
  if (cmd == "status") return status();
  std::fprintf(stderr, "softverbs: unknown command '%s'\n", cmd.c_str());
  return 2;
}
