// The only pybind11 module: r2cc_serve._C. Tensors cross as (data_ptr, count);
// every blocking call releases the GIL (nogil). The module is bound by topic, one function each.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <utility>

#include "collectives.h"
#include "net.h"
#include "protocol.h"  // kProtocolVersion
#include "sched/executor.h"
#include "transport.h"

namespace py = pybind11;
using namespace r2cc;

namespace {

// The GIL let go around a blocking call (without_gil). A thread (a daemon) that takes the GIL back
// while the interpreter finalizes is ended there by Python 3.11 with pthread_exit. Its unwinding
// ended the whole process by std::terminate ("terminate called without an active exception") in
// py::gil_scoped_release, whose destructor is noexcept (pybind11 issue 2215), and would in any
// destructor run while the call's own error unwinds the stack. So this destructor lets it pass,
// and without_gil takes the GIL back only once the call has returned or its error is caught.
class ReleaseGil {
 public:
  ReleaseGil() : tstate_(PyEval_SaveThread()) {}
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;
  ~ReleaseGil() noexcept(false) { PyEval_RestoreThread(tstate_); }

 private:
  PyThreadState* tstate_;
};

// f() with the GIL let go; its error is rethrown with the GIL back.
template <typename F>
auto without_gil(F&& f) -> decltype(f()) {
  std::exception_ptr error;
  {
    ReleaseGil released;
    try {
      return f();
    } catch (...) {
      error = std::current_exception();
    }
  }
  std::rethrow_exception(error);
}

// A member function of a bound class, or a lambda, as pybind11 binds it, run by without_gil.
template <typename R, typename C, typename... A>
auto nogil(R (C::*f)(A...)) {
  return [f](C& self, A... a) -> R { return without_gil([&]() -> R { return (self.*f)(std::forward<A>(a)...); }); };
}
template <typename R, typename C, typename... A>
auto nogil(R (C::*f)(A...) const) {
  return [f](const C& self, A... a) -> R {
    return without_gil([&]() -> R { return (self.*f)(std::forward<A>(a)...); });
  };
}
template <typename F, typename R, typename... A>
auto nogil_lambda(F f, R (F::*)(A...) const) {
  return [f](A... a) -> R { return without_gil([&]() -> R { return f(std::forward<A>(a)...); }); };
}
template <typename F, typename = decltype(&F::operator())>
auto nogil(F f) {
  return nogil_lambda(f, &F::operator());
}

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// AbortedError carries the failure's kind (errors.h) as `.kind`, a string such as "rails_down";
// r2cc_serve/comm/errors.py maps each kind to its Python exception. _C.ErrorKind names them all.
// PortRangeError (net.h) carries `.address` and `.ports` (first, last) for the message users read.
void bind_errors(py::module_& m) {
  static py::exception<AbortedError> aborted(m, "AbortedError", PyExc_RuntimeError);
  static py::exception<LastRailError> last_rail(m, "LastRailError", PyExc_RuntimeError);
  static py::exception<PortRangeError> port_range(m, "PortRangeError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const AbortedError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(aborted.ptr())(e.what());
      exc.attr("kind") = error_kind_name(e.kind());
      PyErr_SetObject(aborted.ptr(), exc.ptr());
    } catch (const LastRailError& e) {
      py::set_error(last_rail, e.what());
    } catch (const PortRangeError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(port_range.ptr())(e.what());
      exc.attr("address") = e.address;
      exc.attr("ports") = py::make_tuple(e.ports.first, e.ports.second);
      PyErr_SetObject(port_range.ptr(), exc.ptr());
    }
  });
  py::enum_<ErrorKind> kinds(m, "ErrorKind");
  for_each_error_kind([&](ErrorKind k, const char* name) { kinds.value(name, k); });
}

void bind_element_types(py::module_& m) {
  py::enum_<DType>(m, "DType")
      .value("f32", DType::kF32).value("f16", DType::kF16).value("bf16", DType::kBF16)
      .value("i32", DType::kI32).value("i64", DType::kI64);
  py::enum_<RedOp>(m, "RedOp").value("sum", RedOp::kSum).value("max", RedOp::kMax).value("min", RedOp::kMin);
}

