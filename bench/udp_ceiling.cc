// udp_ceiling: what the kernel alone moves between two hosts when given
// RoCEv2 datagrams the way softverbs' sender gives them (the RoCE path's
// baseline): UDP GSO sends of up to 62 datagrams of one size, each gathered
// from three pieces (a 12-byte BTH from a header slot, the payload from a
// 1 MiB buffer, the 4-byte ICRC after the header), through sendmmsg; the
// receiver a UDP_GRO socket read by recvmmsg into four 64 KiB slots. No RDMA
// work at all: no packet is built, no ICRC computed, no memory checked. The
// ratio of softverbs' ib_write_bw to this, in the same run, is the share of
// the sender's CPU that the library's own work leaves to the kernel.
//
//   udp_ceiling recv PORT [SECONDS]          prints "udp_ceiling MB/s N"
//   udp_ceiling send ADDR PORT SECONDS [PAYLOAD [PER_SEND [MODE]]]
// PER_SEND: datagrams per GSO send (default: as many as fit 65000 bytes).
// MODE: plain (three pieces per datagram, as softverbs sends), merge (each
// ICRC and the next header one piece: two per datagram), zerocopy (plain
// with MSG_ZEROCOPY; completions read from the error queue). The last two
// are the experiments of docs/ROCE.md. The sender prints its
// rate and its CPU time per send.
// The receiver counts payload bytes (datagrams x PAYLOAD) from its first
// datagram until nothing arrived for 300 ms (or SECONDS passed), and exits.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_common.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

constexpr size_t kBth = 12, kIcrc = 4, kMaxGsoBytes = 65000, kSlots = 4, kSlot = 65536;

double now() { return double(bench::now_ns_steady()) * 1e-9; }

int usage() {
  std::fprintf(stderr,
               "usage: udp_ceiling recv PORT [SECONDS]\n"
               "       udp_ceiling send ADDR PORT SECONDS [PAYLOAD [PER_SEND [plain|merge|zerocopy]]]\n");
  return 2;
}

bool parse_addr(const char* host, int port, sockaddr_storage& ss, socklen_t& len) {
  std::memset(&ss, 0, sizeof ss);
  auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(uint16_t(port));
    len = sizeof *a4;
    return true;
  }
  if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(uint16_t(port));
    len = sizeof *a6;
    return true;
  }
  return false;
}

int run_recv(int port, double limit) {
  int fd = socket(AF_INET6, SOCK_DGRAM, 0);
  int one = 1, zero = 0, big = 8 << 20;
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(uint16_t(port));
  a.sin6_addr = in6addr_any;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::perror("udp_ceiling: bind");
    return 1;
  }
  std::printf("udp_ceiling listening\n");
  std::fflush(stdout);
  std::vector<uint8_t> buf(kSlots * kSlot);
  mmsghdr m[kSlots];
  iovec iov[kSlots];
  alignas(cmsghdr) char cb[kSlots][CMSG_SPACE(sizeof(int))];
  uint64_t datagrams = 0;
  size_t payload = 0;
  double first = 0, last = 0;
  const double start = now();
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int idle_ms = first == 0 ? 100 : 300;
    if (poll(&p, 1, idle_ms) == 0) {
      if (first != 0 || now() - start > limit) break;
      continue;
    }
    for (size_t i = 0; i < kSlots; i++) {
      iov[i] = {buf.data() + i * kSlot, kSlot};
      m[i] = {};
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
      m[i].msg_hdr.msg_control = cb[i];
      m[i].msg_hdr.msg_controllen = sizeof cb[i];
    }
    const int n = recvmmsg(fd, m, kSlots, MSG_DONTWAIT, nullptr);
    if (n <= 0) continue;
    const double t = now();
    if (first == 0) first = t;
    last = t;
    for (int i = 0; i < n; i++) {
      size_t seg = m[i].msg_len;  // one datagram unless the kernel says its GRO size
      for (cmsghdr* c = CMSG_FIRSTHDR(&m[i].msg_hdr); c; c = CMSG_NXTHDR(&m[i].msg_hdr, c)) {
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int g;
          std::memcpy(&g, CMSG_DATA(c), sizeof g);
          seg = size_t(g);
        }
      }
      if (seg > kBth + kIcrc) {
        datagrams += (m[i].msg_len + seg - 1) / seg;
        payload = seg - kBth - kIcrc;
      }
    }
    if (now() - start > limit) break;
  }
  const double secs = last - first;
  const double mbs = secs > 0 ? double(datagrams) * double(payload) / secs / 1e6 : 0;
  std::printf("udp_ceiling MB/s %.1f datagrams %llu seconds %.3f\n", mbs, (unsigned long long)datagrams, secs);
  return 0;
}

// The pieces of per_send datagrams into v, each of a BTH and an ICRC from
// its header slot (slots: kBth + kIcrc bytes each) around payload bytes of
// data from off on (wrapping); merge: a datagram's ICRC and the next one's
// BTH go as one piece. Returns the number of pieces.
size_t gather_datagrams(iovec* v, uint8_t* slots, std::span<uint8_t> data, size_t& off, size_t payload,
                        size_t per_send, bool merge) {
  size_t n = 0;
  for (size_t k = 0; k < per_send; k++) {
    uint8_t* slot = slots + k * (kBth + kIcrc);
    if (off + payload > data.size()) off = 0;
    if (!merge || k == 0) v[n++] = {slot, kBth};
    v[n++] = {data.data() + off, payload};
    // merge: this ICRC and the next datagram's BTH, one piece.
    v[n++] = {slot + kBth, merge && k + 1 < per_send ? kIcrc + kBth : kIcrc};
    off += payload;
  }
  return n;
}

