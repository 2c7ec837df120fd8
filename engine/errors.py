"""Errors the user can fix: bad presets, bad overrides, bad arguments.

Every front end turns a ConfigError into one line on stderr and exit code 2, so its
message must stand on its own: where (file or argument), which key, what was found,
what was expected.
"""

from __future__ import annotations

from typing import Any


class ConfigError(Exception):
    """A user-fixable problem with a preset, an override or an argument."""

    def __init__(self, where: str, key: str | None, problem: str):
        self.where = where
        self.key = key
        self.problem = problem
        super().__init__(self.line())

    def line(self) -> str:
        where = self.where
        if self.key:
            where = f"{where}: {self.key}"
        return f"{where}: {self.problem}"


def describe(value: object) -> str:
    """How a bad value is quoted in a message: TOML-ish, short."""
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class ProtocolError(Exception):
    """A workload's code broke the workload protocol (engine/workloads/custom.py): loss() gave
    something other than a scalar tensor, configure_optimizers() something other than an
    optimizer. A bug in the workload, so the run stops (user-code); the message names the
    workload and the method, and `where` is the method's own file and line, not the trainer's."""

    def __init__(self, workload: str, method: str, problem: str, code: object = None):
        self.workload, self.method, self.problem = workload, method, problem
        self.where = _location(code)
        super().__init__(f"workload {workload!r}: {problem}")


def _location(code: object) -> str | None:
    """'file:line' where a function or method is defined, or None."""
    import inspect

    try:
        method: Any = getattr(code, "__func__", code)   # anything: a TypeError is caught below
        function = inspect.unwrap(method)
        return f"{inspect.getsourcefile(function)}:{function.__code__.co_firstlineno}"
    except (TypeError, AttributeError, OSError):
        return None
