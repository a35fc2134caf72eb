// One verbs rail link: an RC queue pair carrying the transport's ordered byte stream, with its
// buffers registered once. Bytes are copied into a ring of send slots and go out as SENDs (one
// slot each); the peer's receives land in a ring of receive slots that read_some() copies out
// of and posts again. A receiver that falls behind leaves slots unposted, and the sender's
// SENDs wait (receiver-not-ready retries, without limit), as a TCP sender waits on a full window.
//
// The handle the transport polls is an epoll descriptor over three things: the receive
// completion channel (a completion arrived), an eventfd kept set while received bytes wait to
// be read, and the TCP socket the link was set up over (kept open: its end of stream tells
// that the peer's process is gone, as a TCP rail's reset does).
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "net.h"
#include "verbs/device.h"

namespace r2cc {

class VerbsLink {
 public:
  static constexpr size_t kSlotBytes = 64 * 1024;
  static constexpr int kSlots = 64;  // each way: 4 MiB in flight, as a TCP rail's send buffer

  // What each end sends the other over the set-up socket.
  struct Endpoint {
    char magic[8];
    uint32_t qpn = 0, psn = 0;
    uint8_t gid[16] = {};
    uint32_t mtu = 0;  // enum ibv_mtu
    char note[96] = {};  // a failed end's reason (magic kFailMagic), for the other end's message
  };
  // An end that cannot make its queue pair says why instead (the dialer would see a reset only).
  static Endpoint failed_endpoint(const std::string& why);
  static bool is_failure(const Endpoint& e);

  // A queue pair on `port`, not yet connected; takes boot_fd (closes it on failure, too).
  // nullptr and *err on failure.
  static std::shared_ptr<VerbsLink> create(const VerbsPort& port, int boot_fd, std::string* err);
  ~VerbsLink();
  VerbsLink(const VerbsLink&) = delete;
  VerbsLink& operator=(const VerbsLink&) = delete;

  Endpoint local() const;
  // Brings the queue pair to ready-to-send against `remote` and posts every receive.
  bool connect(const Endpoint& remote, std::string* err);

  int handle() const { return handle_; }
  int boot_fd() const { return boot_fd_; }

  ssize_t read_some(void* buf, size_t n);                              // -1 with errno, 0 at end
  ssize_t send_some(const void* a, size_t na, const void* b, size_t nb);  // -1 with errno (EAGAIN)
  // Waits up to timeout_ms for a send slot to free; false on timeout or error.
  bool wait_send_room(int timeout_ms);
  size_t send_room();
  int unacked_bytes();
  int readable_bytes() const { return int(readable_.load()); }
  PathInfo path_info();
  void shutdown();
  // Why the link failed, for messages ("" while it has not).
  std::string failure() const;

 private:
  VerbsLink(const VerbsPort& port, int boot_fd) : port_(port), boot_fd_(boot_fd) {}
  bool set_up(std::string* err);
  void fail(int err, const std::string& why);
  // The failure as an errno (0: none). A queue pair's error says little (a flushed request
  // only says the pair went to error); once the peer's process has closed the bootstrap socket,
  // that is the cause reported: ECONNRESET, the host is up and the process gone.
  int error() const;
  bool peer_process_closed() const;  // its kernel closed or reset our bootstrap socket
  void reap_sends_locked();
  void take_receives();
  bool post_receive(int slot);
  void set_readable_signal(bool on);
  void check_port_locked(int64_t now);

  const VerbsPort& port_;
  int boot_fd_ = -1;
  int handle_ = -1, ready_fd_ = -1;
  ibv_comp_channel* rx_ch_ = nullptr;
  ibv_comp_channel* tx_ch_ = nullptr;
  ibv_cq* rx_cq_ = nullptr;
  ibv_cq* tx_cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::unique_ptr<char[]> mem_;  // kSlots receive slots, then kSlots send slots
  uint32_t psn_ = 0;
  bool connected_ = false;
  std::atomic<bool> shut_{false};

  // Receive side: one reader at a time (the transport's guarantee).
  struct Arrived {
    int slot;
    uint32_t len;
  };
  std::deque<Arrived> arrived_;
  uint32_t arrived_off_ = 0;  // bytes of arrived_.front() already read
  std::atomic<int64_t> readable_{0};
  bool ready_set_ = false;

  // Send side: slots fill and complete in order.
  std::mutex tx_mu_;
  uint64_t tx_posted_ = 0, tx_done_ = 0;
  uint32_t tx_len_[kSlots] = {};
  uint64_t bytes_posted_ = 0, bytes_acked_ = 0;
  int64_t last_ack_ns_ = 0;
  int64_t port_checked_ns_ = 0;  // the port's state is asked at most every kPortCheckNs

  mutable std::mutex err_mu_;
  std::atomic<int> err_{0};  // errno-style cause of the first failure
  std::string why_;
};

}  // namespace r2cc
