"""Where a rank's rails are: from R2CC_RAILS / R2CC_NETNS / R2CC_FALLBACK_RAILS, or a YAML file.

YAML (R2CC_CONFIG=path):

    rails: [rail0, rail1, rail2, rail3]   # interface names or IPv4 addresses, same on every rank
    netns: r2cc-h{rank}                    # optional: namespace of the rank's rails ({rank}, {node})
    fallback_rails: [mgmt0]                # optional: used only when every rail to a peer is down

Environment variables override the file key by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from r2cc_serve import envs
from r2cc_serve.errors import UserError


@dataclass
class RailConfig:
    rails: list[str]
    netns: str | None = None
    fallback_rails: list[str] = field(default_factory=list)


def _split(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _read_yaml(path: str) -> dict:
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise UserError(f"R2CC_CONFIG={path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"R2CC_CONFIG={path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"R2CC_CONFIG={path}: expected a mapping with a 'rails' list")
    unknown = set(data) - {"rails", "netns", "fallback_rails"}
    if unknown:
        raise UserError(f"R2CC_CONFIG={path}: unknown keys {sorted(unknown)}; allowed: rails, netns, fallback_rails")
    for key in ("rails", "fallback_rails"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(x, str) for x in data[key])):
            raise UserError(f"R2CC_CONFIG={path}: '{key}' must be a list of interface names or IPv4 addresses")
    return data


def load_rail_config(rank: int, node: int = 0) -> RailConfig:
    """The rail map of global rank `rank` on node `node`."""
    path = envs.get("R2CC_CONFIG")
    data = _read_yaml(path) if path else {}
    rails = _split(envs.get("R2CC_RAILS")) or list(data.get("rails") or [])
    if not rails:
        raise UserError("r2cc has no rails configured: set R2CC_RAILS=rail0,rail1,... or R2CC_CONFIG=<yaml> "
                        "(example: configs/rails-lab.yaml)")
    netns = envs.get("R2CC_NETNS") or data.get("netns") or None
    if netns:
        try:
            netns = str(netns).format(rank=rank, node=node)
        except (KeyError, IndexError, ValueError):
            raise UserError(f"netns template {netns!r} may only use {{rank}} and {{node}}") from None
    fallback = _split(envs.get("R2CC_FALLBACK_RAILS")) or list(data.get("fallback_rails") or [])
    return RailConfig(rails=rails, netns=netns, fallback_rails=fallback)
