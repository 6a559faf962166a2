// Issue 18, finding 2: ibv_import_device(3) joins the context of the
// connection whose socket is passed. nobody must not join root's context,
// neither with root's real client socket (passed to it) nor with anything
// that merely looks like it (a socket file opened O_PATH, another user's
// socket).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "attack.h"

namespace svsec {
namespace {

using sv::Fd;
namespace proto = sv::proto;

// A raw client: Hello, then ImportContext with `fd`; the status.
int raw_import(const std::string& socket, int fd) {
  RawConn raw(socket);
  if (!raw.ok()) return -100;
  proto::Empty hello{};
  proto::HelloReply rep{};
  std::vector<Fd> got;
  if (raw.call(proto::Op::Hello, hello, rep, {}, &got) != 0) return -101;
  proto::Empty req{};
  int fds[1] = {fd};
  return raw.call(proto::Op::ImportContext, req, std::span<const int>(fds));
}

// Root's real client socket, passed to nobody: nobody's import of it (by the
// library and by a raw client) is refused, as the kernel's uverbs refuses a
// context fd to no one but only because a fd is a capability; here the
// daemon re-checks the importer's user at every import.
TEST(ContextIdentity, AnotherUserCannotImportRootsContext) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  Child nobody(true, [sock](int s) {
    int dummy = 0;
    std::vector<Fd> fds;
    if (!recv_val(s, dummy, &fds) || fds.size() != 1) return 100;
    int raw = raw_import(sock, fds[0].get());
    errno = 0;
    ibv_context* c = ibv_import_device(fds[0].get());
    int lib = c ? 0 : errno;
    if (c) {
      // Joined: show what it reaches (root's MR, by its handle).
      ibv_pd* pd = ibv_import_pd(c, 1);
      (void)pd;
    }
    int res[2] = {raw, lib};
    send_bytes(s, res, sizeof(res));
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  int dummy = 0;
  int fd[1] = {c->cmd_fd};
  ASSERT_TRUE(send_val(nobody.sock(), dummy, fd));
  int res[2] = {-1, -1};
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof(res)));
  EXPECT_TRUE(res[0] == EPERM || res[0] == EACCES) << "raw import: " << res[0];
  EXPECT_TRUE(res[1] == EPERM || res[1] == EACCES) << "ibv_import_device: " << res[1];
  EXPECT_EQ(0, nobody.wait());
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
  EXPECT_TRUE(sysd.alive());
}

// Something that looks like a socket but is not one: an O_PATH descriptor
// of a socket file (fstat says S_ISSOCK, its inode is a file system's, not
// sockfs'). The daemon refuses it whatever its inode number is. Also a real
// socket that belongs to no daemon connection.
TEST(ContextIdentity, NonSocketsAndStrangersAreRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  Child nobody(true, [sock](int s) {
    char dir[] = "/tmp/sv-ident-XXXXXX";
    if (!mkdtemp(dir)) return 100;
    std::string path = std::string(dir) + "/sock";
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return 101;
    int opath = open(path.c_str(), O_PATH | O_CLOEXEC);
    struct stat st {};
    if (opath < 0 || fstat(opath, &st) != 0 || !S_ISSOCK(st.st_mode)) return 102;
    int r1 = raw_import(sock, opath);
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) return 103;
    int r2 = raw_import(sock, sp[0]);
    int r3 = raw_import(sock, l);
    close(opath);
    close(l);
    unlink(path.c_str());
    rmdir(dir);
    int res[3] = {r1, r2, r3};
    send_bytes(s, res, sizeof(res));
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  int res[3] = {0, 0, 0};
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof(res)));
  EXPECT_NE(0, res[0]) << "O_PATH socket file";
  EXPECT_NE(0, res[1]) << "a socketpair of its own";
  EXPECT_NE(0, res[2]) << "a listening socket of its own";
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

// The same user keeps ibv_import_device between its own processes.
TEST(ContextIdentity, SameUserStillImports) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child peer(false, [](int s) {
    int dummy = 0;
    std::vector<Fd> fds;
    if (!recv_val(s, dummy, &fds) || fds.size() != 1) return 100;
    ibv_context* c = ibv_import_device(fds[0].get());
    if (!c) return 101;
    uint32_t handle = 0;
    if (!recv_val(s, handle)) return 102;
    ibv_pd* pd = ibv_import_pd(c, handle);
    int ok = pd ? 1 : 0;
    send_val(s, ok);
    if (pd) ibv_unimport_pd(pd);
    ibv_close_device(c);
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  peer.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  int dummy = 0;
  int fd[1] = {c->cmd_fd};
  ASSERT_TRUE(send_val(peer.sock(), dummy, fd));
  ASSERT_TRUE(send_val(peer.sock(), pd->handle));
  int ok = 0;
  ASSERT_TRUE(recv_val(peer.sock(), ok));
  EXPECT_EQ(1, ok);
  EXPECT_EQ(0, peer.wait());
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

}  // namespace
}  // namespace svsec
