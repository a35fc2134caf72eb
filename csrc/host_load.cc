// Whether a waiting caller may spin: only while no other thread on the host is kept waiting for
// a core. Spinning buys a small message its latency by holding a core; on a host whose cores
// are all wanted (the 2-core lab serving a model: two workers, the engine and the API server)
// that core is taken from the model, and serving got slower with spinning on. On a host with a
// spare core nobody pays for it.
//
// The signal is the kernel's CPU pressure (/proc/pressure/cpu, "some"): the share of time at
// least one runnable thread waited for a core. It counts what spinning would cost, runnable
// threads waiting, rather than how many threads exist, and our own spinning counts against
// itself: spinners that crowd out another thread raise the pressure and stop. Sampled by the
// watchdog every kSampleNs and smoothed over about a second. Without PSI (an old kernel, or
// booted with psi=0) the pressure is unknown and a caller spins only if spin_max_cpu_pressure
// is 1 or more (spin whatever the load).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transport_internal.h"

namespace r2cc {

namespace {
constexpr int64_t kSampleNs = 100000000;  // 100 ms
constexpr double kSmoothing = 0.3;        // weight of the newest sample: ~1 s to settle

struct CpuPressure {
  int64_t total_us = -1;  // some thread on the host has waited for a core this long since boot (-1: no PSI)
  double avg10 = 0;       // the kernel's own share over the last 10 s (0..1)
};

CpuPressure read_cpu_pressure() {
  CpuPressure out;
  const int fd = open("/proc/pressure/cpu", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[256];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return out;
  buf[n] = '\0';
  // "some avg10=0.29 avg60=.. avg300=.. total=N\n..." (avg in percent)
  const char* total = strstr(buf, "total=");
  const char* avg10 = strstr(buf, "avg10=");
  if (total) out.total_us = strtoll(total + 6, nullptr, 10);
  if (avg10) out.avg10 = std::clamp(strtod(avg10 + 6, nullptr) / 100.0, 0.0, 1.0);
  return out;
}
}  // namespace

void TransportImpl::sample_cpu_pressure(int64_t now) {
  if (opt_.spin_us <= 0) return;
  if (opt_.spin_max_cpu_pressure >= 1) {
    spin_host_ok_.store(true, std::memory_order_relaxed);
    return;
  }
  if (psi_sampled_ns_ && now - psi_sampled_ns_ < kSampleNs) return;
  const CpuPressure psi = read_cpu_pressure();
  const int64_t total = psi.total_us;
  if (total < 0) {
    spin_host_ok_.store(false, std::memory_order_relaxed);
    cpu_pressure_.store(1, std::memory_order_relaxed);
    psi_sampled_ns_ = now;
    return;
  }
  if (psi_total_us_ >= 0 && now > psi_sampled_ns_) {
    const double share = std::min(1.0, double(total - psi_total_us_) * 1000.0 / double(now - psi_sampled_ns_));
    const float smooth = float(cpu_pressure_.load(std::memory_order_relaxed) * (1 - kSmoothing) + share * kSmoothing);
    cpu_pressure_.store(smooth, std::memory_order_relaxed);
    spin_host_ok_.store(smooth < opt_.spin_max_cpu_pressure, std::memory_order_relaxed);
  } else if (psi_total_us_ < 0) {
    // The first reading has no interval of its own yet: start from the kernel's last 10 s, so
    // a group on an idle host spins from its first call rather than ~0.2 s later (a cold
    // start's 300 small calls are over by then).
    cpu_pressure_.store(float(psi.avg10), std::memory_order_relaxed);
    spin_host_ok_.store(psi.avg10 < opt_.spin_max_cpu_pressure, std::memory_order_relaxed);
  }
  psi_total_us_ = total;
  psi_sampled_ns_ = now;
}

}  // namespace r2cc
