/* install.staged: a program of the svx_* API, compiled against the installed
 * headers and library only (pkg-config or find_package): it publishes a CQ
 * under a name and opens it by that name (svx_publish(3), svx_open(3)). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <softverbs/softverbs.h>

int main(void) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list || n < 1) {
    fprintf(stderr, "svx_hello: no RDMA device\n");
    return 1;
  }
  struct ibv_context *ctx = ibv_open_device(list[0]);
  struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
  if (!cq) {
    fprintf(stderr, "svx_hello: open device / create CQ: %s\n", strerror(errno));
    return 1;
  }
  struct svx_object obj = {.type = SVX_OBJ_CQ, .cq = cq};
  int e = svx_publish(ctx, "/install-test/cq", &obj, 0600, -1);
  if (e) {
    fprintf(stderr, "svx_hello: svx_publish: %s\n", strerror(e));
    return 1;
  }
  struct svx_object got;
  memset(&got, 0, sizeof(got));
  struct ibv_context *opened = svx_open("/install-test/cq", SVX_OPEN_READ, &got);
  if (!opened || got.type != SVX_OBJ_CQ || !got.cq) {
    fprintf(stderr, "svx_hello: svx_open: %s\n", strerror(errno));
    return 1;
  }
  printf("svx_hello: %s: published and opened /install-test/cq\n", ibv_get_device_name(list[0]));
  svx_unimport_cq(got.cq);
  ibv_close_device(opened);
  svx_unpublish(ctx, "/install-test/cq");
  ibv_destroy_cq(cq);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
