#include "verbs/link.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "verbs/ibv_api.h"

namespace r2cc {

namespace {

constexpr char kMagic[8] = {'r', '2', 'c', 'c', 'v', 'r', 'b', '1'};
constexpr char kFailMagic[8] = {'r', '2', 'c', 'c', 'F', 'A', 'I', 'L'};
// Local ACK timeout 4.096 us * 2^14 = 67 ms, 7 tries: a silent peer adapter fails the queue pair
// in about half a second. r2cc's watchdog judges the rail long before that (heartbeats).
constexpr uint8_t kAckTimeout = 14, kRetries = 7;
constexpr uint8_t kRnrRetryForever = 7;  // a slow reader holds the sender back, as TCP's window does
constexpr uint8_t kMinRnrTimer = 1;      // 0.01 ms: retry soon after the reader posts again

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int errno_of(ibv_wc_status s, bool shut) {
  switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return ETIMEDOUT;  // the peer's adapter stopped answering: the path is down
    case IBV_WC_WR_FLUSH_ERR:
      return shut ? ECONNABORTED : ENETDOWN;  // the queue pair went to error under us
    case IBV_WC_LOC_QP_OP_ERR:
      return ENETDOWN;  // seen when the port's link goes down
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR:
      return ECONNRESET;
    default:
      return EIO;
  }
}

}  // namespace

std::shared_ptr<VerbsLink> VerbsLink::create(const VerbsPort& port, int boot_fd, std::string* err) {
  std::shared_ptr<VerbsLink> link(new VerbsLink(port, boot_fd));
  if (!link->set_up(err)) return nullptr;  // the destructor frees what was made, boot_fd too
  return link;
}