// TransportOptions from its list (transport.h); FIELDS in declaration order, for
// r2cc_serve.envs to check its knobs against.
void bind_options(py::module_& m) {
  auto options = py::class_<TransportOptions>(m, "TransportOptions").def(py::init<>());
  std::vector<std::string> option_names;
#define R2CC_OPTION_BINDING(type, name, value)             \
  options.def_readwrite(#name, &TransportOptions::name); \
  option_names.push_back(#name);
  R2CC_TRANSPORT_OPTIONS(R2CC_OPTION_BINDING)
#undef R2CC_OPTION_BINDING
  options.attr("FIELDS") = py::cast(option_names);
}

// A stats class from its struct's field list (stats.h): a read-only attribute per field, FIELDS
// (the names, in the list's order) and as_dict() (what r2cc_serve/comm/communicator.py returns).
template <typename S>
void bind_stats(py::module_& m, const char* name) {
  py::class_<S> cls(m, name);
  std::vector<std::string> names;
  S::each_field([&](const char* field, auto member) {
    cls.def_readonly(field, member);
    names.push_back(field);
  });
  cls.attr("FIELDS") = py::cast(names);
  cls.def("as_dict", [](const S& s) {
    py::dict d;
    S::each_field([&](const char* field, auto member) { d[field] = s.*member; });
    return d;
  });
}

// The transport's life cycle, operator actions, test fault injectors, errors and stats.
py::class_<Transport> bind_transport(py::module_& m) {
  py::class_<Transport> t(m, "Transport");
  t.def(py::init([](int rank, int world, std::vector<std::string> rail_ips, std::string netns, py::bytes secret,
                    uint64_t group_hash, TransportOptions opt) {
          return new Transport(rank, world, std::move(rail_ips), std::move(netns), std::string(secret), group_hash,
                               opt);
        }),
        py::arg("rank"), py::arg("world"), py::arg("rail_ips"), py::arg("netns"), py::arg("secret"),
        py::arg("group_hash"), py::arg("options"))
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("world", &Transport::world)
      .def_property_readonly("num_rails", &Transport::num_rails)
      .def("listen_ports", &Transport::listen_ports)
      .def("connect_all", nogil(&Transport::connect_all))
      .def("close", nogil(&Transport::close));
  t.def("drain_rail", nogil(&Transport::drain_rail), py::arg("rail"), py::arg("force") = true)
      .def("undrain_rail", nogil(&Transport::undrain_rail))
      .def("failover_rail", nogil(&Transport::failover_rail), py::arg("rail"), py::arg("force") = true)
      .def("restore_rail", nogil(&Transport::restore_rail))
      .def("inject_failure", &Transport::inject_failure, py::arg("peer"), py::arg("rail"), py::arg("chunks"))
      .def("inject_full_socket", &Transport::inject_full_socket, py::arg("peer"), py::arg("rail"))
      .def("audit_books", nogil(&Transport::audit_books));
  t.def("abort", nogil([](Transport& tr, const std::string& reason) { tr.abort(reason); }))
      .def("error", nogil(&Transport::error))
      .def("error_kind", nogil([](const Transport& tr) { return std::string(error_kind_name(tr.error_kind())); }))
      .def("stats", nogil(&Transport::stats))
      .def("peer_stats", nogil(&Transport::peer_stats))
      .def("counters", nogil(&Transport::counters))
      .def("state_signature", nogil(&Transport::state_signature))
      .def("wait_state_change", nogil(&Transport::wait_state_change), py::arg("seen"), py::arg("poll_ms"),
           py::arg("timeout_ms"), py::arg("watch_path"), py::arg("watch_since_ns"))
      .def("interrupt_state_wait", nogil(&Transport::interrupt_state_wait));
  return t;
}

// The built-in collectives; buffers cross as addresses (tensor.data_ptr()). Each ends with
// end_call() (a due watchdog pass on the caller; not after a throw, the call failed).
void bind_collectives(py::class_<Transport>& t) {
  t.def("all_reduce", nogil([](Transport& tr, uintptr_t in, uintptr_t out, size_t count, DType dt, RedOp op,
                               size_t slice, size_t one_shot) {
     all_reduce(tr, ptr<void>(in), ptr<void>(out), count, dt, op, slice, one_shot);
     tr.end_call();
   }))
      .def("all_gather", nogil([](Transport& tr, uintptr_t in, uintptr_t out, size_t count, DType dt) {
        all_gather(tr, ptr<void>(in), ptr<void>(out), count, dt);
        tr.end_call();
      }))
      .def("reduce_scatter", nogil([](Transport& tr, uintptr_t in, uintptr_t out, size_t count, DType dt, RedOp op) {
        reduce_scatter(tr, ptr<void>(in), ptr<void>(out), count, dt, op);
        tr.end_call();
      }))
      .def("gather", nogil([](Transport& tr, uintptr_t in, uintptr_t out, size_t count, DType dt, int root) {
        gather(tr, ptr<void>(in), ptr<void>(out), count, dt, root);
        tr.end_call();
      }))
      .def("broadcast", nogil([](Transport& tr, uintptr_t buf, size_t bytes, int root) {
        broadcast(tr, ptr<void>(buf), bytes, root);
        tr.end_call();
      }))
      .def("send", nogil([](Transport& tr, uintptr_t buf, size_t bytes, int peer) {
        send(tr, ptr<void>(buf), bytes, peer);
        tr.end_call();
      }))
      .def("recv", nogil([](Transport& tr, uintptr_t buf, size_t bytes, int peer) {
        recv(tr, ptr<void>(buf), bytes, peer);
        tr.end_call();
      }));
}

// Plans (r2cc_serve/sched/ir.py): a program is decoded and checked once, then run per call.
// PlanProgram is registered before all_reduce_plan so that its signature names the class.
void bind_plans(py::module_& m, py::class_<Transport>& t) {
  py::class_<PlanProgram>(m, "PlanProgram")
      .def(py::init([](py::bytes encoded) {
             std::string b(encoded);
             return new PlanProgram(PlanProgram::decode(b.data(), b.size()));
           }),
           py::arg("encoded"), "Decode Program.encode(); ValueError naming the step if it is malformed.")
      .def_property_readonly("steps", [](const PlanProgram& p) { return p.steps().size(); })
      .def_property_readonly("scratch_elems", &PlanProgram::scratch_elems)
      .def_property_readonly("in_place_safe", &PlanProgram::in_place_safe);
  t.def("all_reduce_plan", nogil([](Transport& tr, const PlanProgram& prog, uintptr_t in, uintptr_t out,
                                    size_t count, DType dt, RedOp op) {
    run_all_reduce_plan(tr, prog, ptr<void>(in), ptr<void>(out), count, dt, op);
    tr.end_call();
  }), py::arg("program"), py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"));
}

// Free functions: an interface's address (in a namespace) and the reference reduction.
void bind_helpers(py::module_& m) {
  m.def("iface_ipv4", [](const std::string& ifname, const std::string& netns) {
    ScopedNetns in_ns(netns);
    return iface_ipv4(ifname);
  }, py::arg("ifname"), py::arg("netns") = "", "IPv4 address of an interface (inside netns if given); '' if none.");
  m.def("reduce_in_order", nogil([](DType dt, RedOp op, uintptr_t out, std::vector<uintptr_t> inputs, size_t count) {
    std::vector<const void*> in;
    for (auto p : inputs) in.push_back(ptr<const void>(p));
    reduce_in_order(dt, op, ptr<void>(out), in.data(), int(in.size()), count);
  }));
}

}  // namespace

namespace r2cc {
void bind_policy(py::module_& parent);  // policy_bindings.cc: r2cc_serve._C.policy
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "r2cc C++ core: multi-rail transport and collectives";
  m.attr("PROTOCOL_VERSION") = kProtocolVersion;  // of the wire (protocol.h); `r2cc --version` shows it
  bind_errors(m);
  bind_element_types(m);
  bind_options(m);
  bind_stats<ConnStats>(m, "ConnStats");  // before the Transport methods that return them
  bind_stats<PeerStats>(m, "PeerStats");
  bind_stats<Counters>(m, "Counters");
  py::class_<Transport> transport = bind_transport(m);
  bind_collectives(transport);
  bind_plans(m, transport);
  bind_helpers(m);
  bind_policy(m);
}
