"""Delta debugging over a piece's ops: the smallest cut that still fails the same way.

A cut keeps some ops and some outputs; the ops it drops that the kept ones read become inputs, with the values the
full piece computed (eager, on the piece's inputs: `full_values`), and whatever the kept outputs do not need is
dead and goes too, inputs with it. Each cut is judged by writing it as a script and running that script in a child
process (`trials`); it is kept only if its verdict fails the same way as the full piece's (`verdict`).

The strategies are those of PyTorch's FX minifier (`torch._functorch.fx_minifier.minifier`), in this order: drop
outputs the failure does not need (delta debugging over the outputs), truncate the suffix (with one output left, the
earliest op whose value still fails, by bisection), cut a prefix (the most leading ops that can become inputs, by
bisection), then delta debugging proper: drop chunks of ops, half the piece first, then smaller chunks, until no
single op can go; last, each remaining output alone. Bisection first because each trial compiles the piece in a
fresh child (seconds each): a chain of n ops is cut to its faulty op in about 2 log2(n) trials. Every cut tried is
kept in a cache by what it keeps, so no cut runs twice.

Example (a fake judge that fails whenever op 5 is kept and returned through):
    >>> from thunderfx_debug.minimize.statements import PieceCode
    >>> source = "def f(x):\\n" + "".join(f"  y{i} = {'x' if i == 0 else f'y{i - 1}'} + {i}\\n" for i in range(12))
    >>> code = PieceCode.parse(source + "  return (y11,)\\n", "f")
    >>> cuts = Cuts(code, {name: torch.zeros(1) for name in ["x"] + [f"y{i}" for i in range(12)]})
    >>> best, tried = cuts.shrink(lambda cut: 5 in cut.kept)
    >>> best.kept, best.inputs, best.outputs, tried
    ((5,), ('y4',), ('y5',), 6)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from thunderfx_debug.artifacts.repro import script_template
from thunderfx_debug.minimize.statements import PieceCode
from thunderfx_debug.minimize.trials import BudgetSpent
from thunderfx_debug.minimize.writing import Cut, savable


def full_values(code: PieceCode, namespace: Mapping[str, Any], inputs: Sequence[Any], grad: bool) -> dict[str, Any]:
    """Every value the piece computes, by name, when eager PyTorch runs its code on `inputs` (copies of them; the
    template's seed first, as every run of a script), with its parameters' values: what cut ops hand on. Each value
    is copied right after the op that made it (a later in-place op cannot change it), in its layout; with `grad`
    a value keeps whether it requires grad (the gradients of a split flow through it)."""
    recorded: dict[str, Any] = {}

    def record(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor) and savable(value):
            copy = script_template.fresh([value.detach()])[0]
            wants = value.requires_grad and (copy.is_floating_point() or copy.is_complex())
            value = copy.requires_grad_(wants)
        recorded[name] = value

    text = code.render(range(len(code.ops)), code.outputs, code.params, record=True)
    scope = dict(namespace, __record__=record)
    exec(compile(text, f"<thunderfx_debug minimize: {code.name}>", "exec"), scope)  # noqa: S102 (the script's own code)
    arguments = script_template.fresh(list(inputs))
    torch.manual_seed(script_template.SEED)
    with torch.set_grad_enabled(grad):
        code.instance(scope)(*arguments)
    recorded.update(zip(code.params, inputs))
    return recorded


class Cuts:
    """The cuts of one piece (`code` with every value it computes, `values`) and the search for the smallest one
    that `fails` (see the module docstring)."""

    def __init__(self, code: PieceCode, values: Mapping[str, Any]):
        self.code, self.values = code, values
        kept, inputs = code.live(range(len(code.ops)), code.outputs)
        self.full = Cut(kept, code.outputs, inputs)
        self.best = self.full
        self.tried = 0
        self._seen: dict[tuple, bool] = {}
        self._fails: Callable[[Cut], bool] = lambda cut: False

    def cut(self, kept: Sequence[int], outputs: Sequence[str]) -> Cut | None:
        """The cut that keeps `kept` (and only what `outputs` need of it); None where it would take a value that
        cannot be an input of a script (a tuple of tensors, say) or returns nothing."""
        if not outputs:
            return None
        alive, inputs = self.code.live(kept, outputs)
        if not alive or any(name not in self.values or not savable(self.values[name]) for name in inputs):
            return None
        return Cut(alive, tuple(outputs), inputs)

    def _try(self, cut: Cut | None) -> bool:
        """Whether `cut` fails (judged once); a failing cut smaller than the best so far becomes the best."""
        if cut is None:
            return False
        key = (cut.kept, cut.outputs)
        if key not in self._seen:
            if key == (self.best.kept, self.best.outputs):
                return True
            self.tried += 1
            self._seen[key] = bool(self._fails(cut))
        failed = self._seen[key]
        if failed and (len(cut.kept), len(cut.outputs)) < (len(self.best.kept), len(self.best.outputs)):
            self.best = cut
        return failed

    def shrink(self, fails: Callable[[Cut], bool]) -> tuple[Cut, int]:
        """(the smallest failing cut found, how many cuts were judged). `fails` judges a cut; it may raise
        `BudgetSpent`, and the best cut so far is returned."""
        self._fails = fails
        try:
            self._drop_outputs()
            self._truncate_suffix()
            self._cut_prefix()
            self._drop_chunks()
            self._drop_each_output()
        except BudgetSpent:
            pass
        return self.best, self.tried

    # ---- strategies ---------------------------------------------------------------------------------------------
    def _drop_outputs(self) -> None:
        """Delta debugging over the outputs: keep a part of them (then everything else of it), halving."""
        parts = 2
        while len(self.best.outputs) >= 2:
            outputs = list(self.best.outputs)
            size = -(-len(outputs) // parts)
            subsets = [outputs[i:i + size] for i in range(0, len(outputs), size)]
            chosen = next((s for s in subsets if self._try(self.cut(self.best.kept, s))), None)
            if chosen is None and parts > 2:
                chosen = next((c for c in ([o for o in outputs if o not in s] for s in subsets)
                               if self._try(self.cut(self.best.kept, c))), None)
            if chosen is not None:
                parts = 2
            elif parts < len(outputs):
                parts = min(2 * parts, len(outputs))
            else:
                return

    def _returnable(self, index: int) -> str | None:
        """The first value op `index` defines that a script can return (a tensor), if any."""
        return next((n for n in self.code.ops[index].defines if isinstance(self.values.get(n), torch.Tensor)), None)

    def _truncate_suffix(self) -> None:
        """With one output: the earliest op whose value, returned instead, still fails (bisection)."""
        if len(self.best.outputs) != 1:
            return
        last = self.code.defined_at().get(self.best.outputs[0])
        if last is None:
            return
        positions = [i for i in self.best.kept if i <= last and self._returnable(i)]
        low, high = 0, len(positions) - 1  # positions[high] is the output's own op: it fails
        while low < high:
            middle = (low + high) // 2
            if self._try(self.cut(self.best.kept, (self._returnable(positions[middle]),))):
                high = middle
            else:
                low = middle + 1

    def _cut_prefix(self) -> None:
        """The most leading ops that can become inputs (bisection)."""
        kept = self.best.kept
        low, high = 0, len(kept) - 1  # dropping none fails; dropping all would leave no op
        while low < high:
            middle = (low + high + 1) // 2
            if self._try(self.cut(kept[middle:], self.best.outputs)):
                low = middle
            else:
                high = middle - 1

    def _drop_chunks(self) -> None:
        """Drop chunks of ops, half the piece first, each chunk size until no chunk can go, then smaller ones."""
        size = max(1, len(self.best.kept) // 2)
        while size >= 1 and len(self.best.kept) > 1:
            size = min(size, max(1, len(self.best.kept) // 2))
            progress, start = False, 0
            while start < len(self.best.kept) and len(self.best.kept) > 1:
                window = set(self.best.kept[start:start + size])
                rest = [i for i in self.best.kept if i not in window]
                before = self.best
                if rest and self._try(self.cut(rest, self.best.outputs)) and self.best is not before:
                    progress = True
                else:
                    start += size
            if not progress:
                size //= 2

    def _drop_each_output(self) -> None:
        for output in list(self.best.outputs):
            if len(self.best.outputs) > 1:
                self._try(self.cut(self.best.kept, [o for o in self.best.outputs if o != output]))
