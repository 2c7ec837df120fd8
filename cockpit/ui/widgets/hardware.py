"""The hardware panel: what the machine does for the run -- its CPU, a neighbour taking that
CPU, each GPU (NVML), or on a Mac what Metal and the memory pressure say.

Fed from RunModel: the supervisor's latest `memory` event (engine.monitor.hardware's fields)
and the device memory the trainer reports with each step. Fits what it is given: the
panel's height when the screen fixes one, else at most four lines below WIDE columns; every
GPU is folded into one line when a line each would not fit; bars and GPU names from WIDE
columns on.
"""

from __future__ import annotations

from rich.text import Text
from textual.events import Resize
from textual.widgets import Static

from cockpit.ui.model import RunModel
from engine.event_types import MemoryFields
from engine.numbers import count, size as bytes_text

WIDE = 100            # content columns from which GPUs are named and bars are labelled
MID = 48              # content columns from which figures get a short bar
COMPACT_LINES = 4
HOT_C = 85            # around where datacentre and desktop GPUs start to throttle their clocks
LEVEL_STYLE = {"normal": "green", "warn": "bold yellow", "critical": "bold white on red"}


def _bar(fraction: float | None, width: int) -> Text:
    """'█████░░░░░' for fraction of width cells; busy (>= 90%) in yellow."""
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return Text.assemble(("█" * filled, "yellow" if fraction >= 0.9 else "cyan"),
                         ("░" * (width - filled), "dim"))


def _fit(parts: list[Text], width: int, sep: str = "  ") -> Text:
    """The parts in order, as many as fit in width; the first is cut if even it does not."""
    line = Text()
    for part in parts:
        extra = len(sep) if line.plain else 0
        if len(line.plain) + extra + len(part.plain) > width:
            if not line.plain:
                part = part.copy()
                part.truncate(width, overflow="ellipsis")
                line.append_text(part)
            continue
        if extra:
            line.append(sep)
        line.append_text(part)
    return line


# ---------------------------------------------------------------- CPU


def _cpu_parts(memory: MemoryFields, width: int) -> list[Text]:
    cores = memory.get("cpu_count")
    percent = memory.get("cpu_percent")
    head = Text("CPU ", style="bold")
    head.append("-" if percent is None else f"{percent:.0f}%")
    if cores:
        head.append(f" of {count(cores, 'core')}", style="dim")
    parts = [head]
    if width >= MID and cores:
        parts.append(_bar(None if percent is None else percent / (100 * cores), 20 if width >= WIDE else 10))
    machine = memory.get("cpu_system_percent")
    if machine is not None:
        parts.append(Text(f"machine {machine:.0f}% busy",
                          style="bold yellow" if machine >= 90 and memory.get("cpu_others") else "dim"))
    return parts


def _others_line(memory: MemoryFields, width: int, wide: bool) -> Text | None:
    others = memory.get("cpu_others") or []
    if not others:
        return None
    parts = [Text("others", style="bold yellow")]
    for o in others:
        pid = f" (pid {o['pid']})" if wide else ""
        parts.append(Text(f"{o['name']}{pid} {o['cpu_percent']:.0f}%", style="yellow"))
    total = memory.get("cpu_others_percent") or 0.0
    if total > sum(o["cpu_percent"] for o in others) + 1:  # more are busy than are listed
        parts.insert(1, Text(f"{total:,.0f}% in all:", style="bold yellow"))
    return _fit(parts, width)


# ---------------------------------------------------------------- GPUs


def _temp(g: dict) -> Text:
    t = g.get("temp_c")
    return Text("-°C" if t is None else f"{t}°C", style="bold red" if t is not None and t >= HOT_C else "")


