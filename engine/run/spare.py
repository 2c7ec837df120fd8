"""A process started ahead of the next attempt: the supervisor's side of engine.train.spare
(the built-in trainer's) and engine.handover (a Python command's).

While an attempt trains, the supervisor starts the next attempt's process, torch imported (and
the trainer, or the command's interpreter with its options), blocked on a line from a pipe;
should the attempt crash, the next one runs in it and saves the interpreter's and torch's start
(engine.run.launchers.trainer and .command say when one can serve and how it is started).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

from engine.run.process import spawn

if TYPE_CHECKING:
    from engine.run.launch import Launch
    from engine.runconfig import RunConfig

SPARE_MODULE = "engine.train.spare"


class Spare:
    """A process started ahead of the next attempt (engine.train.spare): torch and the trainer
    imported, blocked on a line from its stdin, a pipe from this process. `take` hands it the
    attempt's argv, env and log; closing the pipe (this process's death included) ends it, so it
    never outlives whoever started it. In a session of its own, like an attempt, so that it is
    one once handed.

    `env` is the environment the next attempt would have (its launch's), with the entries that
    change from one attempt to the next (`varying`: when it started) left to the hand-over; a
    launch whose other entries differ is not run in it (the interpreter and torch read the
    environment as they start: thread counts, allocators, paths)."""

    def __init__(self, env: dict[str, str], log, *, cwd: str | None = None,
                 warm: tuple[str, ...] = (), varying: tuple[str, ...] = (),
                 argv: list[str] | None = None, runs: list[str] | None = None,
                 target: list[str] | None = None, restore_sigint: bool = False):
        """`argv`: how it starts (the trainer's spare, `warm` its modules, by default); `runs`:
        what starts the launches it can run, the rest of their argv handed over (`python -P -m
        engine.train.trainer` by default; a command's interpreter and its options), `target`
        what must follow it (a command's script, or -m and its module)."""
        self.env = {k: v for k, v in env.items() if k not in varying}
        self.cwd = cwd
        self.varying = varying
        self.runs = runs if runs is not None else [sys.executable, "-P", "-m", "engine.train.trainer"]
        self.target = target or []
        # Its own output until it is handed an attempt: `log` (an open file; the supervisor's).
        self.popen: subprocess.Popen | None = spawn(
            argv or [sys.executable, "-P", "-m", SPARE_MODULE, *warm], stdin=subprocess.PIPE,
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, restore_sigint=restore_sigint)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def fits(self, launch: Launch) -> bool:
        """Whether `launch` is what this spare can run: started as `runs` and more (the
        built-in trainer in one process; the command's script or module by its interpreter with
        the same options), in the same directory, with the same environment but for the
        entries that vary."""
        start = self.runs + self.target   # exactly: another option there is another interpreter
        return (launch.argv[:len(start)] == start and len(launch.argv) > len(self.runs) and launch.cwd == self.cwd
                and {k: v for k, v in launch.env.items() if k not in self.varying} == self.env)

    def take(self, launch: Launch, log_path: str | os.PathLike) -> subprocess.Popen | None:
        """Its process, running `launch` (see `fits`), or None: it is discarded (it died, or does
        not fit) and the caller starts the attempt as usual. Either way this spare is used up."""
        popen, self.popen = self.popen, None
        if popen is None:
            return None
        if not self.fits(launch) or popen.poll() is not None:
            _end(popen)
            return None
        message = {"argv": launch.argv[len(self.runs):], "env": launch.env, "log": os.fspath(log_path)}
        try:
            assert popen.stdin is not None  # stdin=PIPE
            popen.stdin.write((json.dumps(message) + "\n").encode())
            popen.stdin.close()   # what it reads is in the pipe; it runs on its own now
        except (OSError, ValueError):  # it died before reading (BrokenPipeError)
            _end(popen)
            return None
        return popen

    def discard(self) -> None:
        """End it, unused (the run is over, or the next attempt will not fit it)."""
        popen, self.popen = self.popen, None
        if popen is not None:
            _end(popen)


def early(config: RunConfig) -> Spare | None:
    """The first attempt's process, started before the run is: `cockpit --no-ui` starts it as it
    begins checking the device (which imports torch too), so that the trainer's imports, CUDA's
    context and the workload's data are made while the CLI works, not after it. Only where one
    trainer process will run it (not a command, not torchrun's several), and not with
    COCKPIT_SPARE=0. Its output before it is handed the attempt: this process's stderr (it says
    only what it could not do ahead)."""
    from engine.run.launchers.trainer import spare_for

    device = config.device
    if config.workload.is_command or device.world_size > 1 or device.nodes[1] > 1 \
            or os.environ.get("COCKPIT_SPARE", "1") == "0":
        return None
    try:
        return Spare(log=sys.stderr, **spare_for(config, device))
    except OSError:   # no process to spare: the attempt starts as before
        return None


def _end(popen: subprocess.Popen) -> None:
    """A spare not handed an attempt: its pipe closed, killed (an import under way would take a
    while to read the end of its pipe) and reaped."""
    try:
        if popen.stdin is not None:
            popen.stdin.close()
    except OSError:
        pass
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)   # its session's group: nothing it started stays
        except (ProcessLookupError, PermissionError):
            pass
    popen.wait()
