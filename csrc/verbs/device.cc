#include "verbs/device.h"

#include <arpa/inet.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "verbs/ibv_api.h"

namespace r2cc {

namespace {

std::string gid_type(const std::string& dev, int port, int index) {
  std::ifstream f("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) + "/gid_attrs/types/" +
                  std::to_string(index));
  std::string line;
  std::getline(f, line);
  return line;
}

// ::ffff:a.b.c.d, the GID a RoCE port derives from an IPv4 address of its netdev.
bool ipv4_gid(const std::string& ip, ibv_gid* gid) {
  in_addr a{};
  if (inet_pton(AF_INET, ip.c_str(), &a) != 1) return false;
  std::memset(gid->raw, 0, sizeof gid->raw);
  gid->raw[10] = gid->raw[11] = 0xff;
  std::memcpy(gid->raw + 12, &a, 4);
  return true;
}

std::mutex g_mu;
std::map<std::string, std::unique_ptr<VerbsPort>> g_by_ip;  // found once, kept for the process
std::map<std::string, std::pair<ibv_context*, ibv_pd*>> g_open;  // device name -> context, pd

}  // namespace

const VerbsPort& verbs_port_for_ip(const std::string& ip) {
  std::string why;
  const IbvApi* ibv = ibv_api(&why);
  if (!ibv) throw std::runtime_error("r2cc: rail rdma:" + ip + ": " + why);
  ibv_gid want{};
  if (!ipv4_gid(ip, &want)) throw std::runtime_error("r2cc: rail rdma:" + ip + ": not an IPv4 address");
  std::lock_guard<std::mutex> g(g_mu);
  auto hit = g_by_ip.find(ip);
  if (hit != g_by_ip.end()) return *hit->second;
  int n = 0;
  ibv_device** list = ibv->get_device_list(&n);
  if (!list || n == 0) {
    if (list) ibv->free_device_list(list);
    throw std::runtime_error("r2cc: rail rdma:" + ip + ": no RDMA device on this host (check `r2cc doctor`; "
                             "soft-RoCE: `rdma link add rxe0 type rxe netdev IFACE`)");
  }
  std::unique_ptr<VerbsPort> best;
  for (int d = 0; d < n && !(best && gid_type(best->device, best->port, best->gid_index) == "RoCE v2"); ++d) {
    const std::string name = ibv->get_device_name(list[d]);
    auto open = g_open.find(name);
    if (open == g_open.end()) {
      ibv_context* ctx = ibv->open_device(list[d]);
      ibv_pd* pd = ctx ? ibv->alloc_pd(ctx) : nullptr;
      if (!pd) continue;
      open = g_open.emplace(name, std::make_pair(ctx, pd)).first;
    }
    ibv_context* ctx = open->second.first;
    ibv_device_attr dattr{};
    const int ports = ibv->query_device(ctx, &dattr) == 0 ? dattr.phys_port_cnt : 1;
    for (int port = 1; port <= ports; ++port) {
      ibv_port_attr pa{};
      if (ibv->query_port(ctx, uint8_t(port), &pa) != 0) continue;
      for (int i = 0; i < pa.gid_tbl_len; ++i) {
        ibv_gid gid{};
        if (ibv->query_gid(ctx, uint8_t(port), i, &gid) != 0 || std::memcmp(gid.raw, want.raw, 16) != 0) continue;
        const bool v2 = gid_type(name, port, i) == "RoCE v2";
        if (best && !v2) continue;
        best = std::make_unique<VerbsPort>();
        *best = VerbsPort{ctx, open->second.second, name, port, i, gid, pa.active_mtu};
        if (v2) break;
      }
    }
  }
  ibv->free_device_list(list);
  if (!best)
    throw std::runtime_error("r2cc: rail rdma:" + ip + ": no RDMA port has a GID for " + ip +
                             " (is the address on the RoCE device's netdev? check `r2cc doctor`)");
  return *g_by_ip.emplace(ip, std::move(best)).first->second;
}

ibv_port_state verbs_port_state(const VerbsPort& p) {
  const IbvApi* ibv = ibv_api();
  ibv_port_attr pa{};
  if (!ibv || ibv->query_port(p.ctx, uint8_t(p.port), &pa) != 0) return IBV_PORT_NOP;
  return pa.state;
}

}  // namespace r2cc
