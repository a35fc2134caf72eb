"""How a group's transport and built-in all_reduce are set, from the R2CC_* knobs."""

from __future__ import annotations

from dataclasses import dataclass

from r2cc_serve import _C, envs
from r2cc_serve.errors import UserError


def transport_options(**overrides) -> "_C.TransportOptions":
    """TransportOptions from the R2CC_* knobs, with explicit overrides on top."""
    opt = _C.TransportOptions()
    for knob in envs.transport_knobs():  # the registry says which knob sets which field
        setattr(opt, knob.transport, envs.get(knob.name))
    for key, value in overrides.items():
        if not hasattr(opt, key):
            raise UserError(f"unknown transport option {key!r}")
        setattr(opt, key, value)
    return opt


@dataclass
class BuiltinTuning:
    """How the built-in C++ all_reduce cuts its work (equal on every rank)."""

    slice_bytes: int     # R2CC_PIPELINE_BYTES: reduction of one slice overlaps the next's transfer
    one_shot_bytes: int  # up to this, one exchange of whole inputs (sched.group.one_shot_cutoff)

    @classmethod
    def from_knobs(cls, world_size: int) -> "BuiltinTuning":
        from r2cc_serve.sched.group import one_shot_cutoff

        return cls(slice_bytes=envs.get("R2CC_PIPELINE_BYTES"),
                   one_shot_bytes=one_shot_cutoff(world_size, envs.get("R2CC_ALLREDUCE_ONE_SHOT_BYTES"),
                                                  envs.get("R2CC_PAIR_ONE_SHOT_BYTES")))
