// cm_msg_test.cc: the CM codec's accessors and answers shared by the
// library's state machine and the daemon's gateway (src/rdmacm/cm_msg.h).
#include "rdmacm/cm_msg.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

namespace cm = sv::cm;

namespace {

cm::Msg round_trip(const uint8_t* mad) {
  cm::Msg m;
  EXPECT_TRUE(cm::decode(mad, cm::kMadSize, m));
  return m;
}

cm::IpHeader ipv4_header(uint16_t src_port) {
  cm::IpHeader h;
  auto& s = reinterpret_cast<sockaddr_in&>(h.src);
  auto& d = reinterpret_cast<sockaddr_in&>(h.dst);
  s.sin_family = d.sin_family = AF_INET;
  s.sin_port = htons(src_port);
  s.sin_addr.s_addr = htonl(0x0a000001);
  d.sin_addr.s_addr = htonl(0x0a000002);
  return h;
}

TEST(CmMsg, RequestAccessorsOfReqAndSidrReq) {
  uint8_t mad[cm::kMadSize];
  cm::Req req;
  req.local_comm_id = 0x11223344;
  req.service_id = cm::service_id(0x0106, 7471);
  cm::encode_ip_header(ipv4_header(5000), req.private_data);
  cm::encode(req, 9, mad);
  cm::Msg m = round_trip(mad);
  EXPECT_TRUE(cm::is_request(m));
  EXPECT_EQ(cm::request_id(m), 0x11223344u);
  EXPECT_EQ(cm::request_service_id(m), cm::service_id(0x0106, 7471));
  EXPECT_EQ(cm::request_private_data(m), m.req.private_data);
  cm::IpHeader ip;
  ASSERT_TRUE(cm::request_ip_header(m, ip));
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in&>(ip.src).sin_port), 5000);
  EXPECT_EQ(cm::receiver_id(m), 0u);

  cm::SidrReq sreq;
  sreq.request_id = 0x55667788;
  sreq.service_id = cm::service_id(0x0111, 4791);
  cm::encode_ip_header(ipv4_header(6000), sreq.private_data);
  cm::encode(sreq, 10, mad);
  m = round_trip(mad);
  EXPECT_TRUE(cm::is_request(m));
  EXPECT_EQ(cm::request_id(m), 0x55667788u);
  EXPECT_EQ(cm::request_service_id(m), cm::service_id(0x0111, 4791));
  ASSERT_TRUE(cm::request_ip_header(m, ip));
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in&>(ip.src).sin_port), 6000);
  EXPECT_EQ(cm::attr_of(mad), uint16_t(cm::Attr::kSidrReq));
}

// Every answer names the receiver's comm ID in the field IBTA gives it.
TEST(CmMsg, ReceiverIdOfEachAnswer) {
  uint8_t mad[cm::kMadSize];
  cm::Rep rep;
  rep.local_comm_id = 1;
  rep.remote_comm_id = 101;
  cm::encode(rep, 0, mad);
  EXPECT_EQ(cm::receiver_id(round_trip(mad)), 101u);
  cm::Rtu rtu;
  rtu.remote_comm_id = 102;
  cm::encode(rtu, 0, mad);
  EXPECT_EQ(cm::receiver_id(round_trip(mad)), 102u);
  cm::encode_rej(2, 103, cm::kRejectedRep, cm::kRejConsumer, 0, mad);
  cm::Msg m = round_trip(mad);
  EXPECT_EQ(cm::receiver_id(m), 103u);
  EXPECT_EQ(m.rej.local_comm_id, 2u);
  EXPECT_EQ(m.rej.message_rejected, cm::kRejectedRep);
  EXPECT_EQ(m.rej.reason, cm::kRejConsumer);
  cm::encode_dreq(3, 104, 0xabcdef, 0, mad);
  m = round_trip(mad);
  EXPECT_EQ(cm::receiver_id(m), 104u);
  EXPECT_EQ(m.dreq.remote_qpn, 0xabcdefu);
  cm::encode_drep(4, 105, 77, mad);
  m = round_trip(mad);
  EXPECT_EQ(cm::receiver_id(m), 105u);
  EXPECT_EQ(m.tid, 77u);
  cm::Mra mra;
  mra.remote_comm_id = 106;
  cm::encode(mra, 0, mad);
  EXPECT_EQ(cm::receiver_id(round_trip(mad)), 106u);
  cm::encode_sidr_status(107, cm::kSidrRejected, 0, 0, mad);
  m = round_trip(mad);
  EXPECT_EQ(cm::receiver_id(m), 107u);
  EXPECT_EQ(m.sidr_rep.status, cm::kSidrRejected);
  EXPECT_FALSE(cm::is_request(m));
  EXPECT_EQ(cm::request_id(m), 0u);
  EXPECT_EQ(cm::request_private_data(m), nullptr);
  cm::IpHeader ip;
  EXPECT_FALSE(cm::request_ip_header(m, ip));
}

// Nobody listens: a REQ gets a REJ "invalid service ID" (IBTA 12.6.7.2), a
// SIDR_REQ a SIDR_REP "no service" (12.11.3), each with the request's TID.
TEST(CmMsg, NoListenerAnswers) {
  uint8_t mad[cm::kMadSize], out[cm::kMadSize];
  cm::Req req;
  req.local_comm_id = 0x1234;
  cm::encode(req, 0x42, mad);
  cm::encode_no_listener(round_trip(mad), 0x9999, out);
  cm::Msg m = round_trip(out);
  ASSERT_EQ(m.attr, cm::Attr::kRej);
  EXPECT_EQ(m.tid, 0x42u);
  EXPECT_EQ(m.rej.local_comm_id, 0x9999u);
  EXPECT_EQ(m.rej.remote_comm_id, 0x1234u);
  EXPECT_EQ(m.rej.message_rejected, cm::kRejectedReq);
  EXPECT_EQ(m.rej.reason, cm::kRejInvalidServiceId);

  cm::SidrReq sreq;
  sreq.request_id = 0x5678;
  sreq.service_id = cm::service_id(0x0111, 99);
  cm::encode(sreq, 0x43, mad);
  cm::encode_no_listener(round_trip(mad), 0x9999, out);
  m = round_trip(out);
  ASSERT_EQ(m.attr, cm::Attr::kSidrRep);
  EXPECT_EQ(m.tid, 0x43u);
  EXPECT_EQ(m.sidr_rep.request_id, 0x5678u);
  EXPECT_EQ(m.sidr_rep.status, cm::kSidrNoService);
  EXPECT_EQ(m.sidr_rep.service_id, cm::service_id(0x0111, 99));
}

TEST(CmMsg, DecodeRefusesWhatIsNotACmSend) {
  uint8_t mad[cm::kMadSize];
  cm::encode_drep(1, 2, 0, mad);
  cm::Msg m;
  EXPECT_FALSE(cm::decode(mad, cm::kMadSize - 1, m));
  uint8_t bad[cm::kMadSize];
  std::memcpy(bad, mad, sizeof bad);
  bad[1] = 0x01;  // not the CM class
  EXPECT_FALSE(cm::decode(bad, cm::kMadSize, m));
  std::memcpy(bad, mad, sizeof bad);
  bad[17] = 0x20;  // an attribute the CM does not have
  EXPECT_FALSE(cm::decode(bad, cm::kMadSize, m));
}

}  // namespace
