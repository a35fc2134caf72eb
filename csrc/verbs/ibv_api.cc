#include "verbs/ibv_api.h"

#include <dlfcn.h>

#include <mutex>

namespace r2cc {

namespace {

struct Loaded {
  IbvApi api{};
  bool ok = false;
  std::string why;
};

template <typename Fn>
bool load(void* lib, const char* symbol, Fn* out, std::string* why) {
  *out = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (!*out && why->empty()) *why = std::string("libibverbs.so.1 lacks ") + symbol + " (rdma-core too old?)";
  return *out != nullptr;
}

Loaded load_all() {
  Loaded l;
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    l.why = std::string("cannot load libibverbs.so.1 (") + dlerror() +
            "): install rdma-core's libibverbs1 and the NIC's provider (Debian: ibverbs-providers)";
    return l;
  }
  IbvApi& a = l.api;
  bool ok = true;
  ok &= load(lib, "ibv_get_device_list", &a.get_device_list, &l.why);
  ok &= load(lib, "ibv_free_device_list", &a.free_device_list, &l.why);
  ok &= load(lib, "ibv_get_device_name", &a.get_device_name, &l.why);
  ok &= load(lib, "ibv_open_device", &a.open_device, &l.why);
  ok &= load(lib, "ibv_query_device", &a.query_device, &l.why);
  ok &= load(lib, "ibv_query_port", &a.query_port, &l.why);
  ok &= load(lib, "ibv_query_gid", &a.query_gid, &l.why);
  ok &= load(lib, "ibv_alloc_pd", &a.alloc_pd, &l.why);
  ok &= load(lib, "ibv_reg_mr", &a.reg_mr, &l.why);
  ok &= load(lib, "ibv_dereg_mr", &a.dereg_mr, &l.why);
  ok &= load(lib, "ibv_create_comp_channel", &a.create_comp_channel, &l.why);
  ok &= load(lib, "ibv_destroy_comp_channel", &a.destroy_comp_channel, &l.why);
  ok &= load(lib, "ibv_create_cq", &a.create_cq, &l.why);
  ok &= load(lib, "ibv_destroy_cq", &a.destroy_cq, &l.why);
  ok &= load(lib, "ibv_get_cq_event", &a.get_cq_event, &l.why);
  ok &= load(lib, "ibv_ack_cq_events", &a.ack_cq_events, &l.why);
  ok &= load(lib, "ibv_create_qp", &a.create_qp, &l.why);
  ok &= load(lib, "ibv_modify_qp", &a.modify_qp, &l.why);
  ok &= load(lib, "ibv_destroy_qp", &a.destroy_qp, &l.why);
  ok &= load(lib, "ibv_wc_status_str", &a.wc_status_str, &l.why);
  l.ok = ok;
  return l;
}

}  // namespace

const IbvApi* ibv_api(std::string* why) {
  static Loaded loaded = load_all();  // once per process; thread-safe static init
  if (!loaded.ok) {
    if (why) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace r2cc
