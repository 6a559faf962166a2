// The CM gateway between two "hosts" in one process: each has a gateway,
// a directory (its rendezvous sockets), and a UDP socket on its own
// loopback address at port 4791 standing for the daemon's RoCE port. The
// test carries datagrams from those sockets to deliver() (or loses,
// repeats, corrupts them) and plays the library on both sides over the
// unix sockets, as the drop-in librdmacm does (docs/RDMACM.md).
#include "daemon/cm_gateway.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "roce/headers.h"
#include "roce/icrc.h"

namespace sv::daemon {
namespace {

namespace cm = sv::cm;

struct Datagram {
  sockaddr_storage from{};
  socklen_t from_len = 0;
  std::vector<uint8_t> bytes;
  uint16_t attr() const { return uint16_t(bytes[20 + 16] << 8 | bytes[20 + 17]); }  // BTH, DETH, MAD header
  const uint8_t* mad() const { return bytes.data() + 20; }
};

struct Host {
  std::string dir;
  std::string ip;
  Fd roce;
  CmGateway gw;

  void open(const std::string& addr) {
    ip = addr;
    char tmpl[] = "/tmp/svcmgw.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
    ASSERT_EQ(::mkdir((dir + "/cm").c_str(), 0700), 0);
    roce.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(4791);
    ASSERT_EQ(inet_pton(AF_INET, addr.c_str(), &a.sin_addr), 1);
    ASSERT_EQ(::bind(roce.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
    ASSERT_EQ(gw.open(dir), 0);
  }
  ~Host() {
    if (!dir.empty()) std::system(("rm -rf '" + dir + "'").c_str());
  }
  // What arrived at this host's port 4791.
  std::vector<Datagram> arrivals() {
    std::vector<Datagram> v;
    for (;;) {
      Datagram d;
      d.bytes.resize(2048);
      d.from_len = sizeof d.from;
      ssize_t n = ::recvfrom(roce.get(), d.bytes.data(), d.bytes.size(), 0, reinterpret_cast<sockaddr*>(&d.from),
                             &d.from_len);
      if (n < 0) return v;
      d.bytes.resize(size_t(n));
      v.push_back(std::move(d));
    }
  }
  void deliver(const Datagram& d) {
    gw.deliver(roce.get(), reinterpret_cast<const sockaddr*>(&d.from), d.from_len, d.bytes.data(), d.bytes.size());
  }
};

// Loopback addresses of their own, so that parallel runs do not meet.
std::string addr(int host) {
  return "127.77." + std::to_string(::getpid() % 250) + "." + std::to_string(host + 1);
}

class CmGatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("SOFTVERBS_CM_RETRY_MS", "100", 1);
    ::setenv("SOFTVERBS_CM_RETRIES", "3", 1);
    a.open(addr(0));
    b.open(addr(1));
  }
  void TearDown() override {
    ::unsetenv("SOFTVERBS_CM_RETRY_MS");
    ::unsetenv("SOFTVERBS_CM_RETRIES");
  }

  // run() takes what is ready: a new connection, then (next time) its data.
  static void settle(Host& h) {
    for (int i = 0; i < 3; ++i) h.gw.run();
  }
  // One round: both gateways run, what each sent is delivered to the other
  // unless `keep` says no; returns the attributes of what was sent.
  std::vector<uint16_t> round(const std::function<bool(const Datagram&)>& keep = nullptr) {
    std::vector<uint16_t> sent;
    settle(a);
    settle(b);
    for (bool more = true; more;) {  // an answer sent during deliver() goes in this round too
      more = false;
      for (Host* h : {&a, &b}) {
        for (const Datagram& d : h->arrivals()) {
          more = true;
          sent.push_back(d.attr());
          last = d;
          if (!keep || keep(d)) h->deliver(d);
        }
      }
    }
    return sent;
  }
  // Rounds until `done` (at most 3 s); what was sent.
  std::vector<uint16_t> until(const std::function<bool()>& done,
                              const std::function<bool(const Datagram&)>& keep = nullptr) {
    std::vector<uint16_t> all;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!done() && std::chrono::steady_clock::now() < end) {
      for (uint16_t x : round(keep)) all.push_back(x);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return all;
  }
  static std::function<bool()> readable(int fd, cm::Msg& m) {
    return [fd, &m] {
      uint8_t buf[cm::kMadSize + 1];
      ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      return n == ssize_t(cm::kMadSize) && cm::decode(buf, cm::kMadSize, m);
    };
  }
  std::vector<uint16_t> rounds(int ms, const std::function<bool(const Datagram&)>& keep = nullptr) {
    std::vector<uint16_t> all;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end) {
      for (uint16_t x : round(keep)) all.push_back(x);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return all;
  }

