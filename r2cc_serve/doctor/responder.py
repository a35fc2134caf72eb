"""`r2cc doctor --serve`: answer a checker's probes on every rail.

UDP: each probe is answered with where it arrived (interface, address, that interface's MTU)
from the address it was sent to, either out of the interface it came in by (mode "device") or
wherever this host's routes send it (mode "route", as r2cc's own replies would go), padded to
the size the checker asked for, with don't-fragment.
TCP: "hello" returns this host's name, interfaces, the route back to the checker and kernel
settings; "data" opens an ephemeral port on the rail's address for one bandwidth probe.
Every wait has a timeout, so a checker that disappears costs a thread a few seconds at most.
"""

from __future__ import annotations

import errno
import select
import socket
import threading

from r2cc_serve.doctor import netinfo, settings, wire
from r2cc_serve.doctor.rails import is_ipv4
from r2cc_serve.errors import UserError

CONN_IDLE_S = 10.0        # a control connection with no request for this long is closed
DATA_ACCEPT_S = 5.0       # the checker connects to the data port within this
DATA_MAX_S = 5.0          # the longest bandwidth probe served


class Responder:
    def __init__(self, addrs: list[str], port: int):
        """Listen on port at each address (["0.0.0.0"]: every address of the host)."""
        self.port = port
        self._ifaces = netinfo.IfaceCache()
        self._stop = threading.Event()
        self._udp: list[socket.socket] = []
        self._tcp: list[socket.socket] = []
        try:
            for addr in addrs:
                self._udp.append(self._bind(socket.SOCK_DGRAM, addr))
                self._tcp.append(self._bind(socket.SOCK_STREAM, addr))
        except BaseException:
            self.close()
            raise

    def _bind(self, kind: int, addr: str) -> socket.socket:
        if kind == socket.SOCK_DGRAM:
            sock = wire.udp_socket()  # no SO_REUSEADDR: a second responder must fail, not share the port
        else:
            sock = socket.socket(socket.AF_INET, kind)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait for TIME_WAIT
        try:
            sock.bind((addr, self.port))
        except OSError as exc:
            sock.close()
            proto = "udp" if kind == socket.SOCK_DGRAM else "tcp"
            hint = ("another `r2cc doctor --serve` (or another program) has it: stop that or pick --port"
                    if exc.errno == errno.EADDRINUSE else "is that address on this host?")
            raise UserError(f"cannot listen on {addr}:{self.port}/{proto}: {exc.strerror}; {hint}") from None
        if kind == socket.SOCK_STREAM:
            sock.listen(64)
        return sock

    def serve_forever(self) -> None:
        """Answer until stop() (or Ctrl-C in the caller)."""
        socks = self._udp + self._tcp
        while not self._stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.2)
            for sock in ready:
                if sock.type == socket.SOCK_DGRAM:
                    self._answer_udp(sock)
                else:
                    self._accept(sock)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        for sock in self._udp + self._tcp:
            sock.close()

    # --- UDP ------------------------------------------------------------------------------

    def _answer_udp(self, sock: socket.socket) -> None:
        try:
            data, anc, _flags, src = sock.recvmsg(wire.MAX_DATAGRAM, 256)
        except OSError:
            return
        request = wire.parse_datagram(data)
        info = wire.pktinfo(anc)
        if request is None or info is None:
            return
        ifindex, dst = info
        arrived = self._ifaces.by_index(ifindex)
        holder = self._ifaces.holding(dst)
        reply = {"seq": request.get("seq"), "got": len(data) + wire.IP_UDP_HEADERS, "dst": dst,
                 "arrived": arrived.name if arrived else str(ifindex), "mtu": arrived.mtu if arrived else 0,
                 "holder": holder.name if holder else None, "holder_mtu": holder.mtu if holder else 0}
        size = _clamp(request.get("reply_size"), 0, wire.MAX_DATAGRAM)
        out_if = ifindex if request.get("mode") == "device" else 0
        try:
            sock.sendmsg([wire.datagram(reply, size)], wire.pktinfo_out(out_if, dst), 0, src)
        except OSError as exc:  # e.g. EMSGSIZE: the asked size is above our MTU; say so, small
            reply["send_error"] = exc.strerror
            try:
                sock.sendmsg([wire.datagram(reply, 0)], wire.pktinfo_out(out_if, dst), 0, src)
            except OSError:
                pass

    # --- TCP ------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=self._control, args=(conn,), daemon=True, name="r2cc-doctor-conn").start()

    def _control(self, conn: socket.socket) -> None:
        with conn:
            try:
                while not self._stop.is_set():
                    request = wire.recv_line(conn, CONN_IDLE_S)
                    if request.get("op") == "hello":
                        wire.send_line(conn, self._hello(conn, request))
                    elif request.get("op") == "data":
                        self._data(conn)
                    else:
                        wire.send_line(conn, {"error": f"unknown op {request.get('op')!r}"})
            except (OSError, TimeoutError, ConnectionError):
                return  # the checker left or went quiet: nothing to report to anyone

    def _hello(self, conn: socket.socket, request: dict) -> dict:
        local, peer = conn.getsockname()[0], conn.getpeername()[0]
        ifaces = self._ifaces.get()
        asked = request.get("rails") if isinstance(request.get("rails"), list) else [local]
        rails = [netinfo.holder(ifaces, a) if isinstance(a, str) and is_ipv4(a) else None for a in asked]
        rail_names = [r.name for r in rails if r is not None]
        return {"host": socket.gethostname(), "addr": local,
                "ifaces": {r.name: r.as_dict() for r in rails if r is not None},
                "rails": [r.name if r else None for r in rails],
                "route_dev": netinfo.route_dev(peer, local),
                "settings": settings.collect(sorted(set(rail_names)))}

    def _data(self, conn: socket.socket) -> None:
        """Open an ephemeral port on the connection's address; serve one bandwidth probe on it."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind((conn.getsockname()[0], 0))
            listener.listen(1)
            listener.settimeout(DATA_ACCEPT_S)
            wire.send_line(conn, {"port": listener.getsockname()[1]})
            try:
                data, _ = listener.accept()
            except socket.timeout:
                return
        with data:
            request = wire.recv_line(data, DATA_ACCEPT_S)
            seconds = _clamp(request.get("ms"), 0, int(1000 * DATA_MAX_S)) / 1000
            if request.get("dir") == "to_peer":
                wire.send_line(data, {"ready": True})
                wire.send_line(data, wire.count_stream(data, seconds + DATA_MAX_S))
            else:
                wire.stream_for(data, seconds, 2.0)


def _clamp(value, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(value)))
    except (TypeError, ValueError, OverflowError):
        return low


def serve(addrs: list[str], port: int, rail_names: list[str]) -> int:
    """Run a responder in the foreground until Ctrl-C or SIGTERM, its normal end (exit 0)."""
    responder = Responder(addrs, port)
    where = ", ".join(f"{a}:{port}" + (f" ({n})" if n else "") for a, n in zip(addrs, rail_names))
    print(f"r2cc doctor: serving on {where}, tcp and udp; Ctrl-C stops", flush=True)
    try:
        responder.serve_forever()
    except KeyboardInterrupt:
        print("r2cc doctor: stopped", flush=True)
    finally:
        responder.close()
    return 0
