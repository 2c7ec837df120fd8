"""What both framework callbacks share: when to report, and what a number is."""

from __future__ import annotations

import math
import numbers
import time

# A step is reported at the framework's own logging steps (with the loss) and otherwise at
# most this often (without it: reading a loss off the GPU waits for it), so the run's events
# stay small and the callback costs nothing measurable.
REPORT_EVERY_S = 0.5


def needs_framework(module: str, framework: str, install: str) -> ImportError:
    """The one line a user reads when the framework is missing."""
    return ImportError(f"{module} needs {framework}, which is not installed here: "
                       f"pip install {install}")


class Throttle:
    """Whether a step without a loss is worth reporting: the first, the last, and then one
    every REPORT_EVERY_S."""

    def __init__(self):
        self._last = -math.inf

    def due(self, final: bool = False) -> bool:
        now = time.monotonic()
        if final or now - self._last >= REPORT_EVERY_S:
            self._last = now
            return True
        return False

    def reported(self) -> None:
        self._last = time.monotonic()


def scalars(values: dict, drop=lambda name: False) -> dict[str, float]:
    """The finite-or-not real numbers among `values` (0-d tensors read with .item()), by name;
    strings, bools, lists and the names `drop` says are left out."""
    out = {}
    for name, value in values.items():
        if drop(name):
            continue
        if not isinstance(value, numbers.Real) and hasattr(value, "item"):
            try:
                value = value.item()
            except (ValueError, RuntimeError, TypeError):
                continue
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[str(name)] = float(value)
    return out
