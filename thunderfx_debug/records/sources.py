"""Where a piece's ops came from in the model's code: the source lines the records name ("file:line function", the
form `graph.json` keeps in each piece's `sources`, most ops first, and in a backward piece's `reads_saved_from`) and
the code around them, read at flush (`SourceExcerpt`), so that a report shows the model's code where that code is
not.

Example:
    >>> text = "/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py:66 forward"
    >>> line = SourceLine.parse(text)
    >>> line.line, line.function, line.short, str(line) == text
    (66, 'forward', 'transformers/models/llama/modeling_llama.py:66 forward', True)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys

from thunderfx_debug.records.codec import JsonRecord

_INSTALLED = re.compile(r".*[/\\](?:site|dist)-packages[/\\]")


def short_path(path: str) -> str:
    """A path as a reader recognises it: an installed package's file from its package on
    ("transformers/models/llama/modeling_llama.py", from site-packages or from an import root on `sys.path`), else
    its last two parts ("train/model.py").

    Example:
        >>> short_path("/home/me/project/train/model.py"), short_path("model.py")
        ('train/model.py', 'model.py')
    """
    installed = _INSTALLED.sub("", path)
    if installed != path:
        return installed
    in_package = _in_package_on_path(path)
    if in_package:
        return in_package
    parts = re.split(r"[/\\]", path)
    return "/".join(parts[-2:])


def _in_package_on_path(path: str) -> str | None:
    """`path` from the deepest import root on `sys.path` it lies under, where that root is where packages are
    installed (it holds `*.dist-info`: `pip install --target` into a PYTHONPATH folder) and the file is a package's,
    else None. A source checkout on the path (the working directory, an editable install's root) holds none, so its
    files keep their last two parts in every process, whatever each has on its path."""
    best = None
    for root in sys.path:
        if not root or not os.path.isabs(root):
            continue
        root = root.rstrip("/\\") + os.sep
        if path.startswith(root) and (best is None or len(root) > len(best)):
            best = root
    rest = path[len(best):] if best else ""
    if not re.search(r"[/\\]", rest) or not _installs_packages(best):
        return None
    return rest.replace("\\", "/")


@functools.lru_cache(maxsize=64)
def _installs_packages(root: str) -> bool:
    try:
        return any(name.endswith(".dist-info") for name in os.listdir(root))
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class SourceLine:
    """A line of the model's code: its file (as Python named it when it ran), line number and function."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.function}"

    @classmethod
    def parse(cls, text: str) -> SourceLine | None:
        """The source line a record names, None for text of another form. A function name has no space, a path
        may have some, so the text is split at its last space and the location at its last colon."""
        location, _, function = text.rpartition(" ")
        file, _, line = location.rpartition(":")
        if not file or not line.isdigit() or not function:
            return None
        return cls(file, int(line), function)

    @property
    def short(self) -> str:
        return f"{short_path(self.file)}:{self.line} {self.function}"


def short_sources(sources: tuple[str, ...] | list[str], limit: int = 3) -> str:
    """The first `limit` source lines, short, and how many more there are: what a summary line shows.

    Example:
        >>> short_sources(["/a/b/m.py:3 f", "/a/b/m.py:4 f", "/a/b/m.py:9 g", "/a/b/m.py:12 g"])
        'b/m.py:3 f, b/m.py:4 f, b/m.py:9 g, +1 more'
    """
    parsed = [(text, SourceLine.parse(text)) for text in sources[:limit]]
    shown = [line.short if line is not None else text for text, line in parsed]
    rest = len(sources) - limit
    return ", ".join(shown + ([f"+{rest} more"] if rest > 0 else []))


#: How a backward piece's `reads_saved_from` is introduced wherever it is shown: lines of the forward, not its own.
READS_SAVED = "reads values saved at"


def origin_lines(sources: tuple[str, ...], reads_saved_from: tuple[str, ...] = ()) -> list[str]:
    """What a summary says under a piece of where it is in the model: "from" its own lines, and the lines of the
    forward that made the saved values it reads, each short (`short_sources`); nothing for what it has none of.

    Example:
        >>> origin_lines((), ("/a/b/m.py:66 forward",))
        ['reads values saved at b/m.py:66 forward']
    """
    return ([f"from {short_sources(sources)}"] if sources else []) + (
        [f"{READS_SAVED} {short_sources(reads_saved_from)}"] if reads_saved_from else [])


@dataclasses.dataclass(frozen=True)
class SourceExcerpt(JsonRecord):
    """The code around one source line, read from its file at flush: `lines` are the file's lines from number
    `first_line` on (the source line among them, with a few lines of context either side)."""

    first_line: int
    lines: tuple[str, ...] = ()
