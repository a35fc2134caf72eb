// RDMA devices as rails see them: a rail is named by the IPv4 address of a RoCE port (the
// address its netdev holds), and this finds the device, port and GID index that carry it.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace r2cc {

struct VerbsPort {
  ibv_context* ctx = nullptr;  // opened once per device for the process's life
  ibv_pd* pd = nullptr;        // one protection domain per device
  std::string device;
  int port = 1;
  int gid_index = -1;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;  // the port's active MTU when it was found
};

// The port whose GID table holds ip as an IPv4-mapped GID (RoCE v2 preferred). Throws
// std::runtime_error naming what is missing and how to check it (`r2cc doctor`).
const VerbsPort& verbs_port_for_ip(const std::string& ip);

// The port's state now (IBV_PORT_ACTIVE, IBV_PORT_DOWN, ...); IBV_PORT_NOP when it cannot say.
ibv_port_state verbs_port_state(const VerbsPort& p);

}  // namespace r2cc
