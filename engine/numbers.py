"""How figures are written for people, the same in every sentence and table."""

from __future__ import annotations


def rate(value: float) -> str:
    """Three significant figures below 100 (a slow run is 0.424 samples/s, not 0), whole above."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def count(n: int, noun: str) -> str:
    """'1 step', '3 steps', '0 steps': a whole number of a regular noun."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def duration(seconds: float | None) -> str:
    """'1h05m', '3m10s', '42s'; '?' where it is not known."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"
