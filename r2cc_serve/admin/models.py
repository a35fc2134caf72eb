"""Response models of the admin API (they make the OpenAPI schema complete)."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, Field

RailState = Literal["up", "slow", "held", "draining", "drained", "down", "recovering", "connecting", "aborted"]


class Connection(BaseModel):
    peer: int = Field(description="peer rank")
    peer_host: str
    state: RailState
    bytes_sent: int
    bytes_recv: int
    chunks_resent: int
    failovers: int
    last_error: str


class Decision(BaseModel):
    action: Literal["drain", "failover"]
    reason: Optional[str] = Field(description="as given with the action (?reason=)")
    by: str = Field(description="who: first 8 hex digits of the sha256 of the admin token used")
    at: float = Field(description="when, unix seconds")


class Hold(BaseModel):
    reason: str = Field(description="why the rail is held out: its failures, the penalty, the last error (or that the "
                        "peer holds it)")
    left_s: float = Field(description="seconds until this host's hold ends (0: only the peer holds it)")
    failures: int = Field(description="failures counted by flap dampening on this rail, over all peers")
    holds: int = Field(description="times this host held the rail out")
    penalty: float = Field(description="the dampening penalty now (each failure adds 1, it halves every "
                           "R2CC_FLAP_HALF_LIFE_S; the rail is held at R2CC_FLAP_THRESHOLD)")


class Rail(BaseModel):
    host: str
    rail: int
    interface: str
    address: str
    fallback: bool = Field(description="a fallback rail carries data only when every primary rail is down")
    state: RailState
    peers: list[str]
    bandwidth_Bps: float = Field(description="measured goodput while busy, bytes per second, from transfers of at least half a "
                                   "chunk per busy period; 0 until such a transfer has run (decode-sized "
                                   "messages measure round trips, not bandwidth)")
    rtt_s: float
    bytes_sent: int
    bytes_received: int
    chunks_resent: int
    bytes_resent: int
    failovers: int
    flap_failures: int = Field(0, description="failures that count towards flapping (operator failovers and gray "
                                           "set-asides that cleared by themselves do not)")
    retrans_pct: float = Field(0.0, description="share of data segments the kernel retransmitted on this rail in the "
                               "last loss window, percent (the worst connection); a healthy rail is near 0")
    loss_holds: int = Field(0, description="times the rail was held out for losing packets")
    gray_suspects: int = Field(0, description="times the rail was set aside while the peer still spoke on it: "
                               "our bytes stuck or crawling, or the peer's stopped on it alone (a gray failure)")
    detection_s: float = Field(description="silence before the last failure was declared")
    last_error: Optional[str]
    last_error_time: Optional[float] = Field(description="unix seconds")
    connections: list[Connection]
    decisions: list[Decision] = Field(default_factory=list, description=(
        "the operator's drain or failover of this host's rail, while it holds (until undrain or restore); "
        "kept across restarts with R2CC_STATE_DIR"))
    hold: Optional[Hold] = Field(None, description=(
        "the rail failed often enough lately (flap dampening) or loses packets (reason 'lossy: ...') to be held "
        "out (state held: connected and probed, no new chunks) until left_s runs out or POST .../restore; null "
        "when not held"))
    sampled_at: Optional[float] = Field(None, description=(
        "when this host's ranks sampled these numbers, unix seconds by the host's clock (the oldest of its ranks' "
        "samples; null from agents that do not say). A state change is sampled at once, counters and byte totals "
        "up to R2CC_STATUS_REFRESH_MS apart: a reader that needs the bytes of a load that just ended waits for a "
        "sampled_at after its end"))
    stale: bool = Field(False, description=(
        "a rank of this host missed the admin view's last poll and its last answer stands in (after 5 s the rank "
        "is also reported unreachable in /health): sampled_at falls behind while counters seem to stall"))


class RailList(BaseModel):
    rails: list[Rail]
    updated: float


class Health(BaseModel):
    status: Literal["ok", "degraded", "down"]
    reasons: list[str]
    updated: float


class Event(BaseModel):
    time: float
    group: str
    rank: int
    node: int
    host: str
    peer: int
    kind: Literal["rail", "peer"] = Field("rail", description="rail: a rail changed state; peer: the peer's "
                                          "process stalled (silent while its host acknowledges) or resumed")
    rail: Optional[int] = Field(description="the rail (null for peer events)")
    address: Optional[str]
    to: str
    error: str
    detect_s: Optional[float]
    from_: str = Field(alias="from")

    model_config = {"populate_by_name": True}


class AdminEvent(BaseModel):
    time: float
    kind: Literal["admin"] = Field(description="a mutation request to this admin API (allowed or refused)")
    action: Literal["drain", "undrain", "failover", "restore"]
    host: str
    rail: Optional[int] = Field(description="null when the path's rail was not a number")
    force: Optional[bool] = Field(description="null when ?force= was not a boolean")
    reason: Optional[str]
    by: str = Field(description="first 8 hex digits of the sha256 of the bearer token presented; 'none' without one")
    client: str = Field(description="the client's address")
    status: int = Field(description="the HTTP status answered")
    result: Literal["ok", "unauthorized", "forbidden", "not_found", "conflict", "invalid", "partial",
                    "unavailable", "error"]
    detail: str = Field(description="the answer in short: the rail's state after it, or why not")


class EventList(BaseModel):
    events: list[Union[Event, AdminEvent]] = Field(description="kind tells them apart: rail, peer or admin")


class ActionResult(BaseModel):
    host: str
    rail: int
    action: Literal["drain", "undrain", "failover", "restore"]
    ranks: list[int]
    state: RailState | Literal["unknown"] = Field(
        description="the rail's state as the acting ranks reported it right after the action; 'unknown' when "
                    "the action was done but no reply said how the rail stands (GET /rails shows it shortly)")
    warnings: list[str] = Field(default_factory=list, description="done, but e.g. a rank could not record it "
                                "in R2CC_STATE_DIR (a restart will not keep it)")


class PlanRank(BaseModel):
    rank: int
    host: str
    epoch: Optional[int] = Field(description="the bandwidth table this rank plans with (null: builtin path)")
    bandwidth_Bps: Optional[float] = Field(description="the rank's capacity in the agreed table: its healthy "
                                           "rails times R2CC_RAIL_BPS, or R2CC_BANDWIDTH_TABLE")


class PlanChoice(BaseModel):
    op: str
    size_bucket_bytes: int
    elem_bytes: int
    schedule: str = Field(description="direct, one_shot, optcc, ring or r2ccl")
    chunks: int = Field(description="micro-chunks the schedule pipelines over")
    estimate_s: float = Field(description="the cost model's time for the bucket")


class GroupPlan(BaseModel):
    group: str
    schedule: str = Field(description="R2CC_SCHEDULE: builtin (fixed C++ path), auto (planner) or a forced plan")
    epoch: Optional[int]
    agreed: bool = Field(description="every rank reports the same epoch")
    ranks: list[PlanRank]
    choices: list[PlanChoice] = Field(description="the planner's decisions so far, per size bucket")


class PlanList(BaseModel):
    groups: list[GroupPlan]


class ErrorBody(BaseModel):
    detail: str
