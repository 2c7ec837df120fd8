"""How figures are written for people, the same in every sentence and table."""

from __future__ import annotations


def rate(value: float | None) -> str:
    """Three significant figures below 100 (a slow run is 0.424 samples/s, not 0), whole above;
    '-' where there is none."""
    if value is None:
        return "-"
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


def metric(value) -> str:
    """A metric's value (a loss, a recall, a reward), the same in every line, table and panel:
    four significant figures ('0.917', '0.09574', an epoch 1.0 '1'), whole past 1,000 ('12,346');
    '-' where there is none."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def size(n: float | None) -> str:
    """Bytes: '512 B', '1.2 GB'; '-' where not known."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"


def per_s(n: float | None) -> str:
    """Bytes a second: '5.0 MB/s'; '-' where not known."""
    return "-" if n is None else f"{size(n)}/s"
