// The transport's face (transport.h): every call goes to TransportImpl, which does the work
// (transport_impl.h says which file holds what). Nothing here takes a lock or decides anything.
#include "transport_internal.h"

namespace r2cc {

Transport::Transport(int rank, int world, std::vector<std::string> rail_ips, std::string netns, std::string secret,
                     uint64_t group_hash, TransportOptions opt)
    : impl_(std::make_unique<TransportImpl>(rank, world, std::move(rail_ips), std::move(netns), std::move(secret),
                                            group_hash, opt)) {}
Transport::~Transport() = default;  // ~TransportImpl closes

int Transport::rank() const { return impl_->rank(); }
int Transport::world() const { return impl_->world(); }
int Transport::num_rails() const { return impl_->num_rails(); }
const TransportOptions& Transport::options() const { return impl_->options(); }
std::vector<int> Transport::listen_ports() const { return impl_->listen_ports(); }

void Transport::connect_all(const std::vector<std::vector<std::pair<std::string, int>>>& peer_addrs) {
  impl_->connect_all(peer_addrs);
}
void Transport::begin_call(const CallDesc& d) { impl_->begin_call(d); }
void Transport::end_call() { impl_->end_call(); }

Op Transport::post_send(int peer, const void* buf, size_t len) { return impl_->post_send(peer, buf, len); }
Op Transport::post_recv(int peer, void* buf, size_t len) { return impl_->post_recv(peer, buf, len); }
void Transport::wait(const Op& op) { impl_->wait(op); }
std::vector<size_t> Transport::wait_some(const std::vector<Op>& ops) { return impl_->wait_some(ops); }

void Transport::drain_rail(int rail, bool force) { impl_->drain_rail(rail, force); }
void Transport::undrain_rail(int rail) { impl_->undrain_rail(rail); }
void Transport::failover_rail(int rail, bool force) { impl_->failover_rail(rail, force); }
void Transport::restore_rail(int rail) { impl_->restore_rail(rail); }
void Transport::inject_failure(int peer, int rail, int64_t chunks) { impl_->inject_failure(peer, rail, chunks); }
void Transport::inject_full_socket(int peer, int rail) { impl_->inject_full_socket(peer, rail); }
std::vector<std::string> Transport::audit_books() const { return impl_->audit_books(); }

void Transport::abort(const std::string& reason, ErrorKind kind) { impl_->abort(reason, kind); }
std::string Transport::error() const { return impl_->error(); }
ErrorKind Transport::error_kind() const { return impl_->error_kind(); }

char* Transport::scratch(size_t bytes) { return impl_->scratch(bytes); }

std::vector<ConnStats> Transport::stats() const { return impl_->stats(); }
std::vector<PeerStats> Transport::peer_stats() const { return impl_->peer_stats(); }
Counters Transport::counters() const { return impl_->counters(); }
std::string Transport::state_signature() const { return impl_->state_signature(); }
std::string Transport::wait_state_change(const std::string& seen, int poll_ms, int timeout_ms,
                                         const std::string& watch_path, int64_t watch_since_ns) {
  return impl_->wait_state_change(seen, poll_ms, timeout_ms, watch_path, watch_since_ns);
}
void Transport::interrupt_state_wait() { impl_->interrupt_state_wait(); }
void Transport::close() { impl_->close(); }

}  // namespace r2cc
