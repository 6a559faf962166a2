#include "daemon/name_space.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace sv::daemon {
namespace {

NsEntry entry(uid_t owner, gid_t group, uint32_t mode) { return NsEntry{proto::kNsMr, 7, 1, owner, group, mode}; }

TEST(NameSpace, NamesArePathsOfPlainComponents) {
  EXPECT_TRUE(NameSpace::valid_name("/a"));
  EXPECT_TRUE(NameSpace::valid_name("/app-1/mr_0.data"));
  for (const char* bad : {"", "/", "a", "a/b", "/a/", "//a", "/a//b", "/./a", "/a/..", "/a b", "/a\n", "/a*"})
    EXPECT_FALSE(NameSpace::valid_name(bad)) << bad;
  EXPECT_TRUE(NameSpace::valid_name("/" + std::string(proto::kMaxNsName - 2, 'x')));
  EXPECT_FALSE(NameSpace::valid_name("/" + std::string(proto::kMaxNsName - 1, 'x')));
}

TEST(NameSpace, ExactlyOneClassOfBitsIsChecked) {
  NsEntry e = entry(1000, 100, 0604);  // owner rw, group nothing, other r
  Credentials owner{1000, 100, {}}, member{1001, 100, {}}, supp{1002, 5, {7, 100}}, other{1003, 5, {}}, root{0, 0, {}};
  EXPECT_TRUE(NameSpace::permitted(e, owner, proto::kNsRead | proto::kNsWrite));
  EXPECT_FALSE(NameSpace::permitted(e, member, proto::kNsRead));  // group class: no bits, though other has r
  EXPECT_FALSE(NameSpace::permitted(e, supp, proto::kNsRead));    // a supplementary group counts as the group
  EXPECT_TRUE(NameSpace::permitted(e, other, proto::kNsRead));
  EXPECT_FALSE(NameSpace::permitted(e, other, proto::kNsWrite));
  EXPECT_TRUE(NameSpace::permitted(e, root, proto::kNsRead | proto::kNsWrite));
  NsEntry closed = entry(1000, 100, 0);
  EXPECT_FALSE(NameSpace::permitted(closed, owner, proto::kNsRead));  // as a file: mode 0 shuts the owner out
}

TEST(NameSpace, PublishLookupUnpublishGiveFilesystemErrors) {
  NameSpace ns;
  Credentials owner{1000, 100, {}}, other{1003, 5, {}}, root{0, 0, {}};
  EXPECT_EQ(0, ns.publish("/x", entry(1000, 100, 0640)));
  EXPECT_EQ(EEXIST, ns.publish("/x", entry(1000, 100, 0640)));
  EXPECT_EQ(EINVAL, ns.publish("/y", entry(1000, 100, 01000)));
  EXPECT_EQ(EINVAL, ns.publish("y", entry(1000, 100, 0640)));
  NsEntry out{};
  EXPECT_EQ(0, ns.lookup("/x", owner, proto::kNsRead, out));
  EXPECT_EQ(7u, out.handle);
  EXPECT_EQ(EACCES, ns.lookup("/x", other, proto::kNsRead, out));
  EXPECT_EQ(ENOENT, ns.lookup("/nope", owner, proto::kNsRead, out));
  EXPECT_EQ(EPERM, ns.unpublish("/x", other));
  EXPECT_EQ(0, ns.unpublish("/x", owner));
  EXPECT_EQ(ENOENT, ns.unpublish("/x", root));
  EXPECT_EQ(0, ns.publish("/a", entry(1, 1, 0600)));
  EXPECT_EQ(0, ns.publish("/b", NsEntry{proto::kNsCq, 9, 2, 1, 1, 0600}));
  ns.erase("/a");
  EXPECT_EQ(ENOENT, ns.lookup("/a", root, proto::kNsRead, out));
  ns.erase("/b");
  EXPECT_EQ(0u, ns.size());
}

// A per-owner limit: one more name is EDQUOT for that owner only; removing
// one makes room again; the owner index lists exactly its own names.
TEST(NameSpace, PerOwnerLimitIsEdquot) {
  NameSpace ns;
  ns.set_limit(2);
  EXPECT_EQ(0, ns.publish("/u/1", entry(1000, 100, 0600)));
  EXPECT_EQ(0, ns.publish("/u/2", entry(1000, 100, 0600)));
  EXPECT_EQ(EDQUOT, ns.publish("/u/3", entry(1000, 100, 0600)));
  EXPECT_EQ(0, ns.publish("/r/1", entry(0, 0, 0600)));
  EXPECT_EQ(2u, ns.count(1000));
  EXPECT_EQ(2u, ns.names_of(1000).size());
  ns.erase("/u/1");
  EXPECT_EQ(0, ns.publish("/u/3", entry(1000, 100, 0600)));
  EXPECT_EQ("/u/3", ns.after("/u/2")->first);
}

}  // namespace
}  // namespace sv::daemon
