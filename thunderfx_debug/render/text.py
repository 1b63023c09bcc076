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
