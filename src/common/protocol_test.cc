// The op table (protocol.h): its declarations are consistent, and
// docs/PROTOCOL.md's op list says what the table says, row for row.
#include "common/protocol.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace sv::proto {
namespace {

std::string fd_text(FdCount f) {
  return f.min == f.max ? std::to_string(f.min) : std::to_string(f.min) + "-" + std::to_string(f.max);
}

std::string kinds(uint16_t bits) {
  std::string s;
  for (size_t i = 0; i < std::size(kObjNames); ++i) {
    if (!(bits & (1u << i))) continue;
    if (!s.empty()) s += ", ";
    s += kObjNames[i];
  }
  return s;
}

std::string handles_text(const Handles& h) {
  std::string s;
  auto add = [&s](const char* verb, uint16_t bits) {
    if (!bits) return;
    if (!s.empty()) s += "; ";
    s += std::string(verb) + " " + kinds(bits);
  };
  add("reads", h.reads);
  add("creates", h.creates);
  add("destroys", h.destroys);
  return s.empty() ? "-" : s;
}

// The op's row in PROTOCOL.md's op list.
std::string row(const OpInfo& i) {
  std::ostringstream o;
  o << "| " << unsigned(i.op) << " | " << i.name << (i.event ? " (event)" : "") << " | `" << i.req_name << "` | `"
    << i.rep_name << "` | " << fd_text(i.in) << " | " << fd_text(i.out) << " | " << handles_text(i.handles) << " |";
  return o.str();
}

TEST(OpTable, EveryOpDeclaredInOrder) {
  ASSERT_EQ(kOps.size(), size_t(Op::kCount) - 1);
  std::set<std::string> names;
  for (size_t i = 0; i < kOps.size(); ++i) {
    EXPECT_EQ(size_t(kOps[i].op), i + 1);
    EXPECT_TRUE(names.insert(kOps[i].name).second) << kOps[i].name;
    EXPECT_LE(kOps[i].in.min, kOps[i].in.max) << kOps[i].name;
    EXPECT_LE(kOps[i].out.min, kOps[i].out.max) << kOps[i].name;
    EXPECT_GE(kOps[i].req_size, sizeof(Header));
    EXPECT_GE(kOps[i].rep_size, sizeof(Header));
  }
  EXPECT_EQ(op_info(0), nullptr);
  EXPECT_EQ(op_info(uint16_t(Op::kCount)), nullptr);
  EXPECT_STREQ(op_info(uint16_t(Op::OpenXrcd))->name, "OpenXrcd");
}

TEST(OpTable, ReplyDescriptorsFollowTheReply) {
  ConnectPeerReply cp{};
  cp.mediated = 1;
  EXPECT_TRUE(reply_matches<Command<Op::ConnectPeer>>(cp, 0));
  EXPECT_FALSE(reply_matches<Command<Op::ConnectPeer>>(cp, 2));
  cp.mediated = 0;
  EXPECT_FALSE(reply_matches<Command<Op::ConnectPeer>>(cp, 0));
  EXPECT_TRUE(reply_matches<Command<Op::ConnectPeer>>(cp, 2));
  cp.has_srq = cp.has_channel = 1;
  EXPECT_TRUE(reply_matches<Command<Op::ConnectPeer>>(cp, 4));
  EXPECT_FALSE(reply_matches<Command<Op::ConnectPeer>>(cp, 3));
  cp.has_srq = cp.has_channel = 0;
  EXPECT_TRUE(reply_matches<Command<Op::ConnectPeer>>(cp, 2));
  EXPECT_FALSE(reply_matches<Command<Op::ConnectXrc>>(cp, 2));  // XRC: always the SRQ
  ImportCqReply cq{};
  EXPECT_TRUE(reply_matches<Command<Op::ImportCq>>(cq, 0));  // granted by name: no segment
  EXPECT_FALSE(reply_matches<Command<Op::GetCq>>(cq, 0));
  cq.segment_size = 4096;
  EXPECT_TRUE(reply_matches<Command<Op::ImportCq>>(cq, 1));
  EXPECT_FALSE(reply_matches<Command<Op::ImportCq>>(cq, 0));
  RoceAttachReply ra{};
  EXPECT_TRUE(reply_matches<Command<Op::RoceAttach>>(ra, 2));
  EXPECT_FALSE(reply_matches<Command<Op::RoceAttach>>(ra, 1));
}

// docs/PROTOCOL.md, "Op list": one row per op, exactly as row() writes it,
// and no other row.
TEST(OpTable, ProtocolDocListsEveryOp) {
  std::ifstream f(std::string(SOFTVERBS_SOURCE_DIR) + "/docs/PROTOCOL.md");
  ASSERT_TRUE(f.good());
  std::set<std::string> doc;
  bool in_list = false;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("## ", 0) == 0) in_list = line == "## Op list";
    if (in_list && line.rfind("| ", 0) == 0 && line.size() > 2 && std::isdigit(static_cast<unsigned char>(line[2])))
      doc.insert(line);
  }
  std::string expected;
  size_t missing = 0;
  for (const OpInfo& i : kOps) {
    expected += row(i) + "\n";
    if (!doc.count(row(i))) {
      ++missing;
      ADD_FAILURE() << "PROTOCOL.md's op list lacks or differs from: " << row(i);
    }
  }
  EXPECT_EQ(doc.size(), kOps.size()) << "rows for ops the table does not declare";
  if (missing || doc.size() != kOps.size()) std::fprintf(stderr, "The op list, from the table:\n%s", expected.c_str());
}

}  // namespace
}  // namespace sv::proto
