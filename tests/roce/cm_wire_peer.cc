// cm_wire_peer: one side of an rdma_cm connection attempt, for the
// between-hosts tests (cm_wire_test.sh), run under `softverbs run` in a
// namespace of the test bed.
//
//   cm_wire_peer reject PORT [N]      listen on PORT (IPv4 wildcard), reject
//                                     N requests (1) with private data
//                                     "no-thanks-from-h1"; print "rejected"
//   cm_wire_peer accept PORT          accept the first request, print
//                                     "established" and "pid N", then wait
//                                     to be killed
//   cm_wire_peer connect ADDR PORT N  N attempts: "elapsed_us T" for each
//                                     (rdma_connect to its answer), "median_us"
//   cm_wire_peer connect ADDR PORT [wait]
//                                     connect with private data "hello"; print
//                                     "event NAME status N data TEXT" for the
//                                     event that ends the attempt (with
//                                     "wait", after ESTABLISHED also the next)
// Exit 0 when the program did its part (the event it got is for the test
// to judge), 1 on a failed call.
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

int die(const char* what) {
  std::perror(what);
  return 1;
}

rdma_cm_event* next(rdma_event_channel* ch) {
  rdma_cm_event* e = nullptr;
  if (rdma_get_cm_event(ch, &e)) return nullptr;
  return e;
}

int serve_reject(uint16_t port, int count) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* l = nullptr;
  if (!ch || rdma_create_id(ch, &l, nullptr, RDMA_PS_TCP)) return die("create");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (rdma_bind_addr(l, reinterpret_cast<sockaddr*>(&a)) || rdma_listen(l, 4)) return die("listen");
  for (int i = 0; i < count; ++i) {
    rdma_cm_event* e = next(ch);
    if (!e || e->event != RDMA_CM_EVENT_CONNECT_REQUEST) return die("no CONNECT_REQUEST");
    const char* pd = static_cast<const char*>(e->param.conn.private_data);
    if (i == 0) std::printf("request data %s\n", pd && e->param.conn.private_data_len ? pd : "(none)");
    rdma_cm_id* child = e->id;
    static const char kNo[] = "no-thanks-from-h1";
    if (rdma_reject(child, kNo, sizeof kNo)) return die("rdma_reject");
    rdma_ack_cm_event(e);
    if (i == 0) std::printf("rejected\n");
    std::fflush(stdout);
    rdma_destroy_id(child);
  }
  rdma_destroy_id(l);
  rdma_destroy_event_channel(ch);
  return 0;
}

int serve_accept(uint16_t port) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* l = nullptr;
  if (!ch || rdma_create_id(ch, &l, nullptr, RDMA_PS_TCP)) return die("create");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (rdma_bind_addr(l, reinterpret_cast<sockaddr*>(&a)) || rdma_listen(l, 4)) return die("listen");
  rdma_cm_event* e = next(ch);
  if (!e || e->event != RDMA_CM_EVENT_CONNECT_REQUEST) return die("no CONNECT_REQUEST");
  rdma_cm_id* child = e->id;
  rdma_ack_cm_event(e);
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(child, nullptr, &qa)) return die("rdma_create_qp");
  rdma_conn_param p{};
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  if (rdma_accept(child, &p)) return die("rdma_accept");
  e = next(ch);
  if (!e || e->event != RDMA_CM_EVENT_ESTABLISHED) return die("no ESTABLISHED");
  rdma_ack_cm_event(e);
  std::printf("established\npid %d\n", int(getpid()));
  std::fflush(stdout);
  for (;;) pause();
}

// One attempt; the time from rdma_connect to the event that answers it.
int connect_once(const char* addr, uint16_t port, bool wait, bool quiet, double* us) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return die("create");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) return die("address");
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 2000)) return die("rdma_resolve_addr");
  rdma_cm_event* e = next(ch);
  if (!e || e->event != RDMA_CM_EVENT_ADDR_RESOLVED) return die("ADDR_RESOLVED");
  rdma_ack_cm_event(e);
  if (rdma_resolve_route(id, 2000)) return die("rdma_resolve_route");
  e = next(ch);
  if (!e || e->event != RDMA_CM_EVENT_ROUTE_RESOLVED) return die("ROUTE_RESOLVED");
  rdma_ack_cm_event(e);
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, nullptr, &qa)) return die("rdma_create_qp");
  rdma_conn_param p{};
  static const char kHello[] = "hello";
  p.private_data = kHello;
  p.private_data_len = sizeof kHello;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  auto t0 = std::chrono::steady_clock::now();
  if (rdma_connect(id, &p)) return die("rdma_connect");
  e = next(ch);
  if (!e) return die("rdma_get_cm_event");
  *us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::string data;
  if (e->param.conn.private_data && e->param.conn.private_data_len) {
    const char* d = static_cast<const char*>(e->param.conn.private_data);
    data.assign(d, strnlen(d, e->param.conn.private_data_len));
  }
  if (!quiet) std::printf("event %s status %d data %s\n", rdma_event_str(e->event), e->status, data.c_str());
  std::fflush(stdout);
  const bool established = e->event == RDMA_CM_EVENT_ESTABLISHED;
  rdma_ack_cm_event(e);
  if (wait && established) {
    e = next(ch);
    if (!e) return die("rdma_get_cm_event");
    std::printf("event %s status %d\n", rdma_event_str(e->event), e->status);
    std::fflush(stdout);
    rdma_ack_cm_event(e);
  }
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  return 0;
}

// `count` attempts (the server rejects each): the time of each REQ's answer
// and their median.
int connect_many(const char* addr, uint16_t port, int count) {
  std::vector<double> us;
  for (int i = 0; i < count; ++i) {
    double t = 0;
    if (int r = connect_once(addr, port, false, i > 0, &t)) return r;
    std::printf("elapsed_us %.0f\n", t);
    us.push_back(t);
  }
  std::sort(us.begin(), us.end());
  std::printf("median_us %.0f\n", us[us.size() / 2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if ((argc == 3 || argc == 4) && std::strcmp(argv[1], "reject") == 0)
    return serve_reject(uint16_t(std::atoi(argv[2])), argc == 4 ? std::atoi(argv[3]) : 1);
  if (argc == 3 && std::strcmp(argv[1], "accept") == 0) return serve_accept(uint16_t(std::atoi(argv[2])));
  if (argc == 5 && std::strcmp(argv[1], "connect") == 0 && std::atoi(argv[4]) > 0)
    return connect_many(argv[2], uint16_t(std::atoi(argv[3])), std::atoi(argv[4]));
  double us = 0;
  if ((argc == 4 || (argc == 5 && std::strcmp(argv[4], "wait") == 0)) && std::strcmp(argv[1], "connect") == 0)
    return connect_once(argv[2], uint16_t(std::atoi(argv[3])), argc == 5, false, &us);
  std::fprintf(stderr, "usage: cm_wire_peer reject PORT [N] | accept PORT | connect ADDR PORT [wait | N]\n");
  return 2;
}
