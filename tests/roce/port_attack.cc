// port_attack: a hostile user's process (run as nobody under the system
// daemon) that puts four RC QPs on the wire (one per lane it may ask
// for) and then attacks whatever sockets the daemon handed it, for
// tests/roce/port_group_test.sh
// (roce.port_group). A member of the daemon's UDP 4791 SO_REUSEPORT group
// could replace the group's steering program (no privilege needed) and
// take every user's RoCE datagrams and CM MADs. For every descriptor of
// this process (/proc/self/fd) it reports and tries:
//   - an inet socket bound to port 4791, or with SO_REUSEPORT: "exposed";
//   - SO_ATTACH_REUSEPORT_CBPF with programs that steer everything to one
//     index of the group (0 .. 15), and SO_DETACH_REUSEPORT_BPF: "attached"
//     if the kernel took any;
// and a socket of its own joining the group (SO_REUSEPORT, LOCAL:4791):
// "joined" if the kernel allowed it. Prints "qpn N", then "checked K
// sockets"; on a line on stdin (or EOF) reads what waits on its UDP
// sockets and prints "foreign N": datagrams for another QPN.
// Exit 0 iff nothing was exposed, attached, joined or foreign.
//
//   port_attack REMOTE_IPV4 LOCAL_IPV4
#include <arpa/inet.h>
#include <dirent.h>
#include <infiniband/verbs.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

ibv_qp* qp_on_wire(ibv_context* ctx, const char* remote) {
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = pd && cq ? ibv_create_qp(pd, &ia) : nullptr;
  if (!qp) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return nullptr;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x123;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
  if (inet_pton(AF_INET, remote, a.ah_attr.grh.dgid.raw + 12) != 1) return nullptr;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    std::fprintf(stderr, "port_attack: RTR: %s\n", std::strerror(e));
    return nullptr;
  }
  return qp;
}

std::vector<int> socket_fds() {
  std::vector<int> v;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return v;
  while (dirent* e = readdir(d)) {
    int fd = std::atoi(e->d_name);
    struct stat st {};
    if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    v.push_back(fd);
  }
  closedir(d);
  return v;
}

// 4791 (or any port) of an inet socket; -1 for other sockets.
int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6&>(ss).sin6_port);
  return -1;
}

// Any program the kernel takes for the group of `fd`.
bool steal(int fd) {
  bool took = false;
  for (uint32_t idx = 0; idx < 16; ++idx) {
    sock_filter f[] = {BPF_STMT(BPF_RET | BPF_K, idx)};
    sock_fprog prog{1, f};
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) == 0) took = true;
  }
  int zero = 0;
  if (setsockopt(fd, SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, &zero, sizeof zero) == 0) took = true;
  return took;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: port_attack REMOTE_IPV4 LOCAL_IPV4\n");
    return 2;
  }
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  ibv_context* ctx = devs && n > 0 ? ibv_open_device(devs[0]) : nullptr;
  if (devs) ibv_free_device_list(devs);
  ibv_qp* qp = ctx ? qp_on_wire(ctx, argv[1]) : nullptr;
  if (!qp) return 1;
  std::printf("qpn %u\n", qp->qp_num);
  // Three more on the wire: run with SOFTVERBS_ROCE_THREADS=4, they ask
  // the daemon for lanes 1-3 (RoceAttachReq::lane), which must not get a
  // user other than the daemon's a member of the port's group either.
  for (int i = 0; i < 3; ++i) {
    if (!qp_on_wire(ctx, argv[1])) return 1;
  }
  int bad = 0;
  std::vector<int> udp;
  const std::vector<int> fds = socket_fds();
  for (int fd : fds) {
    const int port = bound_port(fd);
    int reuse = 0;
    socklen_t rl = sizeof reuse;
    getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &reuse, &rl);
    int type = 0;
    socklen_t tl = sizeof type;
    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl);
    if (port >= 0 && type == SOCK_DGRAM) udp.push_back(fd);
    if (port == 4791 || (port >= 0 && reuse)) {
      std::printf("exposed fd %d: port %d reuseport %d\n", fd, port, reuse);
      ++bad;
    }
    if (steal(fd)) {
      std::printf("attached fd %d: the kernel took a steering program\n", fd);
      ++bad;
    }
  }
  // A socket of our own in the group: the kernel decides by user.
  sockaddr_in own{};
  own.sin_family = AF_INET;
  own.sin_port = htons(4791);
  if (inet_pton(AF_INET, argv[2], &own.sin_addr) == 1) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (bind(s, reinterpret_cast<sockaddr*>(&own), sizeof own) == 0) {
      std::printf("joined: bound our own socket to %s:4791\n", argv[2]);
      ++bad;
    } else {
      std::printf("own socket on %s:4791: %s\n", argv[2], std::strerror(errno));
    }
    close(s);
  }
  std::printf("checked %zu sockets\n", fds.size());
  std::fflush(stdout);
  char line[64];
  (void)!std::fgets(line, sizeof line, stdin);
  unsigned foreign = 0;
  uint8_t buf[65536];
  for (int fd : udp) {
    ssize_t got;
    while ((got = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) >= 0) {
      if (got >= 12 && (uint32_t(buf[5]) << 16 | uint32_t(buf[6]) << 8 | buf[7]) != qp->qp_num) ++foreign;
    }
  }
  std::printf("foreign %u\n", foreign);
  if (foreign) ++bad;
  ibv_destroy_qp(qp);
  return bad ? 3 : 0;
}
