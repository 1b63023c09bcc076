"""A piece's code as the ops a minimizer can cut: the statements of a region's torch function (Thunder's torch
executor lowers each bound symbol of the region to one statement or a few) or of a split's `forward` (one statement
per FX node, as Thunder's writer prints the graph), parsed from the text a repro script carries.

`PieceCode.parse(source, name)` finds the function (or the class, whose `forward` is the piece) named `name` in
`source`; `render(kept, outputs, inputs)` writes it back with only the ops `kept`, returning `outputs`, taking
`inputs` (original parameters and values of cut ops, in that order); `live(kept, outputs)` is the dead-code
elimination that decides which ops and inputs a cut keeps. Statements keep their own text and the comments above
them (for a split, the model's source line each op came from), so the minimal script reads like the original.

Code that assigns a name again (Dynamo's in-place `x /= y`) is put in single-assignment form first:

    >>> twice = PieceCode.parse("def g(x, y):\\n  x /= y\\n  z = x * 2\\n  return (x, z)\\n", "g")
    >>> print(twice.render((0, 1), ("x__1", "z"), ("x", "y")))
    def g(x, y):
      x__1 = __import__('operator').itruediv(x, y)
      z = x__1 * 2
      return (x__1, z)

Example:
    >>> code = PieceCode.parse("def f(a, b):\\n  c = a + b  # c\\n  d = c * 2\\n  e = a - 1\\n  return (d, e)\\n", "f")
    >>> [op.defines for op in code.ops], code.outputs
    ([('c',), ('d',), ('e',)], ('d', 'e'))
    >>> code.live(range(3), ("d",))
    ((0, 1), ('a', 'b'))
    >>> print(code.render((1,), ("d",), ("c",)))
    def f(c):
      d = c * 2
      return (d,)
"""

from __future__ import annotations

import ast
import dataclasses
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Op:
    """One statement of the piece: its text (dedented, comments on its line kept), the names it defines and the
    piece's names it reads; `comment` is the block of comment lines that stands above it (or above its group)."""

    text: str
    defines: tuple[str, ...]
    uses: frozenset[str]
    comment: str = ""

    @property
    def label(self) -> str:
        """The statement's first line without comments: "t3 = torch.sin(t2)"."""
        first = self.text.splitlines()[0] if self.text else ""
        return first.split("  #", 1)[0].strip()[:120]


class NotAPiece(ValueError):
    """The source holds no function or class of that name that can be cut into ops."""


def _is_clean_up(statement: ast.stmt) -> bool:
    """`x = None` and `del x`: FX's code and Thunder's traces free values early; no op of the piece."""
    if isinstance(statement, ast.Delete):
        return True
    return (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
            and statement.value.value is None and all(isinstance(t, ast.Name) for t in statement.targets))