def _gpu_line(g: dict, width: int, wide: bool) -> Text:
    """'GPU0 NVIDIA H100 80GB HBM3  util ████ 97%  mem ██░░ 31.0 GB of 80.0 GB  64°C  287 W'
    from WIDE columns, 'GPU0  █████ 97%  ██░░░ 31.0/80.0 GB  64°C  287 W' from MID, no bars
    below."""
    util, used, total = g.get("util_percent"), g.get("mem_used"), g.get("mem_total")
    cells = 12 if wide else 5 if width >= MID else 0
    head = Text(f"GPU{g['index']}", style="bold")
    if wide and g.get("name"):
        head.append(f" {g['name']}", style="dim")
    parts = [head]
    util_text = Text("-" if util is None else f"{util}%")
    if cells:
        util_text = Text.assemble(_bar(None if util is None else util / 100, cells), " ", util_text)
    parts.append(Text.assemble("util ", util_text) if wide else util_text)
    if used is None or not total:
        mem = Text("mem -")
    elif not wide:  # '31.0/80.0 GB'
        mem = Text(f"{used / 1e9:.1f}/{total / 1e9:.1f} GB")
    else:
        mem = Text(f"{bytes_text(used)} of {bytes_text(total)}")
    if cells and used is not None and total:
        mem = Text.assemble(_bar(used / total, cells), " ", mem)
    parts.append(Text.assemble("mem ", mem) if wide else mem)
    parts.append(_temp(g))
    if g.get("power_w") is not None:
        parts.append(Text(f"{g['power_w']:.0f} W"))
    return _fit(parts, width, sep="  " if cells else " ")  # a side column: room for the temperature


def _gpus_folded(gpus: list[dict], width: int) -> Text:
    """'8 GPUs  util 91-99%  mem 480.1 of 640.0 GB  max 71°C  5.6 kW' in one line."""
    utils = [g["util_percent"] for g in gpus if g.get("util_percent") is not None]
    used = sum(g.get("mem_used") or 0 for g in gpus)
    total = sum(g.get("mem_total") or 0 for g in gpus)
    temps = [g["temp_c"] for g in gpus if g.get("temp_c") is not None]
    power = [g["power_w"] for g in gpus if g.get("power_w") is not None]
    parts = [Text(f"{len(gpus)} GPUs", style="bold")]
    if utils:
        span = f"{min(utils)}-{max(utils)}%" if min(utils) != max(utils) else f"{utils[0]}%"
        parts.append(Text(span if width < 40 else f"util {span}"))
    hot = bool(temps) and max(temps) >= HOT_C
    if hot:  # a throttling GPU outranks the memory figure
        parts.append(Text(f"max {max(temps)}°C", style="bold red"))
    if total:
        parts.append(Text(f"mem {used / 1e9:.0f}/{total / 1e9:.0f} GB" if width < 40
                          else f"mem {bytes_text(used)} of {bytes_text(total)}"))
    if temps and not hot:
        parts.append(Text(f"max {max(temps)}°C"))
    if power:
        watts = sum(power)
        parts.append(Text(f"{watts / 1000:.1f} kW" if watts >= 1000 else f"{watts:.0f} W"))
    return _fit(parts, width)


# ---------------------------------------------------------------- Mac


def _metal_line(device_memory: dict, width: int) -> Text | None:
    """'Metal 3.1 of 16.0 GB recommended (19%)': the driver's allocation against
    torch.mps.recommended_max_memory(), the figure past which macOS starts to swap."""
    used = device_memory.get("driver", device_memory.get("allocated"))
    if used is None:
        return None
    limit = device_memory.get("limit")
    text = Text("Metal ", style="bold")
    if limit:
        text.append(f"{used / 1e9:.1f} of {limit / 1e9:.1f} GB" + (" recommended" if width >= 40 else ""))
        text.append(f" ({100 * used / limit:.0f}%)", style="bold yellow" if used >= 0.9 * limit else "dim")
    else:
        text.append(f"{bytes_text(used)}, no recommended limit reported")
    parts = [text]
    if "allocated" in device_memory and "driver" in device_memory:
        parts.append(Text(f"tensors {bytes_text(device_memory['allocated'])}", style="dim"))
    return _fit(parts, width)


def _pressure_line(memory: MemoryFields | None) -> Text | None:
    level = ((memory.get("pressure") if memory is not None else None) or {}).get("level")
    if level is None:
        return None
    return Text.assemble("memory pressure: ", (level, LEVEL_STYLE.get(level, "")))