  // The library on host A: its id's connection to A's gateway.
  Fd lib_connect() {
    Fd fd;
    EXPECT_EQ(connect_seqpacket(a.dir + "/cm-gateway", fd), 0);
    return fd;
  }
  // A listener on host B for (RDMA_PS_TCP, port 7000, B's address).
  Fd listen_b() {
    Fd fd;
    EXPECT_EQ(listen_seqpacket(b.dir + "/cm/262-7000-" + b.ip, fd), 0);
    return fd;
  }

  void req(uint8_t* mad, uint32_t comm_id = 0x1111) {
    cm::Req r;
    r.local_comm_id = comm_id;
    r.service_id = cm::service_id(262, 7000);
    r.local_qpn = 0x123;
    r.starting_psn = 0x456;
    cm::IpHeader ip;
    auto& s = reinterpret_cast<sockaddr_in&>(ip.src);
    auto& d = reinterpret_cast<sockaddr_in&>(ip.dst);
    s.sin_family = d.sin_family = AF_INET;
    s.sin_port = htons(40000);
    inet_pton(AF_INET, a.ip.c_str(), &s.sin_addr);
    inet_pton(AF_INET, b.ip.c_str(), &d.sin_addr);
    cm::encode_ip_header(ip, r.private_data);
    cm::encode(r, comm_id, mad);
  }

  static bool recv_msg(int fd, cm::Msg& m) {
    uint8_t buf[cm::kMadSize + 1];
    for (int i = 0; i < 200; ++i) {
      ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == ssize_t(cm::kMadSize)) return cm::decode(buf, cm::kMadSize, m);
      if (n == 0) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  static bool nothing(int fd) {
    uint8_t buf[cm::kMadSize + 1];
    return ::recv(fd, buf, sizeof buf, MSG_DONTWAIT) < 0 && errno == EAGAIN;
  }
  static void send_mad(int fd, const uint8_t* mad) {
    ASSERT_EQ(::send(fd, mad, cm::kMadSize, MSG_NOSIGNAL), ssize_t(cm::kMadSize));
  }
  Fd accept_b(int listener) {
    for (int i = 0; i < 200; ++i) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) return Fd(fd);
      round();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Fd();
  }

  // REQ, REP, RTU between the library on A and the listener on B.
  void establish(Fd& lib, Fd& child) {
    Fd l = listen_b();
    lib = lib_connect();
    uint8_t mad[cm::kMadSize];
    req(mad);
    send_mad(lib.get(), mad);
    child = accept_b(l.get());
    ASSERT_TRUE(child.valid());
    cm::Msg m;
    ASSERT_TRUE(recv_msg(child.get(), m));
    ASSERT_EQ(m.attr, cm::Attr::kReq);
    cm::Rep rep;
    rep.local_comm_id = 0x2222;
    rep.remote_comm_id = 0x1111;
    cm::encode(rep, 0, mad);
    send_mad(child.get(), mad);
    round();
    ASSERT_TRUE(recv_msg(lib.get(), m));
    ASSERT_EQ(m.attr, cm::Attr::kRep);
    cm::Rtu rtu;
    rtu.local_comm_id = 0x1111;
    rtu.remote_comm_id = 0x2222;
    cm::encode(rtu, 0, mad);
    send_mad(lib.get(), mad);
    round();
    ASSERT_TRUE(recv_msg(child.get(), m));
    ASSERT_EQ(m.attr, cm::Attr::kRtu);
  }

