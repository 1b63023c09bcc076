"""The unit of a dump's content, and what decides which artifacts a flush makes."""

from __future__ import annotations

import dataclasses
from typing import Any

from thunderfx_debug.settings.config import ReproKind


@dataclasses.dataclass(frozen=True)
class Artifact:
    """A file of the dump: `owner` is "graph0", "graph0/thunder_0" or "graph0/thunder_0/nvFusion0_forward",
    `label` the name the owner's record gives it in `files` (e.g. "repro_thunder"), `path` relative to the rank dir."""

    owner: str
    label: str
    path: str
    content: str | bytes


@dataclasses.dataclass(frozen=True)
class ArtifactSettings:
    """`repro`: the pieces that get repro scripts; `real_inputs`: scripts load the tensors the run saw
    (THUNDERFX_DEBUG_INPUTS=real); `thunder_options`: the run's Thunder options, which Thunder scripts reuse."""

    repro: frozenset[ReproKind] = frozenset()
    real_inputs: bool = False
    thunder_options: dict[str, Any] = dataclasses.field(default_factory=dict)
