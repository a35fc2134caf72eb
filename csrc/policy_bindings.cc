// r2cc_serve._C.policy: the transport's pure policies (value types: measurements in, decisions
// out, no sockets) for the unit tests (tests/unit/test_policy_*.py), which feed them plain
// numbers: times in ns, counts, and PathInfo as TCP_INFO would fill it. Not for production use:
// the transport holds its own instances (transport_internal.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "dampening.h"
#include "loss_judge.h"
#include "net.h"
#include "progress.h"
#include "quiet_judge.h"

namespace py = pybind11;

namespace r2cc {

namespace {

const char* failure_name(FlapDampening::Failure f) {
  switch (f) {
    case FlapDampening::Failure::kIgnored: return "ignored";
    case FlapDampening::Failure::kCounted: return "counted";
    case FlapDampening::Failure::kExtended: return "extended";
    case FlapDampening::Failure::kHold: return "hold";
  }
  return "?";
}

const char* verdict_name(ProgressJudge::Verdict v) {
  switch (v) {
    case ProgressJudge::Verdict::kMoving: return "moving";
    case ProgressJudge::Verdict::kStuck: return "stuck";
    case ProgressJudge::Verdict::kSlow: return "slow";
  }
  return "?";
}

void bind_path_info(py::module_& m) {
  py::class_<PathInfo> c(m, "PathInfo");
  c.def(py::init([](py::kwargs kw) {
    PathInfo pi;
    pi.ok = true;  // a test's PathInfo is one the kernel answered, unless it says ok=False
    py::object self = py::cast(pi);
    for (auto item : kw) self.attr(item.first) = item.second;
    return self.cast<PathInfo>();
  }));
#define R2CC_PATH_FIELD(name) c.def_readwrite(#name, &PathInfo::name);
  R2CC_PATH_FIELD(ok)
  R2CC_PATH_FIELD(unacked)
  R2CC_PATH_FIELD(last_ack_recv_ms)
  R2CC_PATH_FIELD(retransmits)
  R2CC_PATH_FIELD(notsent_bytes)
  R2CC_PATH_FIELD(snd_wnd)
  R2CC_PATH_FIELD(rtt_us)
  R2CC_PATH_FIELD(rttvar_us)
  R2CC_PATH_FIELD(total_retrans)
  R2CC_PATH_FIELD(data_segs_out)
  R2CC_PATH_FIELD(dsack_dups)
  R2CC_PATH_FIELD(bytes_acked)
  R2CC_PATH_FIELD(snd_mss)
#undef R2CC_PATH_FIELD
}

void bind_dampening(py::module_& m) {
  py::class_<FlapDampening>(m, "Dampening")
      .def(py::init([](double threshold, double half_life_s, double hold_s, double hold_max_s) {
             return FlapDampening({threshold, half_life_s, hold_s, hold_max_s});
           }),
           py::arg("threshold") = 2.0, py::arg("half_life_s") = 60.0, py::arg("hold_s") = 10.0,
           py::arg("hold_max_s") = 300.0)
      .def("note_failure", [](FlapDampening& d, int64_t now) { return failure_name(d.note_failure(now)); })
      .def("penalty", &FlapDampening::penalty)
      .def("penalty_at_last_failure", &FlapDampening::penalty_at_last_failure)
      .def("hold_ns", &FlapDampening::hold_ns)
      .def("start_hold", &FlapDampening::start_hold, py::arg("now"), py::arg("reason") = "")
      .def("extend", &FlapDampening::extend)
      .def("end_hold", [](FlapDampening& d, int64_t now, const std::string& why) { return d.end_hold(now, why.c_str()); })
      .def("hold_expired", &FlapDampening::hold_expired)
      .def("forgive", &FlapDampening::forgive)
      .def("restart_levels_unless_recent", &FlapDampening::restart_levels_unless_recent)
      .def("holding", &FlapDampening::holding)
      .def("hold_left_ns", &FlapDampening::hold_left_ns)
      .def_property_readonly("level", &FlapDampening::level)
      .def_property_readonly("reason", &FlapDampening::reason);
}

void bind_loss(py::module_& m) {
  py::class_<LossJudge> c(m, "LossJudge");
  c.def(py::init([](double hold_pct, int min_segments) { return LossJudge({hold_pct, min_segments}); }),
        py::arg("hold_pct") = 0.5, py::arg("min_segments") = 1000)
      .def_property_readonly("enabled", &LossJudge::enabled)
      .def_static("peer_pause_excuses", &LossJudge::peer_pause_excuses, py::arg("now"), py::arg("stalled_since_ns"),
                  py::arg("spoke_again_ns"), py::arg("pause_ns"))
      .def("restart", &LossJudge::restart)
      .def("take_sample", &LossJudge::take_sample, py::arg("now"), py::arg("epoch"))
      // A judged window as a dict (pct, segs, seconds, spread), or None.
      .def("look",
           [](LossJudge& j, int64_t now, uint64_t epoch, uint32_t retrans, uint32_t segs,
              uint32_t dsacked) -> std::optional<py::dict> {
             LossJudge::Window w;
             if (!j.look(now, epoch, {retrans, segs, dsacked}, &w)) return std::nullopt;
             py::dict d;
             d["pct"] = w.pct;
             d["segs"] = w.segs;
             d["seconds"] = w.seconds;
             d["spread"] = w.spread;
             return d;
           },
           py::arg("now"), py::arg("epoch"), py::arg("retrans"), py::arg("segs"), py::arg("dsacked") = 0)
      .def("windows", &LossJudge::windows)
      .def("share_for_comparison",
           [](const LossJudge& j, int64_t now, std::optional<uint32_t> retrans, std::optional<uint32_t> segs,
              uint32_t dsacked) -> std::optional<double> {
             LossJudge::Counts counts{retrans.value_or(0), segs.value_or(0), dsacked};
             double pct;
             if (!j.share_for_comparison(now, retrans && segs ? &counts : nullptr, &pct)) return std::nullopt;
             return pct;
           },
           py::arg("now"), py::arg("retrans") = py::none(), py::arg("segs") = py::none(), py::arg("dsacked") = 0)
      .def_static("best_other",
                  [](const std::vector<double>& shares) {
                    LossJudge::BestOther b;
                    for (double s : shares) b.add(s);
                    return b.value();
                  })
      .def("lossy",
           [](const LossJudge& j, double pct, int spread, double best_other) {
             LossJudge::Window w;
             w.pct = pct;
             w.spread = spread;
             return j.lossy(w, best_other);
           },
           py::arg("pct"), py::arg("spread"), py::arg("best_other"))
      .def_property_readonly("last_pct", &LossJudge::last_pct)
      .def_readwrite("probing", &LossJudge::probing);
  c.attr("SAMPLE_NS") = LossJudge::kSampleNs;
  c.attr("WINDOW_MIN_NS") = LossJudge::kWindowMinNs;
  c.attr("WINDOW_MAX_NS") = LossJudge::kWindowMaxNs;
  c.attr("SPREAD") = LossJudge::kSpread;
  c.attr("ENOUGH_RETRANS") = LossJudge::kEnoughRetrans;
  c.attr("COMPARE_SEGMENTS") = LossJudge::kCompareSegments;
}

void bind_quiet(py::module_& m) {
  py::class_<QuietJudge>(m, "QuietJudge")
      .def(py::init([](int rail_timeout_ms, int peer_silence_ms) {
             return QuietJudge({rail_timeout_ms, peer_silence_ms});
           }),
           py::arg("rail_timeout_ms") = 60, py::arg("peer_silence_ms") = 400)
      .def_property_readonly("floor_ns", &QuietJudge::floor_ns)
      .def_property_readonly("fail_after_ns", &QuietJudge::fail_after_ns)
      .def_static("held_up", &QuietJudge::held_up, py::arg("now"), py::arg("last_pass_ns"), py::arg("rail_timeout_ns"))
      .def_static("silent_ns", &QuietJudge::silent_ns, py::arg("now"), py::arg("last_rx_ns"), py::arg("stall_end_ns"))
      .def("suspect_after_ns", &QuietJudge::suspect_after_ns)
      .def_static("dead_path_evidence", &QuietJudge::dead_path_evidence, py::arg("pi"), py::arg("now"),
                  py::arg("tx_resume_ns"), py::arg("stall_end_ns"), py::arg("quiet_ns"))
      .def("heard", &QuietJudge::heard)
      .def("reset", &QuietJudge::reset)
      .def("judge_quiet", &QuietJudge::judge_quiet, py::arg("pi"), py::arg("now"), py::arg("tx_resume_ns"),
           py::arg("stall_end_ns"), py::arg("quiet_ns"))
      .def_property_readonly("path_dead", &QuietJudge::path_dead)
      .def("mute", &QuietJudge::mute, py::arg("now"), py::arg("quiet_ns"), py::arg("freshest_rx_ns"),
           py::arg("spoke_again_ns"), py::arg("pause_ns"))
      .def("mute_fails", &QuietJudge::mute_fails, py::arg("now"), py::arg("silent_ns"), py::arg("freshest_rx_ns"),
           py::arg("spoke_again_ns"));
}

void bind_progress(py::module_& m) {
  py::class_<ProgressJudge> c(m, "ProgressJudge");
  c.def(py::init<>())
      .def("look",
           [](ProgressJudge& j, int64_t now, bool outstanding, uint64_t bytes_acked, uint64_t queued,
              bool window_limited, int64_t stuck_after_ns, int64_t judge_from_ns, double ref_Bps) {
             ProgressJudge::Sample s;
             s.outstanding = outstanding;
             s.bytes_acked = bytes_acked;
             s.queued = queued;
             s.window_limited = window_limited;
             return verdict_name(j.look(now, s, stuck_after_ns, judge_from_ns, ref_Bps));
           },
           py::arg("now"), py::arg("outstanding"), py::arg("bytes_acked"), py::arg("queued") = 0,
           py::arg("window_limited") = false, py::arg("stuck_after_ns") = 60000000, py::arg("judge_from_ns") = 0,
           py::arg("ref_Bps") = 0.0)
      .def("peer_paced", &ProgressJudge::peer_paced, py::arg("queued"), py::arg("snd_wnd"))
      .def("stuck_for_ns", &ProgressJudge::stuck_for_ns)
      .def("last_rate_Bps", &ProgressJudge::last_rate_Bps)
      .def("reset", &ProgressJudge::reset);
  c.attr("SLOW_WINDOW_NS") = ProgressJudge::kSlowWindowNs;
  c.attr("SLOW_FACTOR") = ProgressJudge::kSlowFactor;
}

}  // namespace

void bind_policy(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "policy", "The transport's pure policies as value types, for unit tests: plain numbers in, decisions out");
  bind_path_info(m);
  bind_dampening(m);
  bind_loss(m);
  bind_quiet(m);
  bind_progress(m);
}

}  // namespace r2cc
