"""The code around the model's lines that a graph's pieces name, read from its files at flush (so that the HTML page
shows it where the model's code is not: another machine, a laptop)."""

from __future__ import annotations

import linecache
from collections.abc import Iterable

from thunderfx_debug.records import SourceExcerpt, SourceLine

#: Lines shown before and after a source line: enough for the statement around it and the lines feeding it.
CONTEXT_LINES = 4


def excerpts(sources: Iterable[str], context: int = CONTEXT_LINES) -> dict[str, SourceExcerpt]:
    """By source line ("file:line function"), the file's lines around it; a source whose file cannot be read (gone,
    generated code, a line past its end) has none.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "model.py")
        >>> with open(path, "w") as f:
        ...     _ = f.write("a = 1\\nb = 2\\nc = a + b\\nd = c * 2\\n")
        >>> found = excerpts([f"{path}:3 <module>", f"{path}:40 <module>"], context=1)
        >>> [(e.first_line, e.lines) for e in found.values()]
        [(2, ('b = 2', 'c = a + b', 'd = c * 2'))]
    """
    found = {}
    checked: set[str] = set()
    for text in dict.fromkeys(sources):
        line = SourceLine.parse(text)
        if line is None:
            continue
        if line.file not in checked:  # a file edited since it was last read is read again, once per flush
            linecache.checkcache(line.file)
            checked.add(line.file)
        lines = linecache.getlines(line.file)
        if not 1 <= line.line <= len(lines):
            continue
        first = max(1, line.line - context)
        found[text] = SourceExcerpt(first, tuple(s.rstrip("\n") for s in lines[first - 1:line.line + context]))
    return found
