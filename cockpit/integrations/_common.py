"""What both framework callbacks share: when to report, what a number is, how many samples,
and the rule that a callback never stops training because of cockpit."""

from __future__ import annotations

import functools
import math
import numbers
import sys
import time

from cockpit import report

# A step is reported at the framework's own logging steps (with the loss) and otherwise at
# most this often (without it: reading a loss off the GPU waits for it), so the run's events
# stay small and the callback costs nothing measurable.
REPORT_EVERY_S = 0.5

# report.step's own parameters: a metric of the same name is reported as "metric_<name>".
_RESERVED = frozenset({"step", "total", "loss", "samples"})


def needs_framework(module: str, framework: str, install: str,
                    errors: dict[str, ImportError]) -> ImportError:
    """The one line a user reads when the framework cannot be imported; `errors`: what
    importing it raised, by the module tried. Not installed says what to install, in the
    Python that runs the script (under cockpit the command's, which need not be cockpit's);
    installed but failing to import (a package it needs missing, a version it refuses) says
    why instead of telling the user to install what is there."""
    broken = [e for name, e in errors.items() if not _absent(name, e)]
    if broken:
        cause = broken[0]
        error = ImportError(f"{module} needs {framework}, which is installed in this Python "
                            f"({sys.executable}) but fails to import: "
                            f"{type(cause).__name__}: {cause}")
        error.__cause__ = cause  # its traceback shows where, above the line
    else:
        error = ImportError(f"{module} needs {framework}, which is not installed in this "
                            f"Python ({sys.executable}): pip install {install}")
    error.__suppress_context__ = True
    return error


def _absent(module: str, error: ImportError) -> bool:
    """Whether importing `module` failed because its package is not there, rather than
    because of something the package itself imports."""
    return isinstance(error, ModuleNotFoundError) and \
        (error.name or "").split(".")[0] == module.split(".")[0]


def guarded(hook):
    """A hook that cannot stop training: whatever goes wrong in it is said once on stderr and
    the callback goes quiet. The faults cockpit injects on purpose (raised from report.step)
    pass, as does a KeyboardInterrupt."""
    @functools.wraps(hook)
    def run(self, *args, **kwargs):
        if self._broken:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the user's training matters more
            if getattr(e, "cockpit_injected", False):
                raise  # a fault cockpit.report raised on purpose, to rehearse it
            self._broken = True
            print(f"cockpit: {type(self).__module__}.CockpitCallback stopped reporting: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return None
    return run


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


def samples_seen(step: int, per_step: int) -> int:
    """Samples seen at optimizer step `step`, `per_step` a step from here on: counted on from
    the checkpoint this attempt resumed from when cockpit knows its count (a fallback may have
    changed the batch), else step x per_step."""
    base = report.resumed_from()
    if base is not None and step >= base[0]:
        return base[1] + (step - base[0]) * per_step
    return step * per_step


def scalars(values: dict, drop=lambda name: False) -> dict[str, float]:
    """The real numbers among `values` (0-d tensors read with .item()), by name; strings,
    bools, lists and the names `drop` says are left out; a name report.step takes itself is
    prefixed with 'metric_'."""
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
            name = str(name)
            out[f"metric_{name}" if name in _RESERVED else name] = float(value)
    return out


class Owners:
    """One callback per trainer: a second one passed to the same trainer stays quiet instead
    of doubling every event."""

    def __init__(self):
        self._by_trainer: dict[int, object] = {}

    def claim(self, trainer, callback) -> bool:
        owner = self._by_trainer.setdefault(id(trainer), callback)
        return owner is callback

    def release(self, trainer, callback) -> None:
        if self._by_trainer.get(id(trainer)) is callback:
            del self._by_trainer[id(trainer)]
