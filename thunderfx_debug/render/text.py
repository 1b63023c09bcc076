"""Formatting shared by the renderers."""

from __future__ import annotations


def ms(value: float | None, unit: bool = False) -> str:
    """A time in milliseconds with three decimals ("-" for none), with " ms" when `unit`.

    Example:
        >>> ms(1.23456), ms(None), ms(2.0, unit=True)
        ('1.235', '-', '2.000 ms')
    """
    if value is None:
        return "-"
    return f"{value:.3f} ms" if unit else f"{value:.3f}"


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """`count` and the noun it counts, in the right number ("s" added unless `plural_form` says otherwise).

    Example:
        >>> plural(1, "Dynamo graph"), plural(2, "Dynamo graph"), plural(0, "split"), plural(3, "x", "xes")
        ('1 Dynamo graph', '2 Dynamo graphs', '0 splits', '3 xes')
    """
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"


def flagged(figure: str, flag: str | None) -> str:
    """A figure with its caveat right after it, where it has one ("too few samples (1)", see `headline`).

    Example:
        >>> flagged("48.198 ms", "too few samples (1)"), flagged("48.198 ms", None)
        ('48.198 ms [too few samples (1)]', '48.198 ms')
    """
    return f"{figure} [{flag}]" if flag else figure


def shortened(text: str, limit: int) -> str:
    """The first line of `text`, cut at the last space before `limit` characters and marked where it is cut (whole
    in the records); never inside a word.

    Example:
        >>> shortened("tensor 'x' size mismatch at index 0. expected 4, actual 8", 30)
        "tensor 'x' size mismatch at ... (cut)"
        >>> shortened("short\\nsecond line", 30)
        'short'
    """
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    if len(line) <= limit:
        return line
    cut = line[:limit + 1].rsplit(" ", 1)[0] if " " in line[:limit + 1] else line[:limit]
    return cut.rstrip() + " ... (cut)"


def about_seconds(seconds: float) -> str:
    """An estimate of seconds in words: "about 12 s", or "under a second" where it rounds to none.

    Example:
        >>> about_seconds(11.6), about_seconds(0.3)
        ('about 12 s', 'under a second')
    """
    return f"about {seconds:.0f} s" if seconds >= 0.5 else "under a second"
