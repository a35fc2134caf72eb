// TCP_INFO in its own unit: <linux/tcp.h> (which has the fields we need) and glibc's
// <netinet/tcp.h> (used by net.cc) cannot be included together.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "net.h"

namespace r2cc {

PathInfo path_info(int fd) {
  PathInfo out;
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return out;
  out.ok = true;
  out.unacked = ti.tcpi_unacked;
  out.last_ack_recv_ms = ti.tcpi_last_ack_recv;
  out.retransmits = ti.tcpi_retransmits;
  out.notsent_bytes = ti.tcpi_notsent_bytes;
  out.snd_wnd = ti.tcpi_snd_wnd;
  out.rtt_us = ti.tcpi_rtt;
  out.rttvar_us = ti.tcpi_rttvar;
  out.total_retrans = ti.tcpi_total_retrans;
  out.data_segs_out = ti.tcpi_data_segs_out;
  out.dsack_dups = ti.tcpi_dsack_dups;
  out.bytes_acked = ti.tcpi_bytes_acked;
  out.snd_mss = ti.tcpi_snd_mss;
  return out;
}

}  // namespace r2cc
