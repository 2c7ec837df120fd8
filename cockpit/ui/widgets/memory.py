"""The memory panel: pressure level in colour, swap traffic, RSS, device memory vs its limit.

Fed by the supervisor's `memory` events (about once a second) and the device memory the
trainer reports with each step; the latest slowdown warning is shown under them.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from cockpit.ui.model import RunModel, bytes_text

LEVEL_STYLE = {"normal": "bold green", "warn": "bold yellow", "critical": "bold white on red"}


def _rate(value) -> str:
    return "-" if value is None else bytes_text(value) + "/s"


def _pressure_figure(pressure: dict) -> str:
    raw = pressure.get("raw")
    if isinstance(raw, dict):  # PSI: the share of time stalled on memory
        some, full = raw.get("some_avg10"), raw.get("full_avg10")
        return f"psi {some:.0f}/{full:.0f}%" if some is not None and full is not None else ""
    return f"raw {raw}" if raw is not None else ""


def device_line(memory: dict) -> str:
    """'1.2 GB of 80.0 GB' on CUDA (allocated vs total), MPS (driver vs recommended max)."""
    if not memory:
        return "- (CPU: RSS)"
    if "total" in memory:
        used = memory.get("allocated", 0)
        return f"{bytes_text(used)} of {bytes_text(memory['total'])} ({100 * used / max(1, memory['total']):.0f}%)"
    used = memory.get("driver", memory.get("allocated"))
    if memory.get("limit"):
        return f"{bytes_text(used)} of {bytes_text(memory['limit'])} ({100 * used / memory['limit']:.0f}%)"
    return f"{bytes_text(used)} (no limit reported)"


def memory_text(m: RunModel) -> Text:
    text = Text()
    e = m.memory
    if e is None:
        text.append("no memory sample yet", style="dim")
    else:
        pressure = e.get("pressure") or {}
        level = pressure.get("level")
        text.append("pressure ")
        text.append(level or "unavailable", style=LEVEL_STYLE.get(level, "dim"))
        figure = _pressure_figure(pressure)
        if figure:
            text.append(f"  {figure}", style="dim")
        text.append(f"\nswap in  {_rate(e.get('swap_in_per_s'))}")
        text.append(f"\nswap out {_rate(e.get('swap_out_per_s'))}")
        text.append(f"\nRSS      {bytes_text(e.get('rss'))}")
        if e.get("processes", 1) > 1:
            text.append(f" ({e['processes']} procs)")
        text.append(f"\nsystem   {bytes_text(e.get('system_used'))} / {bytes_text(e.get('system_total'))}")
    text.append(f"\ndevice   {device_line(m.device_memory)}")
    if m.warnings:
        w = m.warnings[-1]
        text.append(f"\n⚠ {w.get('message', w.get('kind', 'warning'))}", style="bold yellow")
    return text


class MemoryPanel(Static):
    DEFAULT_CSS = """
    MemoryPanel {
        border: round $primary 50%;
        border-title-color: $text;
        width: 30;
        height: 100%;
        overflow-y: auto;
    }
    """

    def on_mount(self) -> None:
        self.border_title = "memory"

    def show(self, m: RunModel) -> None:
        self.update(memory_text(m), layout=False)  # a fixed-size panel: no re-layout
