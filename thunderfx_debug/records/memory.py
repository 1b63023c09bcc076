"""What a piece holds in memory (`Memory`), measured on the run's sampled calls (`recording.memory`) or, for the
flush-time triage, in its child process for Thunder and for inductor on the same inputs (`Triage.thunder_memory`,
`Triage.inductor_memory`)."""

from __future__ import annotations

import dataclasses

from thunderfx_debug.records.codec import Count, JsonRecord, json_field


@dataclasses.dataclass(frozen=True)
class Memory(JsonRecord):
    """The memory one piece (a graph, a split, or the step) held on its measured calls, in bytes.

    `saved_bytes` is what the piece saved for its backward: the distinct storages of the tensors autograd saved
    while its forward ran, parameters' storages left out (a storage counted once however many saved tensors view
    it). `peak_forward_bytes` and `peak_backward_bytes` are the most the CUDA allocator held during the piece's
    forward and during its backward above what it held when that phase started (requested bytes, as the
    allocator's history records them), `peak_bytes` the larger of the two; None where not measured (on CPU, where
    the allocator keeps no history, or where `note` says why). Each figure is the largest over the `calls` measured
    calls; `saved_least_bytes` and `peak_least_bytes` are the smallest, so that a change between runs can be told
    from the spread within one.

    Example:
        >>> Memory(saved_bytes=3 << 20, peak_forward_bytes=5 << 20, peak_backward_bytes=7 << 20).peak_bytes
        7340032
    """

    JSON_DERIVED = ("peak_bytes",)  # for readers of the JSON; computed again on load

    saved_bytes: int | None = None
    peak_forward_bytes: int | None = None
    peak_backward_bytes: int | None = None
    calls: Count = 0
    saved_least_bytes: int | None = json_field(None, omit_default=True)
    peak_least_bytes: int | None = json_field(None, omit_default=True)
    peak_calls: Count = json_field(0, omit_default=True)
    note: str | None = json_field(None, omit_default=True)

    @property
    def peak_bytes(self) -> int | None:
        peaks = [p for p in (self.peak_forward_bytes, self.peak_backward_bytes) if p is not None]
        return max(peaks) if peaks else None