def _on_mac(m: RunModel) -> bool:
    device = m.attempts[-1].device if m.attempts else None
    return (device or "").startswith("mps") or "driver" in m.device_memory


def _on_cuda(m: RunModel) -> bool:
    device = m.attempts[-1].device if m.attempts else None
    return (device or "").startswith("cuda")


# ---------------------------------------------------------------- the panel


def _lines(m: RunModel, width: int, wide: bool, fold_gpus: bool) -> list[Text]:
    memory = m.memory_sample
    if memory is None:
        lines = [Text("no hardware sample yet", style="dim")]
    else:
        lines = [_fit(_cpu_parts(memory, width), width)]
        if (others := _others_line(memory, width, wide)) is not None:
            lines.append(others)
    gpus = (memory.get("gpus") if memory is not None else None) or []
    if gpus:
        lines += [_gpus_folded(gpus, width)] if fold_gpus else [_gpu_line(g, width, wide) for g in gpus]
    elif _on_cuda(m):  # on CUDA without NVML's figures: say why (the sampler's reason), dimly
        # "pynvml not installed (pip install ...)"
        why = memory.get("gpus_why_not") if memory is not None else None
        lines.append(_fit([Text(f"no GPU figures: {why}" if why else "no GPU figures", style="dim")],
                          width))
    if _on_mac(m):
        if (metal := _metal_line(m.device_memory, width)) is not None:
            lines.append(metal)
        if (pressure := _pressure_line(memory)) is not None:
            lines.append(pressure)
    return lines


def hardware_text(m: RunModel, width: int, height: int | None = None) -> Text:
    """The panel's text for `width` content columns, in at most `height` lines (the panel's
    own height when the screen fixes it; else COMPACT_LINES below WIDE columns, no limit
    above). GPUs are folded into one line when a line each would not fit."""
    width = max(10, width)
    wide = width >= WIDE
    limit = height or (None if wide else COMPACT_LINES)
    gpus = (m.memory or {}).get("gpus") or []
    lines = _lines(m, width, wide, fold_gpus=False)
    if limit is not None and len(lines) > limit and len(gpus) > 1:
        lines = _lines(m, width, wide, fold_gpus=True)
    return Text("\n").join(lines[:limit])


class HardwarePanel(Static):
    """`show(model)` after each memory event; re-fits itself when resized."""

    DEFAULT_CSS = """
    HardwarePanel {
        border: round $primary 50%;
        border-title-color: $text;
        height: auto;
        max-height: 12;
        padding: 0 1;
    }
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._model: RunModel | None = None
        self._line_count = 0
        self._shown: tuple = ()

    def on_mount(self) -> None:
        self.border_title = "hardware"

    def show(self, model: RunModel) -> None:
        # The dashboard calls this on every frame with a step that carries device memory (up
        # to ten a second); the figures here change with a memory event (once a second), the
        # device memory only matters on a Mac. Objects, compared by identity, not ids: a kept
        # reference cannot be freed and its id reused.
        shown = (model.memory, model.device_memory if _on_mac(model) else None,
                 model.attempts[-1].device if model.attempts else None)
        if self._model is model and len(shown) == len(self._shown) and \
                all(a is b for a, b in zip(shown, self._shown)):
            return
        self._model, self._shown = model, shown
        self._paint(model)

    def on_resize(self, event: Resize) -> None:
        if self._model is not None:
            self._paint(self._model)

    def _paint(self, model: RunModel) -> None:
        width = self.size.width or max(10, self.app.size.width - 4)  # before the first layout
        # A fixed height set by the screen bounds the lines; with height auto the panel grows
        # to what the width allows (COMPACT_LINES below WIDE columns).
        fixed = self.styles.height is not None and not self.styles.height.is_auto
        height = self.size.height if fixed and self.size.height else None
        text = hardware_text(model, width, height)
        lines = text.plain.count("\n") + 1
        # Re-layout only when the line count changes: the figures change every second, the
        # panel's height seldom.
        self.update(text, layout=lines != self._line_count)
        self._line_count = lines
