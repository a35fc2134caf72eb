"""How a baseline that runs on gloo (torch's, or vLLM's default backend) is put on the rails.

A baseline is only honest if it is what a user would run, so each way of wiring gloo to the
lab's rails is a named variant, the same for `r2cc bench` (gloo, gloo-rails, gloo-mptcp) and
for serving (default, default-rails, default-mptcp):

- one:   GLOO_SOCKET_IFNAME=rail0. What a user configures: one NIC.
- rails: GLOO_SOCKET_IFNAME=rail0,rail1,...: one gloo device per rail; gloo spreads successive
         collectives over the devices, which costs it ~7x at 4 KiB against one device (kept so
         the difference stays visible).
- mptcp: rail0, with every process under kernel MPTCP (mptcpize plus our gloo fix, see
         lab/mptcp.py) and the lab's subflow endpoint on every other rail: the zero-code way to
         use every NIC that any Linux user has.
"""

from __future__ import annotations

from r2cc_serve.errors import UserError

VARIANTS = ("one", "rails", "mptcp")
_SUFFIX = {"one": "", "rails": "-rails", "mptcp": "-mptcp"}


def variant_of(name: str, base: str) -> str | None:
    """The variant a backend name asks for ("default-mptcp", base "default" -> "mptcp"), or None
    when the name is not a variant of `base`."""
    for variant, suffix in _SUFFIX.items():
        if name == base + suffix:
            return variant
    return None


def names(base: str) -> tuple[str, ...]:
    """Every backend name of `base`: ("gloo", "gloo-rails", "gloo-mptcp")."""
    return tuple(base + _SUFFIX[v] for v in VARIANTS)


def gloo_env(variant: str, rails: list[str], lab=None, base: dict | None = None) -> dict:
    """Variables that put gloo on the rails as `variant` says (merged into a process's env).

    lab: the Lab, checked for MPTCP endpoints when variant is mptcp. base: the environment the
    variables go into (an LD_PRELOAD there is kept behind ours).
    """
    if variant not in VARIANTS:
        raise ValueError(variant)
    if not rails:
        raise UserError("a gloo baseline needs at least one rail")
    if variant == "rails":
        return {"GLOO_SOCKET_IFNAME": ",".join(rails)}
    env = {"GLOO_SOCKET_IFNAME": rails[0]}
    if variant == "mptcp":
        from r2cc_testbed.lab import mptcp

        if lab is not None and not lab.mptcp and len(rails) > 1:
            raise UserError("the lab that is up has no MPTCP endpoints (built on a kernel without MPTCP, or by "
                            "an older r2cc): run `r2cc lab down` and bring it up again")
        env.update(mptcp.preload_env(base))
    return env
