"""The memory panel: pressure level in colour, swap traffic, RSS (macOS: the physical
footprint), device memory vs its limit.

Fed by the supervisor's `memory` events (about once a second) and the device memory the
trainer reports with each step; the latest slowdown warning is shown under them.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from cockpit.present.words import rss_label
from cockpit.ui.model import RunModel
from engine.numbers import per_s, size as bytes_text

LEVEL_STYLE: dict[str | None, str] = {"normal": "bold green", "warn": "bold yellow", "critical": "bold white on red"}


def _pressure_figure(pressure: dict) -> str:
    """Linux PSI in words: the share of the last 10 s some task waited on memory ('psi 0/0%'
    read as noise); macOS's raw level is already the level's word."""
    raw = pressure.get("raw")
    if isinstance(raw, dict):
        some = raw.get("some_avg10")
        if some is None:
            return ""
        return "no stalls" if some < 0.5 else f"{some:.0f}% stalled"
    return ""


def device_line(memory: dict) -> str:
    """'1.2 GB of 80.0 GB' on CUDA (allocated vs total), MPS (driver vs recommended max)."""
    if not memory:
        return "not reported yet"
    if "total" in memory:
        used = memory.get("allocated", 0)
        return f"{bytes_text(used)} of {bytes_text(memory['total'])} ({100 * used / max(1, memory['total']):.0f}%)"
    used = memory.get("driver", memory.get("allocated"))
    if memory.get("limit") and used is not None:
        return f"{bytes_text(used)} of {bytes_text(memory['limit'])} ({100 * used / memory['limit']:.0f}%)"
    return f"{bytes_text(used)} (no limit reported)"


def memory_text(m: RunModel, width: int = 28) -> Text:
    text = Text()
    e = m.memory_sample
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
        swap_in, swap_out = per_s(e.get("swap_in_per_s")), per_s(e.get("swap_out_per_s"))
        one_line = f"swap     {swap_in} in, {swap_out} out"
        if len(one_line) <= width:  # at 80x24 the panel has six lines: swap at rest takes one
            text.append(f"\n{one_line}")
        else:
            text.append(f"\nswap in  {swap_in}\nswap out {swap_out}")
        # macOS: the physical footprint (Activity Monitor's figure; some processes by RSS where
        # theirs was unreadable: the event's rss_kind says "footprint+rss")
        label = "RSS" if rss_label(e) == "rss" else "footprint"
        text.append(f"\n{label:<8} {bytes_text(e.get('rss'))}")
        if e.get("processes", 1) > 1:
            text.append(f" ({e['processes']} procs)")
        text.append(f"\nsystem   {bytes_text(e.get('system_used'))} / {bytes_text(e.get('system_total'))}")
    if m.device_memory or not _on_cpu(m):
        # a CPU run has no device memory of its own: RSS above is all of it
        text.append(f"\ndevice   {device_line(m.device_memory)}")
    if m.warnings:
        w = m.warnings[-1]
        text.append(f"\n⚠ {w.get('message', w.get('kind', 'warning'))}", style="bold yellow")
    return text


def _on_cpu(m: RunModel) -> bool:
    device = m.attempts[-1].device if m.attempts else None
    return device is None or device.startswith("cpu")


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
        self.update(memory_text(m, self.content_region.width or 28), layout=False)  # a fixed-size panel: no re-layout
