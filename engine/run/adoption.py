"""What a process cockpit did not start is, read when it is adopted, and the run directory made
of it: `cockpit adopt PID [--log FILE]` (engine.run.launchers.adopted follows it).

`inspect(pid, log)` reads the process (its argv, working directory, environment and where its
output goes: engine.monitor.procinfo) and checks it, with one clear error naming the argument for
a PID or a --log that will not do; `create` makes its run directory, a command run's (run.toml,
with its environment as the device preset's `env`, which is why the directory is private) beside
adopted.json, what was adopted; `record_of` reads that back (engine.run.resume, the front ends).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from engine import command as commands, presets
from engine.command import programs
from engine.errors import ConfigError
from engine.monitor import procinfo
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir
from engine.run.resume import literal
from engine.runconfig import RunConfig, apply_overrides

PRESET = "adopted"                 # the device preset's name: in run.toml and in the run's id
RECORD = "adopted.json"            # what was adopted, beside run.toml
# Not carried into a relaunch: cockpit's own (a launch sets those it means) and the terminal's
# size (a log file is no terminal: a bar drawn 80 wide would wrap its loss away).
_NOT_CARRIED = ("_", "COLUMNS", "LINES")
# The device preset's settings that say how it is followed (its hang watch), not how it runs.
FOLLOWING = ("hang_timeout_s",)


@dataclass(frozen=True)
class Adoption:
    """What was read of the process when it was adopted."""

    pid: int
    start: float                        # its create time: a later process with its pid is not it
    argv: list[str]
    cwd: str
    env: dict[str, str]
    logs: list[str] = field(default_factory=list)   # the files its output is read from
    log_source: str = ""                # "--log", or each file and what writes it: "x.log (stdout and stderr)"
    no_log: str = ""                    # why there is none (then no progress is read)
    undecodable: list[str] = field(default_factory=list)

    def record(self) -> dict:
        """For adopted.json and the run_started event (its environment is in run.toml)."""
        return {"pid": self.pid, "start": self.start, "argv": self.argv, "cwd": self.cwd,
                "logs": self.logs, "log_source": self.log_source, "no_log": self.no_log,
                "undecodable": self.undecodable, "env_vars": len(self.env)}


# ---------------------------------------------------------------- adopting


def _ancestors() -> set[int]:
    found, proc = set(), psutil.Process()
    try:
        while proc is not None:
            found.add(proc.pid)
            proc = proc.parent()
    except psutil.Error:
        pass
    return found


def _which_ancestor(pid: int) -> str:
    """What a process cockpit runs under is, in words: cockpit, its shell, or one further up
    (PID 1, the system's first process, is above every process; calling it a shell misleads)."""
    if pid == os.getpid():
        return "is cockpit itself"
    try:
        name = psutil.Process(pid).name()
    except psutil.Error:
        name = "?"
    if pid == os.getppid():
        return f"is the process that started cockpit ({name}: its shell, or the program that ran it)"
    if pid == 1:
        return f"is the system's first process ({name}), which every process runs under"
    return f"is a process cockpit runs under ({name}, a parent of its shell)"


def inspect(pid: int, log: str | None = None, *, platform: str = sys.platform) -> Adoption:
    """The process `pid` as it runs now, checked: one clear ConfigError naming the argument for
    a PID that does not exist, is cockpit itself or a process it runs under (its shell, PID 1)
    or cannot be read, and
    for a --log that is not a readable file."""
    where = "PID"
    if pid <= 0:
        raise ConfigError(where, str(pid), "expected the pid of a running process (a number above 0)")
    if pid in _ancestors():
        raise ConfigError(where, str(pid), f"{_which_ancestor(pid)}: following it would wait on "
                                           "itself; expected the pid of a training process (ps, "
                                           "pgrep -f train)")
    identity = ProcessId.of(pid)
    if identity is None or not identity.alive():
        raise ConfigError(where, str(pid), "no such process (it is not running, or has exited); "
                                           "expected the pid of a running process (ps, pgrep -f train)")
    try:
        info = procinfo.read(pid, platform)
    except PermissionError as e:
        raise ConfigError(where, str(pid), f"cannot be read ({e.strerror or e}): it belongs to another "
                                           "user; expected a process of yours") from None
    except (FileNotFoundError, ProcessLookupError):
        raise ConfigError(where, str(pid), "exited while it was being read; expected a running "
                                           "process") from None
    except OSError as e:
        raise ConfigError(where, str(pid), f"cannot be read: {e.strerror or e}") from None
    if not info.argv:
        raise ConfigError(where, str(pid), "has no command line (a kernel thread, or a zombie); "
                                           "expected a training process")
    logs, source, no_log = _logs(pid, log, platform)
    return Adoption(pid=pid, start=identity.start, argv=info.argv, cwd=info.cwd,
                    env={k: v for k, v in info.env.items()
                         if k not in _NOT_CARRIED and not k.startswith("COCKPIT_")},
                    logs=logs, log_source=source, no_log=no_log, undecodable=info.undecodable)


def _logs(pid: int, log: str | None, platform: str) -> tuple[list[str], str, str]:
    """(the files to read its output from, where they came from, why there are none)."""
    if log is not None:
        path = os.path.abspath(os.path.expanduser(log))
        expected = "expected the file the process writes its output to"
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ConfigError("--log", log, f"is not a regular file; {expected}")
            with open(path, "rb"):
                pass
        except OSError as e:
            raise ConfigError("--log", log, f"cannot be read ({e.strerror}); {expected}") from None
        return [path], "--log", ""
    if platform == "darwin":
        return [], "", ("on macOS cockpit cannot see where its output goes, so no progress is read: "
                        "give the file it writes to with --log FILE")
    found = procinfo.output_files(pid)
    if not found:
        return [], "", ("its stdout and stderr are not files (a terminal, a pipe or /dev/null), so "
                        "no progress is read: give the file it logs to with --log FILE")
    return list(found), ", ".join(f"{path} ({' and '.join(names)})" for path, names in found.items()), ""


def config_for(adoption: Adoption, name: str, overrides: list[str] | None = None) -> RunConfig:
    """The run's configuration: a command run of the process's argv (placeholder braces made
    literal) in its working directory, on a device preset `adopted` whose env is its
    environment. Not checked against this machine (configure's checks): the process runs already;
    a resume checks that its program and directory are still there."""
    # a known program's conventions (mlx-lm's adapters and resume) make a resume without
    # --resume-args continue from its newest checkpoint
    workload = presets.workload_from_table({"command": literal(adoption.argv), "cwd": adoption.cwd,
                                            **programs.conventions(adoption.argv)}, "adopt")
    device = presets.device_from_table({"description": f"the environment of pid {adoption.pid}, "
                                                       "as cockpit adopt read it",
                                        "env": adoption.env}, "adopt")
    if overrides:
        for item in overrides:
            key = item.partition("=")[0].strip()
            if not key.startswith("command.") and key not in FOLLOWING:
                raise ConfigError("--set", item, "an adopted run takes command.* settings (total_steps, "
                                                 "progress_regex, samples_per_step, stop_grace_s...) "
                                                 f"and {', '.join(FOLLOWING)} only; expected "
                                                 "command.KEY=VALUE")
        workload, device = apply_overrides(workload, device, overrides)
    return RunConfig(workload_preset=name, device_preset=PRESET, workload=workload, device=device,
                     ladder={}, overrides=tuple(overrides or ()))


def create(adoption: Adoption, name: str | None = None, overrides: list[str] | None = None,
           root: Path | None = None) -> RunDir:
    """The run directory, private (run.toml holds the process's environment), with adopted.json."""
    name = name or commands.name_for(adoption.argv)
    if not presets.NAME_PATTERN.match(name):
        raise ConfigError("--name", None, f"got {name!r}; expected letters, digits, '.', '_', '-'")
    config = config_for(adoption, name, overrides)
    run = RunDir.create(config, root)
    os.chmod(run.path, 0o700)
    os.chmod(run.config_path, 0o600)
    (run.path / RECORD).write_text(json.dumps(adoption.record(), indent=1) + "\n")
    return run


def record_of(run: RunDir) -> dict | None:
    """adopted.json, or None for a run that was not adopted (or whose record is unreadable)."""
    return run.read_record(RECORD)
