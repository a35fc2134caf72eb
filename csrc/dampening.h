// Flap dampening of one connection, as a value: failures in, hold decisions out (the policy that
// dampening.cc acts on; its header says why). No sockets, no clock, no lock of its own: the
// transport feeds it under its lock, and the unit tests feed it plain numbers.
//
// Each failure adds 1 to a penalty that halves every half_life_s. A failure that brings it to
// threshold (0: never) starts a hold of hold_s * 2^(level-1), capped at hold_max_s, where level
// counts holds since the penalty last fell under threshold / 2. A failure during a hold restarts
// the hold's quiet time instead.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace r2cc {

class FlapDampening {
 public:
  struct Params {
    double threshold = 0;  // flap_threshold; 0: never hold
    double half_life_s = 60;
    double hold_s = 10;
    double hold_max_s = 300;
  };
  FlapDampening() = default;
  explicit FlapDampening(const Params& p) : p_(p) {}

  // What a failure did: nothing (dampening off), counted, restarted the hold under way, or
  // asks for a new hold (the caller starts it with start_hold, with words for why).
  enum class Failure { kIgnored, kCounted, kExtended, kHold };
  Failure note_failure(int64_t now) {
    if (p_.threshold <= 0) return Failure::kIgnored;
    const double before = penalty(now);
    if (before < p_.threshold / 2) level_ = 0;  // the last flapping has faded: start afresh
    penalty_ = before + 1;
    penalty_ns_ = now;
    if (extend(now)) return Failure::kExtended;  // still flapping
    return penalty_ < p_.threshold ? Failure::kCounted : Failure::kHold;
  }

  // The penalty decayed to now.
  double penalty(int64_t now) const {
    if (penalty_ == 0 || p_.half_life_s <= 0) return penalty_;
    const double age_s = double(now - penalty_ns_) * 1e-9;
    return penalty_ * std::exp2(-age_s / p_.half_life_s);
  }
  double penalty_at_last_failure() const { return penalty_; }

  // Quiet time the level-th hold in a row asks for.
  int64_t hold_ns(int level) const {
    return int64_t(std::min(p_.hold_max_s, p_.hold_s * std::ldexp(1.0, level - 1)) * 1e9);
  }
  void start_hold(int64_t now, std::string reason) {
    level_ = std::min(level_ + 1, 30);
    hold_until_ns_ = now + hold_ns(level_);
    reason_ = std::move(reason);
  }
  // Failing (or losing packets) again while held: the quiet time it must show starts again.
  // False when not held.
  bool extend(int64_t now) {
    if (!holding(now)) return false;
    hold_until_ns_ = now + hold_ns(level_);
    return true;
  }
  // False when there was no hold to end.
  bool end_hold(int64_t now, const char* why) {
    if (!hold_until_ns_) return false;
    hold_until_ns_ = 0;
    hold_ended_ns_ = now;
    reason_ = std::string("hold ended: ") + why;
    return true;
  }
  bool hold_expired(int64_t now) const { return hold_until_ns_ && now >= hold_until_ns_; }
  // No penalty and the shortest next hold (the caller ends a hold under way with end_hold).
  void forgive() {
    penalty_ = 0;
    level_ = 0;
  }
  // A lossy rail's holds double only while recent: one lossy again over hold_max_s after its
  // last hold ended (or never held) starts from the shortest hold.
  void restart_levels_unless_recent(int64_t now) {
    if (!hold_ended_ns_ || now - hold_ended_ns_ > int64_t(p_.hold_max_s * 1e9)) level_ = 0;
  }

  bool holding(int64_t now) const { return hold_until_ns_ > now; }
  int64_t hold_left_ns(int64_t now) const { return holding(now) ? hold_until_ns_ - now : 0; }
  int level() const { return level_; }
  // Why, for people: failures, over how long, the last error; or how the last hold ended.
  const std::string& reason() const { return reason_; }

 private:
  Params p_;
  double penalty_ = 0;  // its value at penalty_ns_; it decays from there
  int64_t penalty_ns_ = 0;
  int level_ = 0;              // holds since the penalty last faded
  int64_t hold_until_ns_ = 0;  // held out until then (0: no hold)
  int64_t hold_ended_ns_ = 0;  // when the last hold ended
  std::string reason_;
};

}  // namespace r2cc
