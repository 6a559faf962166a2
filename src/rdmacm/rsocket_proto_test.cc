// rsocket_proto_test.cc: the rsocket wire encoding and bookkeeping
// (rsocket_proto.h), no verbs, no sockets.
#include "rdmacm/rsocket_proto.h"

#include <endian.h>
#include <gtest/gtest.h>

#include <numeric>

using namespace sv::rsock;

TEST(RsocketProto, ImmediateDataIsOpInTheTopThreeBits) {
  EXPECT_EQ(msg_set(kOpData, 4096), 4096u);
  EXPECT_EQ(msg_set(kOpSgl, 7), 0x80000007u);
  EXPECT_EQ(msg_set(kOpCtrl, kCtrlShutdown), 0xE0000002u);
  EXPECT_EQ(msg_op(0xC0000003u), kOpIomapSgl);
  EXPECT_EQ(msg_data(0xC0000003u), 3u);
  EXPECT_EQ(msg_data(msg_set(kOpData, 0x3FFFFFFF)), 0x1FFFFFFFu);  // 29 bits
}

TEST(RsocketProto, ScaleIsRsocketsEightBitEncoding) {
  EXPECT_EQ(value_to_scale(0, 8), 0);
  EXPECT_EQ(value_to_scale(128, 8), 128);
  EXPECT_EQ(value_to_scale(512, 8), 0x82);
  EXPECT_EQ(scale_to_value(0x82, 8), 512);
  EXPECT_EQ(scale_to_value(value_to_scale(1000, 8), 8), 768);  // rounded down to a multiple of 256
}

TEST(RsocketProto, ConnDataIsBigEndianVersionOne) {
  ConnInfo in;
  in.target_sgl = Sge{0x1122334455667788ull, 0xAABBCCDD, 2};
  in.data_buf = Sge{0x1000, 0x42, 65536};
  in.credits = 384;
  in.iomap_size = 512;
  ConnData cd;
  encode_conn(in, &cd);
  const auto* b = reinterpret_cast<const uint8_t*>(&cd);
  EXPECT_EQ(b[0], 1);                                     // version
  EXPECT_EQ(b[1] & kConnFlagIomap, kConnFlagIomap);       // flags
  EXPECT_EQ((b[2] << 8) | b[3], 384);                     // credits, big endian
  EXPECT_EQ(b[7], 0x82);                                  // iomap size, scaled
  EXPECT_EQ(b[8], 0x11);                                  // target_sgl.addr, big endian
  EXPECT_EQ(be32toh(cd.target_sgl.key), 0xAABBCCDDu);
  EXPECT_EQ(be32toh(cd.data_buf.length), 65536u);
  ConnInfo out;
  ASSERT_TRUE(decode_conn(&cd, sizeof(cd), &out));
  EXPECT_EQ(out.target_sgl.addr, in.target_sgl.addr);
  EXPECT_EQ(out.data_buf.key, 0x42u);
  EXPECT_EQ(out.credits, 384);
  EXPECT_EQ(out.iomap_size, 512);
  EXPECT_TRUE(out.iomap);
  EXPECT_FALSE(out.swap);
  EXPECT_FALSE(decode_conn(&cd, sizeof(cd) - 1, &out));
  cd.version = 2;
  EXPECT_FALSE(decode_conn(&cd, sizeof(cd), &out));
}

TEST(RsocketProto, PeerOfTheOtherByteOrderGetsSwappedSgls) {
  ConnData cd;
  encode_conn(ConnInfo{}, &cd);
  cd.flags ^= kConnFlagNet;
  ConnInfo out;
  ASSERT_TRUE(decode_conn(&cd, sizeof(cd), &out));
  EXPECT_TRUE(out.swap);
  Sge s = wire_sge(Sge{1, 2, 3}, true);
  EXPECT_EQ(s.addr, uint64_t(1) << 56);
  EXPECT_EQ(s.key, uint32_t(2) << 24);
  EXPECT_EQ(wire_sge(Sge{1, 2, 3}, false).length, 3u);
}

