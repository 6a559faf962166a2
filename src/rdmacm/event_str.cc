// event_str.cc: rdma_event_str(3), the name of a CM event type.
#include <rdma/rdma_cma.h>

#include <cstring>

#include "common/verbs_current.h"

extern "C" {

const char* rdma_event_str(rdma_cm_event_type event) {
  int type;  // v64's types lie beyond v44's enum: read as an int (verbs_current.h, cm_event_type)
  std::memcpy(&type, &event, sizeof type);
  switch (type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  // rdma-core v64's events (RDMACM_1.4), past the end of v44's enum.
  switch (int(event)) {
    case sv::abi::kCmEventAddrinfoResolved: return "RDMA_CM_EVENT_ADDRINFO_RESOLVED";
    case sv::abi::kCmEventAddrinfoError: return "RDMA_CM_EVENT_ADDRINFO_ERROR";
    case sv::abi::kCmEventUser: return "RDMA_CM_EVENT_USER";
    case sv::abi::kCmEventInternal: return "RDMA_CM_EVENT_INTERNAL";
  }
  return "UNKNOWN EVENT";
}

}  // extern "C"
