// libFuzzer target: the CM gateway (src/daemon/cm_gateway.cc) fed MADs as
// if from a hostile host on the wire. Each input is a sequence of MADs (256
// bytes each, the last padded with zeros); each is framed as RoCEv2 UD to
// QP1 with a correct ICRC, so that it passes the packet checks and reaches
// the CM decoding and the matching of connections; the first byte of an
// input decides whether a listener exists (REQs then open connections whose
// later messages are matched). Any crash or sanitizer report is a bug.
#include <arpa/inet.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/sys.h"
#include "daemon/cm_gateway.h"
#include "roce/headers.h"
#include "roce/icrc.h"

namespace {

struct Harness {
  std::string dir;
  sv::Fd roce, listener;
  sv::daemon::CmGateway gw;
  sockaddr_in local{}, from{};
  Harness() {
    char tmpl[] = "/tmp/svcmfuzz.XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    dir = tmpl;
    static std::string* to_remove = new std::string(dir);
    std::atexit([] { std::system(("rm -rf '" + *to_remove + "'").c_str()); });
    ::mkdir((dir + "/cm").c_str(), 0700);
    ::setenv("SOFTVERBS_CM_RETRY_MS", "10", 1);
    if (gw.open(dir) != 0) std::abort();
    roce.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    local.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &local.sin_addr);
    if (::bind(roce.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) std::abort();
    socklen_t l = sizeof local;
    ::getsockname(roce.get(), reinterpret_cast<sockaddr*>(&local), &l);
    from.sin_family = AF_INET;
    from.sin_port = htons(49152);
    inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
  }
  // A listener for every service ID of RDMA_PS_TCP port 7000 at 127.0.0.1.
  void set_listener(bool on) {
    std::string path = dir + "/cm/262-7000-0.0.0.0";
    if (on && !listener.valid()) sv::listen_seqpacket(path, listener);
    if (!on && listener.valid()) {
      listener.reset();
      ::unlink(path.c_str());
    }
  }
  void deliver(const uint8_t* mad) {
    sv::roce::Packet p;
    p.bth.opcode = 0x64;
    p.bth.dest_qp = 1;
    p.deth.qkey = 0x80010000;
    p.deth.src_qp = 1;
    p.payload = std::span<const uint8_t>(mad, 256);
    uint8_t tp[512];
    size_t tn = sv::roce::build_packet(p, tp);
    sv::roce::Ipv4Udp h;
    std::memcpy(h.src.data(), &from.sin_addr, 4);
    std::memcpy(h.dst.data(), &local.sin_addr, 4);
    h.sport = ntohs(from.sin_port);
    h.dport = ntohs(local.sin_port);
    uint8_t fr[1024];
    size_t n = sv::roce::frame_ipv4(h, std::span<const uint8_t>(tp, tn), fr);
    gw.deliver(roce.get(), reinterpret_cast<const sockaddr*>(&from), sizeof from, fr + 28, n - 28);
    gw.run();
    // Whatever reached the listener is accepted and dropped at once, as an
    // application that dies would (the gateway then ends the connection).
    for (int fd; listener.valid() && (fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC)) >= 0;)
      ::close(fd);
    gw.run();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness;
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  h->set_listener(mode & 1);
  data++;
  size--;
  for (size_t off = 0; off < size; off += 256) {
    uint8_t mad[256] = {};
    std::memcpy(mad, data + off, std::min<size_t>(256, size - off));
    // Mostly CM MADs, so that the decoders and the matching are reached.
    if (mode & 0x80) {
      mad[0] = 1;
      mad[1] = 0x07;
      mad[2] = 2;
      mad[3] = 3;
    }
    h->deliver(mad);
  }
  return 0;
}
