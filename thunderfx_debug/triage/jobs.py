"""What a child process of the flush is given to run one Thunder split of the run again (and its fusion regions):
a folder the training process writes and the child reads, so that nothing of the run but files crosses over.

    <folder>/piece.json     what to run and how: the split's key, Thunder's options and executors by name (with the
                            modules that register them), the grad mode and autocast of the recorded call, the inputs'
                            metadata of the split and of each region, the run's final traces of the split (what the
                            child's compile must reproduce), the triage's settings
    <folder>/graph.bin      the split's FX module as Dynamo built it (`graph_codec`)
    <folder>/tensors.pt     the inputs the run really had, where it has them: the captured call
                            (THUNDERFX_DEBUG_INPUTS=real) and the run's own tensors still alive and laid out as on the
                            recorded call (parameters, buffers, position ids...), as host copies in the format of
                            `recording.capture` (`torch.load(..., weights_only=True)`)
    <folder>/go             the flush's word to a child that compiled the split ahead of it (`triage.ahead`):
                            the files above are now the flush's, with the run's tensors
    <folder>/results.jsonl  written by the child, one message a line (`children.protocol`): a line when it starts a
                            piece and each step of it, a line with the piece's record when it is done; what the
                            parent reads, even of a child that died

Executors reach a child by name (`thunder.extend.get_executor`): Thunder's own are there once Thunder is imported; an
executor of the user's is there where its module registers it when imported (the child imports the modules in which
the run's executor objects are found as globals, pickle's rule for finding a function), or where the child is a fork
of the training process (on CPU, `triage.at_flush`), which has every executor the run registered.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from thunderfx_debug.children.protocol import message_line, messages
from thunderfx_debug.records import InputMeta, Triage
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.thunder import options as thunder_options

FORMAT = 1
DESCRIPTION, GRAPH, TENSORS, RESULTS = "piece.json", "graph.bin", "tensors.pt", "results.jsonl"
#: The flush's word to a child compiling ahead of it (`child.run_ahead`): the job in the folder is complete.
GO = "go"


@dataclasses.dataclass(frozen=True)
class PieceInputs:
    """How a child makes one piece's inputs: their metadata (with index bounds and value ranges) and names; the
    tensors themselves, where the run has them, travel in `tensors.pt`."""

    metas: tuple[InputMeta, ...]
    names: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"metas": [m.to_json() for m in self.metas], "names": list(self.names)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PieceInputs:
        return cls(tuple(InputMeta.from_json(m, f"metas[{i}]") for i, m in enumerate(data["metas"])),
                   tuple(data["names"]))


@dataclasses.dataclass(frozen=True)
class ThunderSetup:
    """How the child compiles the split as ThunderFX compiled it in the run: `thunder.jit` with the run's literal
    options, its executors by name (None: Thunder's defaults) after importing `executor_modules`, and ThunderFX's
    prologue pruning as the run had it (`skip_check_on_input_tensors`; None where the run had none)."""

    options: dict[str, Any]
    executors: tuple[str, ...] | None
    executor_modules: tuple[str, ...] = ()
    prologue_pruning: bool | None = None


@dataclasses.dataclass(frozen=True)
class SplitJob:
    """One Thunder split of the run and, at `level` "fusion", its fusion regions (by region key, "nvFusion0_forward"),
    to time against inductor (see `triage.at_flush`)."""

    key: str  # "graph0/thunder_0"
    setup: ThunderSetup
    inputs: PieceInputs
    grad_enabled: bool
    autocast: tuple[tuple[str, bool, str], ...]  # (device type, enabled, dtype name) per device type
    grad_outputs: tuple[InputMeta | None, ...] | None  # the layout of the gradient each output received, where known
    regions: tuple[tuple[str, PieceInputs], ...]
    fwd_text: str | None
    bwd_text: str | None
    level: str
    deviation: float
    looks: tuple[int, ...]
    calls: int
    piece_timeout_s: float
    device_lock: str | None = None  # a file whose lock a child holds while it runs the piece on the device

    @property
    def pieces(self) -> list[str]:
        """The owner keys of what the job judges, in the order the child takes them: the split, then its regions."""
        return [self.key, *(str(PieceKey(self.key).region(region)) for region, _ in self.regions)]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(format=FORMAT, setup=dataclasses.asdict(self.setup), inputs=self.inputs.to_json(),
                    grad_outputs=None if self.grad_outputs is None else [
                        None if m is None else m.to_json() for m in self.grad_outputs],
                    regions=[[key, inputs.to_json()] for key, inputs in self.regions])
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SplitJob:
        if data.get("format") != FORMAT:
            raise ValueError(f"a job of format {data.get('format')!r}; this code reads format {FORMAT}")
        grad_outputs = data["grad_outputs"]
        setup = data["setup"]
        return cls(
            key=data["key"],
            setup=ThunderSetup(setup["options"], None if setup["executors"] is None else tuple(setup["executors"]),
                               tuple(setup["executor_modules"]), setup["prologue_pruning"]),
            inputs=PieceInputs.from_json(data["inputs"]), grad_enabled=data["grad_enabled"],
            autocast=tuple(tuple(a) for a in data["autocast"]),
            grad_outputs=None if grad_outputs is None else tuple(
                None if m is None else InputMeta.from_json(m, "grad_outputs") for m in grad_outputs),
            regions=tuple((key, PieceInputs.from_json(inputs)) for key, inputs in data["regions"]),
            fwd_text=data["fwd_text"], bwd_text=data["bwd_text"], level=data["level"], deviation=data["deviation"],
            looks=tuple(data["looks"]), calls=data["calls"],
            piece_timeout_s=data["piece_timeout_s"], device_lock=data.get("device_lock"))


@dataclasses.dataclass(frozen=True)
class RunTensors:
    """A piece's inputs as the run had them, host copies (`recording.capture`'s format): `captured`, every input of
    the recorded call (None where not captured); `live`, by input index, the run's own tensors still alive and laid
    out as on that call."""

    captured: list[Any] | None = None
    live: dict[int, Any] = dataclasses.field(default_factory=dict)


def write(folder: Path, job: SplitJob, graph: bytes, tensors: Mapping[str, RunTensors]) -> None:
    """Writes `job` into `folder`: `tensors` by owner key (the split's and its regions')."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / GRAPH).write_bytes(graph)
    buffer = io.BytesIO()
    # Plain str keys: a `PieceKey` would be a global that `torch.load(weights_only=True)` refuses.
    torch.save({str(owner): {"captured": t.captured, "live": t.live} for owner, t in tensors.items()}, buffer)
    (folder / TENSORS).write_bytes(buffer.getvalue())
    (folder / DESCRIPTION).write_text(json.dumps(job.to_json()))