// Makes h a UDP GSO send of datagrams of seg bytes (UDP_SEGMENT), its
// control message in cb.
void set_gso_size(msghdr& h, char* cb, size_t cb_len, uint16_t seg) {
  h.msg_control = cb;
  h.msg_controllen = cb_len;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
}

// Reads the MSG_ZEROCOPY completions queued on fd: their pages may be
// reused (the buffers here are never written).
void drain_zerocopy_completions(int fd) {
  char errq[4096];
  for (;;) {
    msghdr em{};
    em.msg_control = errq;
    em.msg_controllen = sizeof errq;
    if (recvmsg(fd, &em, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) break;
  }
}

int run_send(const char* host, int port, double secs, size_t payload, size_t per_send, const std::string& mode) {
  sockaddr_storage dst;
  socklen_t dlen;
  if (!parse_addr(host, port, dst, dlen) || payload == 0 || payload > 8192) return usage();
  const bool merge = mode == "merge", zerocopy = mode == "zerocopy";
  if (!merge && !zerocopy && mode != "plain") return usage();
  int fd = socket(dst.ss_family, SOCK_DGRAM, 0);
  int big = 8 << 20, one = 1;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  if (zerocopy && setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0) {
    std::perror("udp_ceiling: SO_ZEROCOPY");
    return 1;
  }
  const size_t dgram = kBth + payload + kIcrc;
  const size_t fit = kMaxGsoBytes / dgram;  // 62 for 1 KiB payloads
  if (per_send == 0 || per_send > fit) per_send = fit;
  constexpr size_t kSends = 4;  // one sendmmsg: 4 GSO sends, ~256 KiB as softverbs
  // The payload buffer page-aligned, as registered memory usually is.
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, 1 << 20)), &std::free);
  std::span<uint8_t> data(buf.get(), 1 << 20);
  std::memset(data.data(), 0x5a, data.size());
  // Header slots: the BTH, then the ICRC right after it (32 bytes a
  // datagram), so that in "merge" a datagram's ICRC and the next one's BTH
  // are adjacent and go as one piece.
  std::vector<uint8_t> slots(kSends * per_send * (kBth + kIcrc), 0);
  std::vector<iovec> iov(kSends * per_send * 3);
  std::vector<size_t> iovs(kSends);
  mmsghdr m[kSends];
  alignas(cmsghdr) char cb[kSends][CMSG_SPACE(sizeof(uint16_t))];
  size_t off = 0;
  uint64_t sent = 0, sends = 0;
  const double start = now();
  const std::clock_t cpu0 = std::clock();
  while (now() - start < secs) {
    for (size_t s = 0; s < kSends; s++) {
      iovec* v = &iov[s * per_send * 3];
      const size_t n = gather_datagrams(v, slots.data() + s * per_send * (kBth + kIcrc), data, off, payload,
                                        per_send, merge);
      iovs[s] = n;
      m[s] = {};
      m[s].msg_hdr.msg_name = &dst;
      m[s].msg_hdr.msg_namelen = dlen;
      m[s].msg_hdr.msg_iov = v;
      m[s].msg_hdr.msg_iovlen = n;
      if (per_send > 1) set_gso_size(m[s].msg_hdr, cb[s], sizeof cb[s], uint16_t(dgram));
    }
    const int n = sendmmsg(fd, m, kSends, zerocopy ? MSG_ZEROCOPY : 0);
    if (n > 0) {
      sent += uint64_t(n) * per_send;
      sends += uint64_t(n);
    } else if (n < 0 && errno != EAGAIN && errno != ENOBUFS && errno != EINTR) {
      std::fprintf(stderr, "udp_ceiling: sendmmsg of %zu datagrams (%zu pieces) per send: %s\n", per_send, iovs[0],
                   std::strerror(errno));
      return 1;
    }
    if (zerocopy) drain_zerocopy_completions(fd);
  }
  const double t = now() - start;
  const double cpu = double(std::clock() - cpu0) / CLOCKS_PER_SEC;
  std::printf("udp_ceiling sent MB/s %.1f mode %s datagrams/send %zu pieces/send %zu cpu us/send %.2f\n",
              double(sent) * double(payload) / t / 1e6, mode.c_str(), per_send, iovs[0],
              sends ? cpu / double(sends) * 1e6 : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "recv")
    return run_recv(int(bench::to_u64(argv[2], "PORT")), argc > 3 ? bench::to_double(argv[3], "SECONDS") : 60);
  if (argc >= 5 && std::string(argv[1]) == "send")
    return run_send(argv[2], int(bench::to_u64(argv[3], "PORT")), bench::to_double(argv[4], "SECONDS"),
                    argc > 5 ? size_t(bench::to_u64(argv[5], "PAYLOAD")) : 1024,
                    argc > 6 ? size_t(bench::to_u64(argv[6], "PER_SEND")) : 0, argc > 7 ? argv[7] : "plain");
  return usage();
}