TEST(RsocketProto, RecvRingDeliversInOrderAcrossPartialReads) {
  std::vector<uint8_t> rbuf(64);
  std::iota(rbuf.begin(), rbuf.end(), 0);
  RecvRing r;
  r.reset(64, 4);
  EXPECT_TRUE(r.empty());
  ASSERT_TRUE(r.push(10));
  ASSERT_TRUE(r.push(6));
  EXPECT_EQ(r.queued_bytes(), 16u);
  uint8_t out[16] = {};
  EXPECT_EQ(r.take(rbuf.data(), out, 4, true), 4u);  // peek leaves it
  EXPECT_EQ(r.queued_bytes(), 16u);
  EXPECT_EQ(r.take(rbuf.data(), out, 4, false), 4u);
  EXPECT_EQ(out[3], 3);
  EXPECT_EQ(r.seq(), 0);  // the first message is not consumed yet
  EXPECT_EQ(r.take(rbuf.data(), out, 16, false), 12u);
  EXPECT_EQ(out[0], 4);
  EXPECT_EQ(out[11], 15);
  EXPECT_EQ(r.seq(), 2);
  EXPECT_TRUE(r.empty());
}

TEST(RsocketProto, RecvRingQueueHoldsRqSizeMessages) {
  RecvRing r;
  r.reset(1024, 3);
  EXPECT_TRUE(r.push(1));
  EXPECT_TRUE(r.push(1));
  EXPECT_TRUE(r.push(1));
  EXPECT_FALSE(r.push(1));  // the peer overran its credits
}

TEST(RsocketProto, CreditsGrantHalvesOnceConsumed) {
  std::vector<uint8_t> rbuf(128), out(128);
  RecvRing r;
  r.reset(128, 8);
  // The first half is the connect data's; the second is free at once.
  ASSERT_TRUE(r.want_credit());
  int64_t half;
  EXPECT_EQ(r.grant(&half), 8u);  // rseq_no 0 + rq_size
  EXPECT_EQ(half, 64);
  EXPECT_FALSE(r.want_credit());
  // 64 bytes in 4 messages consumed: the first half is free again.
  for (int i = 0; i < 4; i++) ASSERT_TRUE(r.push(16));
  EXPECT_EQ(r.take(rbuf.data(), out.data(), 64, false), 64u);
  ASSERT_TRUE(r.want_credit());
  EXPECT_EQ(r.grant(&half), 12u);
  EXPECT_EQ(half, 0);
  // Half the credits used with no buffer to give: a bare credit update.
  for (int i = 0; i < 4; i++) ASSERT_TRUE(r.push(1));
  EXPECT_EQ(r.take(rbuf.data(), out.data(), 4, false), 4u);
  ASSERT_TRUE(r.want_credit());
  EXPECT_EQ(r.grant(&half), 16u);
  EXPECT_EQ(half, -1);
}

TEST(RsocketProto, SendPiecesWrapAtTheEndOfTheBuffer) {
  uint32_t pos = 0;
  Piece p[2];
  EXPECT_EQ(send_pieces(100, &pos, 60, p), 1);
  EXPECT_EQ(pos, 60u);
  EXPECT_EQ(send_pieces(100, &pos, 40, p), 1);
  EXPECT_EQ(pos, 0u);
  pos = 90;
  EXPECT_EQ(send_pieces(100, &pos, 30, p), 2);
  EXPECT_EQ(p[0].offset, 90u);
  EXPECT_EQ(p[0].length, 10u);
  EXPECT_EQ(p[1].offset, 0u);
  EXPECT_EQ(p[1].length, 20u);
  EXPECT_EQ(pos, 20u);
}

TEST(RsocketProto, TransfersGrowFrom2KiBTo64KiB) {
  uint32_t olen = kOlapStart;
  EXPECT_EQ(next_xfer(&olen, 1 << 20, 1 << 20, 1 << 20), 2048u);
  EXPECT_EQ(next_xfer(&olen, 1 << 20, 1 << 20, 1 << 20), 4096u);
  for (int i = 0; i < 10; i++) next_xfer(&olen, 1 << 20, 1 << 20, 1 << 20);
  EXPECT_EQ(next_xfer(&olen, 1 << 20, 1 << 20, 1 << 20), kMaxTransfer);
  EXPECT_EQ(next_xfer(&olen, 100, 1 << 20, 1 << 20), 100u);
  EXPECT_EQ(next_xfer(&olen, 1 << 20, 3000, 1 << 20), 3000u);  // send buffer
  EXPECT_EQ(next_xfer(&olen, 1 << 20, 1 << 20, 500), 500u);    // peer's half
}