def read(folder: Path) -> tuple[SplitJob, bytes, dict[str, RunTensors]]:
    """The job, its graph's bytes (`graph_codec.decode`) and its tensors by owner key."""
    job = SplitJob.from_json(json.loads((folder / DESCRIPTION).read_text()))
    tensors = torch.load(folder / TENSORS, weights_only=True)
    return job, (folder / GRAPH).read_bytes(), {owner: RunTensors(t["captured"], t["live"])
                                                 for owner, t in tensors.items()}


def executor_modules(executors: Iterable[Any]) -> tuple[str, ...]:
    """The modules in which `executors` (Thunder executor objects) are found as globals, `__main__` and Thunder's
    own left out (a child imports Thunder anyway, and cannot import the training script): a child that imports them
    has these executors where their modules register them on import (`thunder.options.executor_modules`)."""
    return tuple(sorted({module for module, _ in thunder_options.executor_modules(executors).values()
                         if module is not None}))


# ---- the results a child writes -------------------------------------------------------------------------------------
class Results:
    """`results.jsonl` of a job: what its children started and finished, line by line, so that what a child did
    before it died is kept.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> results = Results(folder)
        >>> results.step("graph0/thunder_0", "compiling the split with Thunder", attempt=0)
        >>> results.done("graph0/thunder_0", Triage(error="not judged: an example"))
        >>> again = Results(folder)
        >>> again.started("graph0/thunder_0"), again.records()["graph0/thunder_0"].error
        (True, 'not judged: an example')
        >>> Results(folder).last_step("graph0/thunder_0")
        ('compiling the split with Thunder', 0)
        >>> results.retry(["graph0/thunder_0"])  # to be judged again: what was written of it is set aside
        >>> Results(folder).started("graph0/thunder_0"), Results(folder).records()
        (False, {})
    """

    def __init__(self, folder: Path):
        self.path = folder / RESULTS

    def _lines(self) -> list[dict[str, Any]]:
        """The lines, each piece's from its last `retry` on (`protocol.messages` leaves out the last line of a child
        killed while writing it)."""
        if not self.path.exists():
            return []
        lines = []
        for entry in messages(self.path.read_text()):
            if entry.get("retry"):
                lines = [kept for kept in lines if kept["piece"] != entry["piece"]]
            else:
                lines.append(entry)
        return lines

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a") as out:
            out.write(message_line(entry))
            out.flush()

    def step(self, piece: str, what: str, attempt: int) -> None:
        """`piece` starts `what` ("inductor's first call"), in the child of `attempt`."""
        self._append({"piece": piece, "step": what, "attempt": attempt, "at": round(time.time(), 3)})  # wall clock

    def done(self, piece: str, triage: Triage) -> None:
        self._append({"piece": piece, "triage": triage.to_json()})

    def retry(self, pieces: Sequence[str]) -> None:
        """`pieces` are to be judged again: what children wrote of them so far is set aside."""
        for piece in pieces:
            self._append({"piece": piece, "retry": True})

    def started(self, piece: str) -> bool:
        return any(line["piece"] == piece for line in self._lines())

    def records(self) -> dict[str, Triage]:
        return {line["piece"]: Triage.from_json(line["triage"], f"{self.path.name}: {line['piece']}")
                for line in self._lines() if "triage" in line}

    def last_step(self, piece: str) -> tuple[str, int] | None:
        """(the last step `piece` started, the attempt it started in), None where it started none."""
        steps = [(line["step"], line["attempt"]) for line in self._lines() if line["piece"] == piece and "step" in line]
        return steps[-1] if steps else None


def pieces_left(job: SplitJob, folder: Path) -> list[str]:
    """The pieces of `job` that no child has started yet."""
    results = Results(folder)
    return [piece for piece in job.pieces if not results.started(piece)]


def literal_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the options a child can be given as they are: JSON values, executors and transforms aside; the names of
    the others)."""
    literal, other = {}, []
    for key, value in options.items():
        if key in ("executors", "transforms"):
            continue
        try:
            if json.loads(json.dumps(value)) == value:
                literal[key] = value
                continue
        except (TypeError, ValueError):
            pass
        other.append(key)
    return literal, other