def _stored(node: ast.AST) -> tuple[str, ...]:
    names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return tuple(dict.fromkeys(names))


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@dataclasses.dataclass(frozen=True)
class PieceCode:
    """The piece as ops. `kind` "function" (a region's torch function) or "module" (an nn.Module class whose
    `forward` is the piece); `params` its parameters (without `self`) with their annotations' text; `outputs` the
    names it returns (in `return_style`: "tuple", "list" or "name"); `head`/`tail` the class text around `forward`."""

    kind: str
    name: str
    params: tuple[str, ...]
    annotations: Mapping[str, str]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    return_style: str
    head: str = ""
    tail: str = ""
    indent: str = "  "

    # ---- reading ----------------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, source: str, name: str) -> PieceCode:
        """The piece named `name` in `source`: a function, or a class with a `forward` method."""
        tree = ast.parse(source)
        node = next((n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name), None)
        if node is None:
            raise NotAPiece(f"no function or class named {name!r}")
        lines = source.splitlines()
        if isinstance(node, ast.ClassDef):
            forward = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
            if forward is None:
                raise NotAPiece(f"the class {name} has no forward method")
            start = _first_line(forward) - 1
            end = forward.end_lineno
            head = "\n".join(lines[_first_line(node) - 1:start])
            tail = "\n".join(lines[end:node.end_lineno])
            return cls._of_function(forward, lines, "module", name, head, tail, skip_self=True)
        return cls._of_function(node, lines, "function", name, "", "", skip_self=False)

    @classmethod
    def _of_function(cls, fn: ast.FunctionDef, lines: list[str], kind: str, name: str, head: str, tail: str,
                     skip_self: bool) -> PieceCode:
        arguments = fn.args
        if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs:
            raise NotAPiece(f"{name} takes *args, **kwargs or keyword-only arguments; only plain parameters are cut")
        args = list(arguments.args)[1 if skip_self else 0:]
        params = tuple(a.arg for a in args)
        annotations = {a.arg: ast.unparse(a.annotation) for a in args if a.annotation is not None}
        known = set(params)
        renamed: dict[str, str] = {}  # a name assigned again -> the name its latest value has (single assignment)
        ops: list[Op] = []
        outputs: tuple[str, ...] | None = None
        style = "tuple"
        comment, last_end = "", fn.lineno
        for statement in fn.body:
            block = _comment_block(lines, last_end, statement.lineno - 1)
            if block:
                comment = block
            last_end = statement.end_lineno
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and \
                    isinstance(statement.value.value, str):
                continue  # a docstring
            if _is_clean_up(statement):
                continue
            if isinstance(statement, ast.Return):
                outputs, style = _returned(statement, name)
                break
            text = _statement_text(lines, statement)
            single = _single_assignment(statement, known, renamed)
            if single is not None:  # written anew (its comments above it stay)
                statement, text = single, ast.unparse(single)
            defines = _stored(statement)
            ops.append(Op(text, defines, frozenset(_loaded(statement) & known), comment))
            known.update(defines)
        if outputs is None:
            raise NotAPiece(f"{name} returns nothing this can cut: it must end with `return` of names")
        outputs = tuple(renamed.get(o, o) for o in outputs)
        indent = " " * (fn.body[0].col_offset - fn.col_offset) if fn.body else "  "
        return cls(kind, name, params, annotations, tuple(ops), outputs, style, head, tail, indent)

    # ---- what a cut keeps -------------------------------------------------------------------------------------------
    def defined_at(self) -> dict[str, int]:
        """Name -> the index of the op that defines it."""
        return {name: i for i, op in enumerate(self.ops) for name in op.defines}

    def live(self, kept: Iterable[int], outputs: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(the ops of `kept` that the outputs need, the inputs they read): parameters first, in their order, then
        names that cut ops define, in the order the ops ran. An op that defines nothing (a call for its effect)
        is kept while it is in `kept`."""
        kept = sorted(set(kept))
        needed = {name for name in outputs}
        alive: list[int] = []
        for index in reversed(kept):
            op = self.ops[index]
            if not op.defines or needed.intersection(op.defines):
                alive.append(index)
                needed.update(op.uses)
        alive.reverse()
        produced = {name for i in alive for name in self.ops[i].defines}
        params = [p for p in self.params if p in needed and p not in produced]
        order = self.defined_at()
        cut = sorted((n for n in needed if n not in produced and n in order and n not in self.params), key=order.get)
        return tuple(alive), tuple(params + cut)

    # ---- writing ----------------------------------------------------------------------------------------------------
    def render(self, kept: Iterable[int], outputs: Sequence[str], inputs: Sequence[str],
               notes: Mapping[str, str] | None = None, record: bool = False) -> str:
        """The piece with only the ops `kept` (in their order), taking `inputs` and returning `outputs`. `notes`
        (input name -> text) become comments under the signature. With `record`, every value an op defines is also
        handed to `__record__(name, value)` right after the op, for the values of cut ops."""
        notes = notes or {}
        body: list[str] = [f"# {name}: {notes[name]}" for name in inputs if name in notes]
        shown = None
        for index in sorted(set(kept)):
            op = self.ops[index]
            if op.comment and op.comment != shown:
                body += ["", *op.comment.splitlines()]
                shown = op.comment
            body += op.text.splitlines()
            if record:
                body += [f"__record__({name!r}, {name})" for name in op.defines]
        body.append(f"return {self._returned(outputs)}")
        signature = ", ".join(f"{p}: {self.annotations[p]}" if p in self.annotations else p for p in inputs)
        if self.kind == "function":
            return f"def {self.name}({signature}):\n" + textwrap.indent("\n".join(body), self.indent)
        forward = f"{self.indent}def forward(self{', ' if inputs else ''}{signature}):\n" + textwrap.indent(
            "\n".join(body), self.indent * 2)
        return "\n".join(part for part in (self.head, forward, self.tail) if part)

    def _returned(self, outputs: Sequence[str]) -> str:
        if self.return_style == "name" and len(outputs) == 1:
            return outputs[0]
        if self.return_style == "list":
            return f"[{', '.join(outputs)}]"
        return f"({', '.join(outputs)}{',' if len(outputs) == 1 else ''})"

    def instance(self, namespace: Mapping[str, Any]):
        """The callable the piece's code defines in `namespace` (exec'd there): the function, or an instance of the
        class."""
        value = namespace[self.name]
        return value() if self.kind == "module" else value


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def _comment_block(lines: list[str], after: int, before: int) -> str:
    """The comment lines directly above line `before` (0-based), down to line `after`: the block that names the
    source of the ops below it."""
    block: list[str] = []
    for line in reversed(lines[after:before]):
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        block.append(stripped)
    return "\n".join(reversed(block))


def _statement_text(lines: list[str], statement: ast.stmt) -> str:
    """The statement's text, dedented; a comment that ends its last line stays with it where the line holds this
    statement alone."""
    first, last = statement.lineno - 1, statement.end_lineno - 1
    chunk = lines[first:last + 1]
    chunk[-1] = chunk[-1][:statement.end_col_offset] + _trailing_comment(chunk[-1][statement.end_col_offset:])
    chunk[0] = " " * statement.col_offset + chunk[0][statement.col_offset:]
    return textwrap.dedent("\n".join(chunk)).rstrip()


def _trailing_comment(rest: str) -> str:
    stripped = rest.strip()
    return f"  {stripped}" if stripped.startswith("#") else ""


#: The in-place operator of each augmented assignment (`x /= y` is `operator.itruediv(x, y)`, bound to x).
_IN_PLACE = {ast.Add: "iadd", ast.Sub: "isub", ast.Mult: "imul", ast.Div: "itruediv", ast.FloorDiv: "ifloordiv",
             ast.Mod: "imod", ast.Pow: "ipow", ast.LShift: "ilshift", ast.RShift: "irshift", ast.BitOr: "ior",
             ast.BitXor: "ixor", ast.BitAnd: "iand", ast.MatMult: "imatmul"}


class _Renamer(ast.NodeTransformer):
    def __init__(self, loads: Mapping[str, str], stores: Mapping[str, str]):
        self.loads, self.stores = loads, stores

    def visit_Name(self, node: ast.Name) -> ast.Name:
        table = self.stores if isinstance(node.ctx, ast.Store) else self.loads
        return ast.copy_location(ast.Name(table.get(node.id, node.id), node.ctx), node)


def _fresh(name: str, taken: set[str]) -> str:
    number = 1
    while f"{name}__{number}" in taken:
        number += 1
    return f"{name}__{number}"


def _single_assignment(statement: ast.stmt, known: set[str], renamed: dict[str, str]) -> ast.stmt | None:
    """`statement` in single-assignment form, or None where it is so already: a name assigned again (Dynamo's
    `router_top_value /= sum_1`, an in-place op, printed as an augmented assignment) gets a fresh name (`x__1`),
    and later statements read the latest value by it (`renamed` is updated); an augmented assignment becomes the
    in-place call it is (`x__1 = operator.itruediv(x, y)`, x__1 being x). Every op then defines each name once, so
    a cut can take any op's values as inputs."""
    loads = {old: new for old, new in renamed.items() if old in _loaded(statement)}
    again = [n for n in _stored(statement) if n in known]
    if not loads and not again:
        return None
    stores = {}
    for old in again:
        stores[old] = _fresh(old, known | set(renamed.values()) | set(stores.values()))
    if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
        target = statement.target.id
        call = ast.Call(ast.Attribute(ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant("operator")], []),
                                      _IN_PLACE[type(statement.op)], ast.Load()),
                        [ast.Name(target, ast.Load()), statement.value], [])
        statement = ast.copy_location(ast.Assign([ast.Name(target, ast.Store())], call), statement)
    statement = ast.fix_missing_locations(_Renamer(loads, stores).visit(statement))
    renamed.update(stores)
    return statement


def _returned(statement: ast.Return, name: str) -> tuple[tuple[str, ...], str]:
    value = statement.value
    if isinstance(value, ast.Name):
        return (value.id,), "name"
    if isinstance(value, ast.Tuple | ast.List) and all(isinstance(e, ast.Name) for e in value.elts):
        return tuple(e.id for e in value.elts), "list" if isinstance(value, ast.List) else "tuple"
    raise NotAPiece(f"{name} returns {ast.unparse(value) if value else 'None'}: only names (or a tuple or list of "
                    "names) can be cut")


def split_source(source: str, name: str) -> tuple[str, str]:
    """(the code around the function or class `name` in `source`, that definition's own text): the first is what
    the piece needs beside itself (imports, helpers), in its order."""
    lines = source.splitlines()
    around, piece = [], None
    for node in ast.parse(source).body:
        text = "\n".join(lines[_first_line(node) - 1:node.end_lineno])
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            piece = text
        else:
            around.append(text)
    if piece is None:
        raise NotAPiece(f"no function or class named {name!r}")
    return "\n".join(around), piece
