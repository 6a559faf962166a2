// device.cc: the process's softverbs device (device.h), rdma_get_devices(3)
// and rdma_free_devices(3).
#include <rdma/rdma_cma.h>

#include <cstdlib>
#include <mutex>

#include "rdmacm/device.h"

namespace sv::rdmacm {
namespace {

std::mutex g_dev_mu;
ibv_context* g_ctx = nullptr;
ibv_pd* g_pd = nullptr;

}  // namespace

bool port_down() {
  ibv_context* c = device();
  ibv_port_attr a{};
  return c && ibv_query_port(c, 1, &a) == 0 && a.state == IBV_PORT_DOWN;
}

ibv_context* device() {
  std::lock_guard<std::mutex> g(g_dev_mu);
  if (g_ctx) return g_ctx;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  if (n > 0) g_ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!g_ctx && n == 0) errno = ENODEV;
  return g_ctx;
}

ibv_context* open_watch_context() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  ibv_context* c = n > 0 ? ibv_open_device(list[0]) : nullptr;
  ibv_free_device_list(list);
  return c;
}

ibv_pd* default_pd() {
  ibv_context* c = device();
  if (!c) return nullptr;
  std::lock_guard<std::mutex> g(g_dev_mu);
  if (!g_pd) g_pd = ibv_alloc_pd(c);
  return g_pd;
}

}  // namespace sv::rdmacm

using namespace sv::rdmacm;

extern "C" {

ibv_context** rdma_get_devices(int* num_devices) {
  ibv_context* c = device();
  auto** list = static_cast<ibv_context**>(std::calloc(2, sizeof(ibv_context*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = c;
  if (num_devices) *num_devices = c ? 1 : 0;
  return list;
}

void rdma_free_devices(ibv_context** list) { std::free(list); }

}  // extern "C"