bool VerbsLink::set_up(std::string* err) {
  const IbvApi* ibv = ibv_api(err);
  if (!ibv) return false;
  auto bad = [&](const char* what) {
    *err = std::string("rdma ") + port_.device + ": " + what + " failed: " + strerror(errno);
    return false;
  };
  ready_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  handle_ = epoll_create1(EPOLL_CLOEXEC);
  if (ready_fd_ < 0 || handle_ < 0) return bad("eventfd/epoll");
  rx_ch_ = ibv->create_comp_channel(port_.ctx);
  tx_ch_ = ibv->create_comp_channel(port_.ctx);
  if (!rx_ch_ || !tx_ch_) return bad("ibv_create_comp_channel");
  set_nonblocking(rx_ch_->fd);
  set_nonblocking(tx_ch_->fd);
  rx_cq_ = ibv->create_cq(port_.ctx, kSlots + 1, this, rx_ch_, 0);
  tx_cq_ = ibv->create_cq(port_.ctx, kSlots + 1, this, tx_ch_, 0);
  if (!rx_cq_ || !tx_cq_) return bad("ibv_create_cq");
  ibv_qp_init_attr qa{};
  qa.send_cq = tx_cq_;
  qa.recv_cq = rx_cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = kSlots;
  qa.cap.max_recv_wr = kSlots;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qp_ = ibv->create_qp(port_.pd, &qa);
  if (!qp_) return bad("ibv_create_qp");
  const size_t bytes = 2 * size_t(kSlots) * kSlotBytes;
  mem_.reset(new char[bytes]);
  mr_ = ibv->reg_mr(port_.pd, mem_.get(), bytes, IBV_ACCESS_LOCAL_WRITE);
  if (!mr_) return bad("ibv_reg_mr");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = uint8_t(port_.port);
  a.qp_access_flags = 0;  // SEND/RECV only: no remote access to our memory
  if (ibv->modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
    return bad("queue pair to INIT");
  psn_ = std::random_device{}() & 0xffffff;
  for (int fd : {ready_fd_, rx_ch_->fd, boot_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    if (epoll_ctl(handle_, EPOLL_CTL_ADD, fd, &ev) != 0) return bad("epoll_ctl");
  }
  if (ibv_req_notify_cq(rx_cq_, 0) != 0) return bad("ibv_req_notify_cq");
  return true;
}

VerbsLink::~VerbsLink() {
  const IbvApi* ibv = ibv_api();
  if (ibv) {
    if (qp_) ibv->destroy_qp(qp_);
    if (rx_cq_) ibv->destroy_cq(rx_cq_);
    if (tx_cq_) ibv->destroy_cq(tx_cq_);
    if (rx_ch_) ibv->destroy_comp_channel(rx_ch_);
    if (tx_ch_) ibv->destroy_comp_channel(tx_ch_);
    if (mr_) ibv->dereg_mr(mr_);
  }
  for (int fd : {handle_, ready_fd_, boot_fd_})
    if (fd >= 0) ::close(fd);
}

VerbsLink::Endpoint VerbsLink::failed_endpoint(const std::string& why) {
  Endpoint e;
  std::memcpy(e.magic, kFailMagic, sizeof kFailMagic);
  std::strncpy(e.note, why.c_str(), sizeof e.note - 1);
  return e;
}

bool VerbsLink::is_failure(const Endpoint& e) { return std::memcmp(e.magic, kFailMagic, sizeof kFailMagic) == 0; }

VerbsLink::Endpoint VerbsLink::local() const {
  Endpoint e;
  std::memcpy(e.magic, kMagic, sizeof kMagic);
  e.qpn = qp_->qp_num;
  e.psn = psn_;
  std::memcpy(e.gid, port_.gid.raw, 16);
  e.mtu = uint32_t(port_.mtu);
  return e;
}

bool VerbsLink::connect(const Endpoint& remote, std::string* err) {
  const IbvApi* ibv = ibv_api(err);
  if (!ibv) return false;
  if (std::memcmp(remote.magic, kMagic, sizeof kMagic) != 0) {
    *err = "the peer's rail is not an RDMA rail (or speaks another r2cc version): check that both ends name "
           "this rail the same way (rdma: or a device) in R2CC_RAILS";
    return false;
  }
  for (int s = 0; s < kSlots; ++s)
    if (!post_receive(s)) {
      *err = "rdma " + port_.device + ": ibv_post_recv failed: " + strerror(errno);
      return false;
    }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = ibv_mtu(std::min(uint32_t(port_.mtu), remote.mtu));
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = kMinRnrTimer;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
  a.ah_attr.grh.sgid_index = uint8_t(port_.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = uint8_t(port_.port);
  if (ibv->modify_qp(qp_, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    *err = "rdma " + port_.device + ": queue pair to RTR failed: " + strerror(errno);
    return false;
  }
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = kAckTimeout;
  a.retry_cnt = kRetries;
  a.rnr_retry = kRnrRetryForever;
  a.sq_psn = psn_;
  a.max_rd_atomic = 1;
  if (ibv->modify_qp(qp_, &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    *err = "rdma " + port_.device + ": queue pair to RTS failed: " + strerror(errno);
    return false;
  }
  connected_ = true;
  last_ack_ns_ = now_ns();
  return true;
}

bool VerbsLink::post_receive(int slot) {
  ibv_sge sge{};
  sge.addr = uintptr_t(mem_.get() + size_t(slot) * kSlotBytes);
  sge.length = kSlotBytes;
  sge.lkey = mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = uint64_t(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp_, &wr, &bad) == 0;
}

void VerbsLink::fail(int err, const std::string& why) {
  std::lock_guard<std::mutex> g(err_mu_);
  if (err_.load() != 0) return;
  why_ = why;
  err_.store(err);
}

std::string VerbsLink::failure() const {
  std::lock_guard<std::mutex> g(err_mu_);
  if (err_.load() != 0 && !shut_.load() && peer_process_closed())
    return why_ + " (and the peer's process closed its connection: it is gone)";
  return why_;
}

bool VerbsLink::peer_process_closed() const {
  char c;
  const ssize_t r = recv(boot_fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno == ECONNRESET);
}

int VerbsLink::error() const {
  const int e = err_.load();
  // Seen on a busy box: the peer was killed, and the reader (late for a CPU) found its receives
  // flushed, the pair in error, before it looked at the bootstrap socket's end; the group was
  // aborted as "every rail down" rather than "the peer's process is gone".
  if (e == 0 || shut_.load() || !peer_process_closed()) return e;
  return ECONNRESET;
}

// ---- receive side ----

void VerbsLink::take_receives() {
  const IbvApi* ibv = ibv_api();
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  int events = 0;
  while (ibv->get_cq_event(rx_ch_, &cq, &ctx) == 0) ++events;
  if (events) {
    ibv->ack_cq_events(rx_cq_, unsigned(events));
    ibv_req_notify_cq(rx_cq_, 0);  // armed again before the poll: nothing that lands after is missed
  }
  ibv_wc wc[16];
  int k;
  while ((k = ibv_poll_cq(rx_cq_, 16, wc)) > 0) {
    for (int i = 0; i < k; ++i) {
      if (wc[i].status == IBV_WC_SUCCESS) {
        arrived_.push_back({int(wc[i].wr_id), wc[i].byte_len});
        readable_ += wc[i].byte_len;
      } else {
        fail(errno_of(wc[i].status, shut_.load()),
             "rdma " + port_.device + " receive: " + ibv->wc_status_str(wc[i].status));
      }
    }
  }
}

void VerbsLink::set_readable_signal(bool on) {
  if (on == ready_set_) return;
  uint64_t v = 1;
  if (on) (void)!::write(ready_fd_, &v, sizeof v);
  else (void)!::read(ready_fd_, &v, sizeof v);
  ready_set_ = on;
}

ssize_t VerbsLink::read_some(void* buf, size_t n) {
  take_receives();
  size_t copied = 0;
  char* out = static_cast<char*>(buf);
  while (copied < n && !arrived_.empty()) {
    Arrived& a = arrived_.front();
    const size_t k = std::min(n - copied, size_t(a.len - arrived_off_));
    std::memcpy(out + copied, mem_.get() + size_t(a.slot) * kSlotBytes + arrived_off_, k);
    copied += k;
    arrived_off_ += uint32_t(k);
    if (arrived_off_ == a.len) {
      if (!shut_.load() && err_.load() == 0 && !post_receive(a.slot))
        fail(errno, "rdma " + port_.device + ": ibv_post_recv failed");
      arrived_.pop_front();
      arrived_off_ = 0;
    }
  }
  readable_ -= int64_t(copied);
  set_readable_signal(!arrived_.empty());
  if (copied) return ssize_t(copied);
  if (const int e = error()) {
    errno = e;
    return -1;
  }
  char c;
  const ssize_t r = recv(boot_fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return 0;  // the peer's process closed its end (or we shut the link down)
  if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
  errno = EAGAIN;
  return -1;
}

// ---- send side ----

void VerbsLink::reap_sends_locked() {
  ibv_wc wc[16];
  int k;
  while ((k = ibv_poll_cq(tx_cq_, 16, wc)) > 0) {
    const int64_t now = now_ns();
    for (int i = 0; i < k; ++i) {
      ++tx_done_;
      if (wc[i].status == IBV_WC_SUCCESS) {
        bytes_acked_ += tx_len_[wc[i].wr_id % kSlots];
        last_ack_ns_ = now;
      } else {
        fail(errno_of(wc[i].status, shut_.load()),
             "rdma " + port_.device + " send: " + ibv_api()->wc_status_str(wc[i].status));
      }
    }
  }
}

ssize_t VerbsLink::send_some(const void* a, size_t na, const void* b, size_t nb) {
  std::lock_guard<std::mutex> g(tx_mu_);
  reap_sends_locked();
  if (const int e = error()) {
    errno = e;
    return -1;
  }
  if (shut_.load()) {
    errno = EPIPE;
    return -1;
  }
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  size_t total = 0;
  while (na + nb > 0 && tx_posted_ - tx_done_ < uint64_t(kSlots)) {
    const int slot = int(tx_posted_ % kSlots);
    char* dst = mem_.get() + size_t(kSlots + slot) * kSlotBytes;
    size_t len = std::min(na, kSlotBytes);
    std::memcpy(dst, pa, len);
    pa += len;
    na -= len;
    const size_t kb = std::min(nb, kSlotBytes - len);
    std::memcpy(dst + len, pb, kb);
    pb += kb;
    nb -= kb;
    len += kb;
    ibv_sge sge{};
    sge.addr = uintptr_t(dst);
    sge.length = uint32_t(len);
    sge.lkey = mr_->lkey;
    ibv_send_wr wr{};
    wr.wr_id = uint64_t(slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp_, &wr, &bad) != 0) {
      fail(errno ? errno : EIO, "rdma " + port_.device + ": ibv_post_send failed");
      break;
    }
    tx_len_[slot] = uint32_t(len);
    ++tx_posted_;
    bytes_posted_ += len;
    total += len;
  }
  if (total) return ssize_t(total);
  errno = err_.load() ? err_.load() : EAGAIN;
  return -1;
}

bool VerbsLink::wait_send_room(int timeout_ms) {
  if (send_room() > 0 || err_.load()) return send_room() > 0;
  const IbvApi* ibv = ibv_api();
  ibv_req_notify_cq(tx_cq_, 0);
  if (send_room() > 0 || err_.load()) return send_room() > 0;  // completed while we armed it
  pollfd p{tx_ch_->fd, POLLIN, 0};
  poll(&p, 1, timeout_ms);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  int events = 0;
  while (ibv->get_cq_event(tx_ch_, &cq, &ctx) == 0) ++events;
  if (events) ibv->ack_cq_events(tx_cq_, unsigned(events));
  return send_room() > 0;
}

size_t VerbsLink::send_room() {
  std::lock_guard<std::mutex> g(tx_mu_);
  reap_sends_locked();
  if (err_.load() || shut_.load()) return 0;
  return size_t(uint64_t(kSlots) - (tx_posted_ - tx_done_)) * kSlotBytes;
}

int VerbsLink::unacked_bytes() {
  std::lock_guard<std::mutex> g(tx_mu_);
  reap_sends_locked();
  return int(bytes_posted_ - bytes_acked_);
}

// The port going down is evidence at once: the adapter would take up to its retry limit (half a
// second) to fail the queue pair, and rxe fails it with "local QP operation error" only then.
void VerbsLink::check_port_locked(int64_t now) {
  constexpr int64_t kPortCheckNs = 10000000;
  if (now - port_checked_ns_ < kPortCheckNs || err_.load()) return;
  port_checked_ns_ = now;
  const ibv_port_state st = verbs_port_state(port_);
  if (st == IBV_PORT_ACTIVE || st == IBV_PORT_NOP) return;
  fail(ENETDOWN, "rdma " + port_.device + ": port " + std::to_string(port_.port) + " is " +
                     (st == IBV_PORT_DOWN ? "DOWN" : "not ACTIVE") + " (its link went down)");
  uint64_t v = 1;
  (void)!::write(ready_fd_, &v, sizeof v);  // the reader wakes and reads the failure
}

PathInfo VerbsLink::path_info() {
  std::lock_guard<std::mutex> g(tx_mu_);
  reap_sends_locked();
  check_port_locked(now_ns());
  PathInfo pi;
  pi.ok = connected_ && err_.load() == 0;
  pi.unacked = uint32_t(bytes_posted_ - bytes_acked_);
  pi.last_ack_recv_ms = uint32_t((now_ns() - last_ack_ns_) / 1000000);
  pi.snd_wnd = uint32_t(kSlots * kSlotBytes);  // no window to read: an RC peer takes what is posted
  pi.data_segs_out = uint32_t(tx_posted_);
  pi.bytes_acked = bytes_acked_;
  pi.snd_mss = uint32_t(128u << int(port_.mtu));  // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5
  return pi;
}

void VerbsLink::shutdown() {
  if (shut_.exchange(true)) return;
  if (qp_ && connected_) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;  // flushes every posted request: blocked readers and writers wake
    ibv_api()->modify_qp(qp_, &a, IBV_QP_STATE);
  }
  ::shutdown(boot_fd_, SHUT_RDWR);
}

}  // namespace r2cc
