// libibverbs, loaded at run time: the C++ core must import on hosts with no RDMA stack (the
// common case), so it never links against libibverbs. Only the exported functions are loaded;
// the data-path calls (post_send, post_recv, poll_cq, req_notify_cq) are inline in verbs.h and go
// through the device context's own table, so they need no symbol.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace r2cc {

struct IbvApi {
  ibv_device** (*get_device_list)(int* num);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* dev);
  ibv_context* (*open_device)(ibv_device* dev);
  int (*query_device)(ibv_context* ctx, ibv_device_attr* attr);
  int (*query_port)(ibv_context* ctx, uint8_t port, ibv_port_attr* attr);  // the compat entry point
  int (*query_gid)(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid);
  ibv_pd* (*alloc_pd)(ibv_context* ctx);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_comp_channel* (*create_comp_channel)(ibv_context* ctx);
  int (*destroy_comp_channel)(ibv_comp_channel* ch);
  ibv_cq* (*create_cq)(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* ch, int vector);
  int (*destroy_cq)(ibv_cq* cq);
  int (*get_cq_event)(ibv_comp_channel* ch, ibv_cq** cq, void** cq_context);
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroy_qp)(ibv_qp* qp);
  const char* (*wc_status_str)(ibv_wc_status status);
};

// The loaded library, or nullptr with *why saying what is missing (and what to install).
const IbvApi* ibv_api(std::string* why = nullptr);

}  // namespace r2cc
