"""The key of a piece of the run, as records, files, triage jobs and verdicts name it: "graph0" (a graph),
"graph0/thunder_0" (a split), "graph0/thunder_0/nvFusion0_forward" (a fusion region, by its name and phase). One
place writes and reads the form; a key is a `str`, so that it is a JSON key and a dict key as it is.

Example:
    >>> split = PieceKey.of("graph0", "thunder_0")
    >>> split, split.region("nvFusion0_forward")
    ('graph0/thunder_0', 'graph0/thunder_0/nvFusion0_forward')
    >>> key = PieceKey("graph1/thunder_2/TorchCompile1_backward")
    >>> key.graph_name, key.split_name, key.region_name, key.split_key
    ('graph1', 'thunder_2', 'TorchCompile1_backward', 'graph1/thunder_2')
"""

from __future__ import annotations

SEPARATOR = "/"


class PieceKey(str):
    """A piece's key (see the module docstring); its parts read back by `graph_name`, `split_name`, `region_name`."""

    __slots__ = ()

    @classmethod
    def of(cls, graph: str, split: str | None = None, region: str | None = None) -> PieceKey:
        """The key of graph `graph`, of its split `split`, or of that split's region `region` ("nvFusion0_forward")."""
        if split is None:
            return cls(graph)
        return cls(SEPARATOR.join([graph, split] + ([region] if region is not None else [])))

    def region(self, region: str) -> PieceKey:
        """The key of this split's region `region` ("nvFusion0_forward")."""
        return PieceKey(f"{self}{SEPARATOR}{region}")

    def _parts(self) -> list[str]:
        return str.split(self, SEPARATOR, 2)

    @property
    def graph_name(self) -> str:
        return self._parts()[0]

    @property
    def split_name(self) -> str | None:
        parts = self._parts()
        return parts[1] if len(parts) > 1 else None

    @property
    def region_name(self) -> str | None:
        parts = self._parts()
        return parts[2] if len(parts) > 2 else None

    @property
    def split_key(self) -> PieceKey | None:
        """The key of the split this piece is or lies in (None for a graph)."""
        parts = self._parts()
        return PieceKey(SEPARATOR.join(parts[:2])) if len(parts) > 1 else None
