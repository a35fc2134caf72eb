"""Rails inside the guest: names, addresses, the script that builds them and the env that names them.

Rank 0 ("a") and rank 1 ("b") run in the guest's initial network namespace: the 6.1 rxe driver
has its RoCE UDP socket only there and cannot move a device to another namespace (measured; see
DESIGN.md, "RDMA under emulation"). Rail R is a veth pair vaR/vbR holding 10.77.R.1/10.77.R.2
with an rxe device on each end, rxe_aR and rxe_bR; `ip link set vaR down` fails rail R alone.

Both addresses are local, so the kernel would route between them over lo, and rxe then fails
to connect (modify QP to RTR). Per-end policy routes (from its own address, locally sent: out
by its own veth), looked up before the local table, put every rail's traffic on its wire;
accept_local lets the other end take packets from an address of its own host.
"""

from __future__ import annotations

from dataclasses import dataclass

PORT = 1  # rxe devices have one port
MAX_RAILS = 16
ENDS = ("a", "b")  # rank 0, rank 1


@dataclass(frozen=True)
class Rail:
    index: int

    def netdev(self, end: str) -> str:
        return f"v{end}{self.index}"

    def device(self, end: str) -> str:
        return f"rxe_{end}{self.index}"

    def ip(self, end: str) -> str:
        return f"10.77.{self.index}.{ENDS.index(end) + 1}"

    def table(self, end: str) -> int:
        return 100 + 2 * self.index + ENDS.index(end)


def rails(n: int) -> list[Rail]:
    if not 0 <= n <= MAX_RAILS:
        raise ValueError(f"rails must be 0..{MAX_RAILS}, not {n}")
    return [Rail(i) for i in range(n)]


def ip_batch(n: int) -> list[str]:
    """`ip -batch` lines for n rails (one process: a fork costs ~0.2 s under TCG)."""
    lines = ["rule add pref 200 lookup local", "rule del pref 0"] if n else []
    for r in rails(n):
        a, b = r.netdev("a"), r.netdev("b")
        lines.append(f"link add {a} type veth peer name {b}")
        for end, peer in (("a", "b"), ("b", "a")):
            dev = r.netdev(end)
            lines += [f"addr add {r.ip(end)}/24 dev {dev}", f"link set {dev} up",
                      f"route add {r.ip(peer)}/32 dev {dev} table {r.table(end)}",
                      f"rule add pref 100 from {r.ip(end)} iif lo lookup {r.table(end)}"]
    return lines


def rdma_batch(n: int) -> list[str]:
    return [f"link add {r.device(e)} type rxe netdev {r.netdev(e)}" for r in rails(n) for e in ENDS]


def setup_script(n: int) -> str:
    """bash that builds n rails (guest_init.sh runs it with the env file to append the GID index to)."""
    if n == 0:
        return "true\n"
    devices = " ".join(r.device(e) for r in rails(n) for e in ENDS)
    ips = " ".join(r.ip(e) for r in rails(n) for e in ENDS)
    return "\n".join([
        "set -e", "modprobe -a rdma_rxe veth",
        "echo 1 > /proc/sys/net/ipv4/conf/all/accept_local",
        "ip -batch - <<'EOF'", *ip_batch(n), "EOF",
        "rdma -b - <<'EOF'", *rdma_batch(n), "EOF",
        _WAIT_AND_GID.format(devices=devices, ips=ips, n=n)])


# Wait (bash builtins only, at most 20 s) until every port is ACTIVE and shows its IPv4 RoCE v2 GID,
# and publish that GID's index (the same on every device, or the set-up fails).
_WAIT_AND_GID = """ips=({ips}); k=0; index=
for d in {devices}; do
  p=/sys/class/infiniband/$d/ports/1; want=${{ips[$k]}}; k=$((k + 1)); found=
  for try in $(seq 200); do
    read -r state < $p/state
    if [[ $state == *ACTIVE ]]; then
      for g in $p/gids/*; do
        i=${{g##*/}}; read -r gid < $g 2>/dev/null || continue
        [[ $gid == 0000:0000:0000:0000:0000:ffff:* ]] || continue
        read -r type < $p/gid_attrs/types/$i 2>/dev/null || continue
        h=${{gid:30:4}}${{gid:35:4}}; ip4=$((16#${{h:0:2}})).$((16#${{h:2:2}})).$((16#${{h:4:2}})).$((16#${{h:6:2}}))
        [[ $type == "RoCE v2" && $ip4 == $want ]] && {{ found=$i; break; }}
      done
    fi
    [ -n "$found" ] && break; sleep 0.1
  done
  [ -n "$found" ] || {{ echo "$d: no ACTIVE port with a RoCE v2 GID for $want after 20 s (state: $state)"; exit 1; }}
  [ -z "$index" ] || [ "$index" = "$found" ] || {{ echo "$d: IPv4 GID at index $found, others at $index"; exit 1; }}
  index=$found
done
echo "R2CC_GUEST_GID_INDEX=$index" >> "$1"
echo "rails: {n} up, IPv4 RoCE v2 GID index $index"
"""


def env(n: int) -> dict[str, str]:
    """The map the command gets: R2CC_GUEST_RAILS_A="rxe_a0:1,rxe_a1:1" and the like (the GID index
    is added in the guest, once the devices show it)."""
    out = {"R2CC_GUEST_RAILS": str(n)}
    for end in ENDS:
        E = end.upper()
        out[f"R2CC_GUEST_RAILS_{E}"] = ",".join(f"{r.device(end)}:{PORT}" for r in rails(n))
        out[f"R2CC_GUEST_IPS_{E}"] = ",".join(r.ip(end) for r in rails(n))
        out[f"R2CC_GUEST_NETDEVS_{E}"] = ",".join(r.netdev(end) for r in rails(n))
    return out


def parse_env(environ) -> list[dict[str, dict[str, str]]]:
    """The rails env back, one dict per rail: {"a": {"device", "port", "ip", "netdev"}, "b": {...}}."""
    n = int(environ.get("R2CC_GUEST_RAILS", "0"))
    out: list[dict[str, dict[str, str]]] = [{} for _ in range(n)]
    for end in ENDS:
        E = end.upper()
        fields = [environ[f"R2CC_GUEST_{k}_{E}"].split(",") if n else [] for k in ("RAILS", "IPS", "NETDEVS")]
        for i, (dev, ip, net) in enumerate(zip(*fields)):
            name, port = dev.split(":")
            out[i][end] = {"device": name, "port": port, "ip": ip, "netdev": net}
    return out