  Host a, b;
  Datagram last;
};

constexpr uint16_t kReq = 0x10, kMra = 0x11, kRej = 0x12, kRep = 0x13, kRtu = 0x14, kDreq = 0x15, kDrep = 0x16;

// IBTA 13.5.1: a MAD on QP1 is a UD SEND Only to QP 1 from QP 1 with the
// GSI Q_Key and the default P_Key; the REQ reaches the listener unchanged.
TEST_F(CmGatewayTest, RelaysTheHandshakeAndTheTeardown) {
  Fd l = listen_b();
  Fd lib = lib_connect();
  uint8_t mad[cm::kMadSize];
  req(mad);
  send_mad(lib.get(), mad);
  settle(a);
  auto got = b.arrivals();
  ASSERT_EQ(got.size(), 1u);
  roce::Packet p;
  ASSERT_EQ(roce::parse_packet(got[0].bytes, true, &p), roce::ParseError::kOk);
  EXPECT_EQ(p.bth.opcode, 0x64);
  EXPECT_EQ(p.bth.dest_qp, 1u);
  EXPECT_EQ(p.bth.pkey, 0xffff);
  EXPECT_EQ(p.deth.qkey, 0x80010000u);
  EXPECT_EQ(p.deth.src_qp, 1u);
  ASSERT_EQ(p.payload.size(), cm::kMadSize);
  EXPECT_EQ(std::memcmp(p.payload.data(), mad, cm::kMadSize), 0);
  b.deliver(got[0]);
  Fd child = accept_b(l.get());
  ASSERT_TRUE(child.valid());
  uint8_t in[cm::kMadSize + 1];
  ASSERT_EQ(::recv(child.get(), in, sizeof in, 0), ssize_t(cm::kMadSize));
  EXPECT_EQ(std::memcmp(in, mad, cm::kMadSize), 0);
  EXPECT_EQ(b.gw.stats().bad, 0u);

  // REP / RTU, then DREQ / DREP, each to the other side once.
  cm::Msg m;
  cm::Rep rep;
  rep.local_comm_id = 0x2222;
  rep.remote_comm_id = 0x1111;
  cm::encode(rep, 0, mad);
  send_mad(child.get(), mad);
  EXPECT_EQ(round(), std::vector<uint16_t>{kRep});
  ASSERT_TRUE(recv_msg(lib.get(), m));
  EXPECT_EQ(m.attr, cm::Attr::kRep);
  cm::Rtu rtu;
  rtu.local_comm_id = 0x1111;
  rtu.remote_comm_id = 0x2222;
  cm::encode(rtu, 0, mad);
  send_mad(lib.get(), mad);
  EXPECT_EQ(round(), std::vector<uint16_t>{kRtu});
  ASSERT_TRUE(recv_msg(child.get(), m));
  EXPECT_EQ(m.attr, cm::Attr::kRtu);
  cm::Dreq dreq;
  dreq.local_comm_id = 0x2222;
  dreq.remote_comm_id = 0x1111;
  cm::encode(dreq, 0, mad);
  send_mad(child.get(), mad);
  EXPECT_EQ(round(), std::vector<uint16_t>{kDreq});
  ASSERT_TRUE(recv_msg(lib.get(), m));
  EXPECT_EQ(m.attr, cm::Attr::kDreq);
  cm::Drep drep;
  drep.local_comm_id = 0x1111;
  drep.remote_comm_id = 0x2222;
  cm::encode(drep, 0, mad);
  send_mad(lib.get(), mad);
  EXPECT_EQ(round(), std::vector<uint16_t>{kDrep});
  ASSERT_TRUE(recv_msg(child.get(), m));
  EXPECT_EQ(m.attr, cm::Attr::kDrep);
  // Answered: nothing is sent again.
  EXPECT_TRUE(rounds(250).empty());
  EXPECT_EQ(a.gw.stats().retransmitted + b.gw.stats().retransmitted, 0u);
}

// IBTA 12.6.7.2: a REQ for a service nobody listens to is rejected with
// reason 8 (invalid service ID), naming the requester's comm ID.
TEST_F(CmGatewayTest, NoListenerIsRejected) {
  Fd lib = lib_connect();
  uint8_t mad[cm::kMadSize];
  req(mad, 0xabcd);
  send_mad(lib.get(), mad);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(round(), (std::vector<uint16_t>{kReq}));  // waits for a listener first
  EXPECT_EQ(until([&] { return b.gw.stats().rejected_no_listener > 0; }), (std::vector<uint16_t>{kRej}));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
  cm::Msg m;
  ASSERT_TRUE(recv_msg(lib.get(), m));
  ASSERT_EQ(m.attr, cm::Attr::kRej);
  EXPECT_EQ(m.rej.reason, cm::kRejInvalidServiceId);
  EXPECT_EQ(m.rej.remote_comm_id, 0xabcdu);
  EXPECT_EQ(b.gw.stats().rejected_no_listener, 1u);
  EXPECT_TRUE(rounds(250).empty());  // a REJ ends it: no retransmission
}

// A REQ that comes just before its listener (perftest's server listens
// only after a handshake its client leaves first) reaches the listener;
// a duplicate meanwhile does not make a second CONNECT_REQUEST.
TEST_F(CmGatewayTest, ListenerJustLateGetsTheRequest) {
  Fd lib = lib_connect();
  uint8_t mad[cm::kMadSize];
  req(mad);
  send_mad(lib.get(), mad);
  settle(a);
  auto reqs = b.arrivals();
  ASSERT_EQ(reqs.size(), 1u);
  b.deliver(reqs[0]);
  b.deliver(reqs[0]);  // a retransmission while parked
  EXPECT_EQ(b.gw.stats().duplicates, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  Fd l = listen_b();
  Fd child = accept_b(l.get());
  ASSERT_TRUE(child.valid());
  cm::Msg m;
  ASSERT_TRUE(recv_msg(child.get(), m));
  EXPECT_EQ(m.attr, cm::Attr::kReq);
  EXPECT_TRUE(nothing(child.get()));
  EXPECT_EQ(b.gw.stats().rejected_no_listener, 0u);
  EXPECT_TRUE(nothing(lib.get()));  // no REJ went back
}

// IBTA 12.9: a lost REP is sent again; a duplicate REQ before the
// application answers gets an MRA, not a second CONNECT_REQUEST; a
// duplicate REP gets the RTU again and never reaches the library.
TEST_F(CmGatewayTest, LossesAndDuplicates) {
  Fd l = listen_b();
  Fd lib = lib_connect();
  uint8_t mad[cm::kMadSize];
  req(mad);
  send_mad(lib.get(), mad);
  settle(a);
  auto reqs = b.arrivals();
  ASSERT_EQ(reqs.size(), 1u);
  b.deliver(reqs[0]);
  b.deliver(reqs[0]);  // the REQ again
  EXPECT_EQ(b.gw.stats().duplicates, 1u);
  auto mra = a.arrivals();
  ASSERT_EQ(mra.size(), 1u);
  EXPECT_EQ(mra[0].attr(), kMra);
  a.deliver(mra[0]);
  Fd child = accept_b(l.get());
  ASSERT_TRUE(child.valid());
  cm::Msg m;
  ASSERT_TRUE(recv_msg(child.get(), m));
  EXPECT_EQ(m.attr, cm::Attr::kReq);
  EXPECT_TRUE(nothing(child.get()));  // one CONNECT_REQUEST
  EXPECT_TRUE(nothing(lib.get()));    // the MRA is the gateway's business

  cm::Rep rep;
  rep.local_comm_id = 0x2222;
  rep.remote_comm_id = 0x1111;
  cm::encode(rep, 0, mad);
  send_mad(child.get(), mad);
  int lost = 0;
  auto sent = until(readable(lib.get(), m), [&](const Datagram& d) { return d.attr() != kRep || lost++ > 0; });
  EXPECT_EQ(m.attr, cm::Attr::kRep);
  EXPECT_EQ(std::count(sent.begin(), sent.end(), kRep), 2);  // lost once, sent again
  EXPECT_EQ(b.gw.stats().retransmitted, 1u);
  EXPECT_TRUE(nothing(lib.get()));

  cm::Rtu rtu;
  rtu.local_comm_id = 0x1111;
  rtu.remote_comm_id = 0x2222;
  cm::encode(rtu, 0, mad);
  send_mad(lib.get(), mad);
  // The RTU is lost: B sends the REP again, A answers the duplicate with the RTU.
  int rtus = 0;
  sent = until(readable(child.get(), m), [&](const Datagram& d) { return d.attr() != kRtu || rtus++ > 0; });
  EXPECT_EQ(m.attr, cm::Attr::kRtu);
  // (in any order: B's timer may fire before the lost RTU is collected)
  EXPECT_EQ(std::count(sent.begin(), sent.end(), kRtu), 2);
  EXPECT_EQ(std::count(sent.begin(), sent.end(), kRep), 1);
  EXPECT_EQ(sent.size(), 3u);
  EXPECT_TRUE(nothing(child.get()));
  EXPECT_TRUE(nothing(lib.get()));  // no second REP for the library
  EXPECT_TRUE(rounds(250).empty());  // established: quiet
}

// A REQ nobody answers: sent 1 + SOFTVERBS_CM_RETRIES times, then a REJ
// "timeout" (IBTA 12.9.5) and the library's connection closes (UNREACHABLE).
TEST_F(CmGatewayTest, UnansweredRequestGivesUp) {
  Fd lib = lib_connect();
  uint8_t mad[cm::kMadSize];
  req(mad);
  send_mad(lib.get(), mad);
  bool closed = false;
  auto sent = until(
      [&] {
        uint8_t buf[cm::kMadSize];
        return closed = ::recv(lib.get(), buf, sizeof buf, MSG_DONTWAIT) == 0;
      },
      [](const Datagram&) { return false; });  // B is not there
  EXPECT_TRUE(closed);
  ASSERT_EQ(sent, (std::vector<uint16_t>{kReq, kReq, kReq, kReq, kRej}));
  cm::Msg m;
  ASSERT_TRUE(cm::decode(last.mad(), cm::kMadSize, m));
  EXPECT_EQ(m.rej.reason, cm::kRejTimeout);
}

// The library's end closes on an established connection (the process
// died): the gateway sends the DREQ for it, until the DREP comes.
TEST_F(CmGatewayTest, ProcessGoneEndsTheConnection) {
  Fd lib, child;
  establish(lib, child);
  lib.reset();
  int dreqs = 0;
  cm::Msg m;
  auto sent = until(readable(child.get(), m), [&](const Datagram& d) { return d.attr() != kDreq || dreqs++ > 0; });
  EXPECT_EQ(sent, (std::vector<uint16_t>{kDreq, kDreq}));  // the first lost
  ASSERT_EQ(m.attr, cm::Attr::kDreq);
  EXPECT_EQ(m.dreq.local_comm_id, 0x1111u);
  EXPECT_EQ(m.dreq.remote_comm_id, 0x2222u);
  uint8_t mad[cm::kMadSize];
  cm::Drep drep;
  drep.local_comm_id = 0x2222;
  drep.remote_comm_id = 0x1111;
  cm::encode(drep, 0, mad);
  send_mad(child.get(), mad);
  EXPECT_EQ(round(), std::vector<uint16_t>{kDrep});
  EXPECT_TRUE(rounds(250).empty());
}

// What arrives is checked: a corrupted datagram (bad ICRC) is dropped; an
// IPv4 datagram whose ICRC covers a non-zero IP ID (Linux rxe) is taken.
TEST_F(CmGatewayTest, IcrcChecked) {
  Fd l = listen_b();
  Fd lib = lib_connect();
  uint8_t mad[cm::kMadSize];
  req(mad);
  send_mad(lib.get(), mad);
  settle(a);
  auto got = b.arrivals();
  ASSERT_EQ(got.size(), 1u);
  Datagram bad = got[0];
  bad.bytes[20 + 24 + 8] ^= 1;  // a bit of the service ID
  b.deliver(bad);
  EXPECT_EQ(b.gw.stats().bad, 1u);
  EXPECT_LT(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC), 0);

  // The same transport packet framed with IP ID 0x1234.
  roce::Ipv4Udp h;
  inet_pton(AF_INET, a.ip.c_str(), h.src.data());
  inet_pton(AF_INET, b.ip.c_str(), h.dst.data());
  h.sport = ntohs(reinterpret_cast<sockaddr_in&>(got[0].from).sin_port);
  h.id = 0x1234;
  uint8_t frame[1024];
  size_t n = roce::frame_ipv4(h, std::span<const uint8_t>(got[0].bytes.data(), got[0].bytes.size() - 4), frame);
  ASSERT_GT(n, 28u);
  Datagram with_id = got[0];
  with_id.bytes.assign(frame + 28, frame + n);
  EXPECT_NE(roce::icrc_load(with_id.bytes.data() + with_id.bytes.size() - 4),
            roce::icrc_load(got[0].bytes.data() + got[0].bytes.size() - 4));
  b.deliver(with_id);
  EXPECT_EQ(b.gw.stats().bad, 1u);
  EXPECT_TRUE(accept_b(l.get()).valid());
}

}  // namespace
}  // namespace sv::daemon
