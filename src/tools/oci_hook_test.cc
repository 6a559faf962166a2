// The OCI state and config reading of `softverbs cdi-hook` (oci_hook.h):
// the two strings it needs, found in documents of the runtimes' shapes,
// and nothing found in documents that are malformed on the way, hostile
// nesting included.
#include "tools/oci_hook.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <string>

#include "tools/view_ns.h"

namespace sv::tools {
namespace {

TEST(OciHook, FindsStringsByTheirPathOfKeys) {
  const std::string state =
      R"({"ociVersion":"1.0.2","id":"abc","status":"creating","pid":42,)"
      R"("bundle":"/run/containers/storage/overlay-containers/abc/userdata",)"
      R"("annotations":{"io.podman.x":"y","nested":{"bundle":"not this"}}})";
  EXPECT_EQ("/run/containers/storage/overlay-containers/abc/userdata", json_string(state, {"bundle"}));
  EXPECT_EQ("creating", json_string(state, {"status"}));
  EXPECT_EQ("y", json_string(state, {"annotations", "io.podman.x"}));
  EXPECT_EQ("not this", json_string(state, {"annotations", "nested", "bundle"}));
  EXPECT_EQ(std::nullopt, json_string(state, {"pid"})) << "a number is not a string";
  EXPECT_EQ(std::nullopt, json_string(state, {"missing"}));
  EXPECT_EQ(std::nullopt, json_string(state, {}));
  const std::string config = R"({ "ociVersion": "1.0.2", "process": {"args": ["sh", "-c", "x"], "env": []},
    "root" : { "readonly" : false , "path" : "/var/lib/containers/storage/overlay/123/merged" },
    "hooks": {"createContainer": [{"path": "/usr/bin/softverbs", "args": ["softverbs", "cdi-hook"]}]},
    "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "maskedPaths": ["/proc/kcore"]}})";
  EXPECT_EQ("/var/lib/containers/storage/overlay/123/merged", json_string(config, {"root", "path"}));
}

TEST(OciHook, UnescapesStrings) {
  EXPECT_EQ("a\"b\\c/d\n\t", json_string(R"({"k":"a\"b\\c\/d\n\t"})", {"k"}));
  EXPECT_EQ("caf\xc3\xa9", json_string(R"({"k":"caf\u00e9"})", {"k"}));
  EXPECT_EQ("\xf0\x9f\x98\x80", json_string(R"({"k":"\ud83d\ude00"})", {"k"}));
  EXPECT_EQ(std::nullopt, json_string(R"({"k":"\ud83d"})", {"k"})) << "a lone high surrogate";
  EXPECT_EQ(std::nullopt, json_string(R"({"k":"\ude00"})", {"k"})) << "a lone low surrogate";
  EXPECT_EQ(std::nullopt, json_string(R"({"k":"\x"})", {"k"}));
  EXPECT_EQ(std::nullopt, json_string("{\"k\":\"a\nb\"}", {"k"})) << "a raw control character";
}

TEST(OciHook, MalformedOrHostileDocumentsGiveNothing) {
  for (const char* doc : {"", "{", "[]", "\"bundle\"", R"({"bundle")", R"({"bundle":)", R"({"bundle":"/x)",
                          R"({"a":1 "bundle":"/x"})", R"({"a":[1,2,{"b":}],"bundle":"/x"})", R"({,"bundle":"/x"})",
                          R"({"bundle":/x})", R"({"a":{"b":"c"},,"bundle":"/x"})"}) {
    EXPECT_EQ(std::nullopt, json_string(doc, {"bundle"})) << doc;
  }
  // Deep nesting before the key: refused, not a stack overflow.
  std::string deep = R"({"a":)" + std::string(100000, '[') + std::string(100000, ']') + R"(,"bundle":"/x"})";
  EXPECT_EQ(std::nullopt, json_string(deep, {"bundle"}));
  std::string keys_deep;
  for (int i = 0; i < 100000; ++i) keys_deep += R"({"a":)";
  EXPECT_EQ(std::nullopt, json_string(keys_deep, std::vector<std::string>(100000, "a")));
  // Well-formed values of every kind are stepped over.
  EXPECT_EQ("/x", json_string(R"({"n":-1.5e3,"t":true,"f":false,"z":null,"o":{},"l":[],"s":"",)"
                              R"("m":[{"k":[1,"2",{"q":null}]}],"bundle":"/x"})",
                              {"bundle"}));
}

TEST(OciHook, TheRootIsTheConfigsRelativeToTheBundle) {
  std::map<std::string, std::string> files = {
      {"/b1/config.json", R"({"root":{"path":"rootfs"}})"},
      {"/b2/config.json", R"({"root":{"path":"/abs/merged"}})"},
      {"/b3/config.json", R"({"root":{}})"},
  };
  auto reader = [&](const std::string& p, std::string& out) {
    auto it = files.find(p);
    if (it == files.end()) return false;
    out = it->second;
    return true;
  };
  std::string why;
  EXPECT_EQ("/b1/rootfs", container_root(R"({"bundle":"/b1"})", reader, why));
  EXPECT_EQ("/abs/merged", container_root(R"({"bundle":"/b2"})", reader, why));
  EXPECT_EQ(std::nullopt, container_root(R"({"bundle":"/b3"})", reader, why));
  EXPECT_NE(std::string::npos, why.find("root"));
  EXPECT_EQ(std::nullopt, container_root(R"({"bundle":"/nowhere"})", reader, why));
  EXPECT_NE(std::string::npos, why.find("/nowhere/config.json"));
  EXPECT_EQ(std::nullopt, container_root(R"({"id":"x"})", reader, why));
  EXPECT_NE(std::string::npos, why.find("bundle"));
}

// The hook runs before the runtime enters the root, with the image's own
// /sys under it: an image whose /sys leads out of the root (a symlink to
// the host's /sys, resolved before pivot_root) or is not the runtime's
// sysfs gets no view, and nothing is mounted anywhere.
TEST(OciHook, AViewOnlyOnTheRuntimesSysfsInsideTheRoot) {
  char tmpl[] = "/tmp/svhook-XXXXXX";
  ASSERT_NE(nullptr, ::mkdtemp(tmpl));
  const std::string root = tmpl;
  std::string why;
  // /sys -> the host's /sys: the path leaves the root.
  ASSERT_EQ(0, ::symlink("/sys", (root + "/sys").c_str()));
  EXPECT_EQ(EPERM, view::add_sysfs_view(root, why)) << why;
  EXPECT_NE(std::string::npos, why.find("leads to /sys/class")) << why;
  // A plain directory where sysfs belongs: not the runtime's sysfs.
  ASSERT_EQ(0, ::unlink((root + "/sys").c_str()));
  ASSERT_EQ(0, ::mkdir((root + "/sys").c_str(), 0755));
  ASSERT_EQ(0, ::mkdir((root + "/sys/class").c_str(), 0755));
  EXPECT_EQ(EPERM, view::add_sysfs_view(root, why)) << why;
  EXPECT_NE(std::string::npos, why.find("not sysfs")) << why;
  struct stat st {};
  EXPECT_NE(0, ::stat((root + "/sys/class/infiniband").c_str(), &st)) << "nothing was written";
  // No /sys at all.
  ASSERT_EQ(0, ::rmdir((root + "/sys/class").c_str()));
  ASSERT_EQ(0, ::rmdir((root + "/sys").c_str()));
  EXPECT_EQ(ENOENT, view::add_sysfs_view(root, why)) << why;
  ::rmdir(root.c_str());
}

}  // namespace
}  // namespace sv::tools
