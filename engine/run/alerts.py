"""Alerts: a run's crash, fallback, finish, failure, slowdown and hang, told to the user where
they are looking.

The supervisor feeds every event it reads to `Alerts.see`; `AlertRules` (engine.run.alert_rules)
turns them into at most one alert per incident, keeping only the events the user's settings.toml
asks for ([alerts] on). Each alert goes to:

- the terminal the run was started from (`Terminal`): the bell and a notification escape that
  iTerm2, kitty, WezTerm, Ghostty, foot and others turn into a system notification -- over SSH
  too, since it travels in the terminal's own stream. A detached run writes to that terminal
  while the session that started it lives (its session leader, by pid and start time), and
  only opens it with O_NOCTTY | O_NONBLOCK, so a stopped terminal cannot stall it;
- this machine's desktop, when it has one: macOS notification centre (osascript), notify-send;
- the user's notify command, run through the shell with the alert as JSON on stdin (ntfy,
  Slack, mail: cockpit itself makes no network call). A command that fails or outlives its
  timeout is killed and reported through `say` (a warning event), never waited on: commands are
  started and polled, nothing here blocks the supervisor's loop.

If the supervisor dies, its lifeline (engine.run.lifeline) sends the alert that says so, from
the description the supervisor gave it. The TUI uses the same rules for its own bell, escape and toast (cockpit.ui), since a
supervisor it starts has no terminal of its own. Torch-free; no threads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping

from engine import settings as user_settings
from engine.errors import ConfigError
from engine.record.identity import ProcessId
from engine.run.alert_rules import Alert, AlertRules
from engine.run.process import AttemptProcess, spawn
from engine.schema import from_table, to_table
from engine.settings import AlertSettings

MAX_TEXT = 200          # characters of a notification's text
MAX_RUNNING = 8         # notify commands at once; past this an alert's command is skipped, said


def _clean(text: str, drop: str = "") -> str:
    """Text safe inside an escape sequence: no control characters, short."""
    text = "".join(" " if ord(c) < 32 or ord(c) == 127 or c in drop else c for c in text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


# ---------------------------------------------------------------- the terminal


@dataclass(frozen=True)
class Terminal:
    """A terminal to alert: its device path and, where known, the session leader (a login
    shell) whose death means the session is gone and the path may be someone else's soon."""

    path: str
    owner: ProcessId | None = None
    mode: str = "auto"

    @classmethod
    def of_this_process(cls, fds: Iterable[int] = (1,)) -> "Terminal | None":
        """The terminal on the first of these descriptors that is one (stdout by default)."""
        for fd in fds:
            try:
                if os.isatty(fd):
                    return cls(os.ttyname(fd), ProcessId.of(os.getsid(0)))
            except OSError:
                continue
        return None

    def arguments(self) -> list[str]:
        """For a detached supervisor's command line (engine.run.detached.main)."""
        return ["--terminal", self.path, *(["--terminal-owner", str(self.owner)] if self.owner else [])]

    def send(self, alert: Alert) -> bool:
        """Write the bell and the escape; False when the session is gone or the terminal does
        not take it now (closed, stopped by ^S, not ours)."""
        if self.owner is not None and not self.owner.alive():
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            os.write(fd, escape(alert, self.mode).encode())
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def escape(alert: Alert, mode: str, env: Mapping[str, str] | None = None) -> str:
    """The bell and the notification escape for a terminal: OSC 9 (iTerm2, WezTerm, Ghostty...),
    OSC 99 (kitty's own) or OSC 777 (foot, urxvt, VTE); 'auto' picks by TERM, which SSH passes on."""
    env = os.environ if env is None else env
    if mode == "off":
        return ""
    if mode == "auto":
        term = env.get("TERM", "")
        mode = "osc99" if term == "xterm-kitty" or env.get("KITTY_WINDOW_ID") else \
            "osc777" if term.startswith("foot") or "rxvt" in term or env.get("VTE_VERSION") else "osc9"
    if mode == "osc9":
        osc = f"\x1b]9;{_clean(alert.text)}\x07"
    elif mode == "osc99":
        osc = f"\x1b]99;;{_clean(alert.text)}\x1b\\"
    elif mode == "osc777":
        osc = f"\x1b]777;notify;{_clean(alert.title, ';')};{_clean(alert.message)}\x07"
    else:
        osc = ""
    if osc and env.get("TMUX"):  # tmux passes it on with allow-passthrough (tmux >= 3.3)
        osc = "\x1bPtmux;" + osc.replace("\x1b", "\x1b\x1b") + "\x1b\\"
    return "\x07" + osc


def desktop_argv(alert: Alert) -> list[str] | None:
    """The command that shows a notification on this machine's desktop, if it has one."""
    title, message = _clean(alert.title), _clean(alert.message)
    if sys.platform == "darwin" and shutil.which("osascript"):
        return ["osascript", "-e", "on run argv", "-e",
                "display notification (item 2 of argv) with title (item 1 of argv)",
                "-e", "end run", title, message]
    if (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and shutil.which("notify-send"):
        return ["notify-send", "--app-name=cockpit", title, message]
    return None


# ---------------------------------------------------------------- commands, never waited on


@dataclass
class _Running:
    proc: subprocess.Popen
    started: float
    label: str | None        # how a failure is reported; None: not reported (the desktop's)
    stderr: IO[bytes]        # a temporary file: what it said, read if it fails


class Commands:
    """Child processes started and polled: each in its own session, killed with its group
    once it has run `timeout_s`; a failure reported through `say` (one line)."""

    def __init__(self, timeout_s: float, say: Callable[[str], object], clock=time.monotonic):
        self.timeout_s = timeout_s
        self.say = say
        self.clock = clock
        self.running: list[_Running] = []

    def start(self, argv: list[str] | str, stdin: bytes, env: dict, label: str | None) -> None:
        if len(self.running) >= MAX_RUNNING:
            if label:
                self.say(f"{label}: skipped, {MAX_RUNNING} earlier ones are still running")
            return
        with tempfile.TemporaryFile() as data:
            data.write(stdin)
            data.seek(0)
            err = tempfile.TemporaryFile()
            try:
                proc = spawn(argv, shell=isinstance(argv, str), stdin=data,
                             stdout=subprocess.DEVNULL, stderr=err, env=env)
            except OSError as e:
                err.close()
                if label:
                    self.say(f"{label} could not be started: {e.strerror}")
                return
        self.running.append(_Running(proc, self.clock(), label, err))

    def poll(self) -> None:
        now = self.clock()
        for job in list(self.running):
            code = job.proc.poll()
            if code is None and now - job.started < self.timeout_s:
                continue
            self.running.remove(job)
            if code is None:
                AttemptProcess(job.proc).kill()   # the shell and whatever it started
                job.proc.wait()
                problem = f"did not finish in {self.timeout_s:g} s; killed"
            elif code != 0:
                problem = f"exited {code}" if code > 0 else f"died of {_signal_name(-code)}"
                said = _last_line(job.stderr)
                problem += f": {said}" if said else ""
            else:
                problem = None
            job.stderr.close()
            if problem and job.label:
                self.say(f"{job.label} {problem}")

    def close(self, poll_s: float = 0.05) -> None:
        """Wait for the running ones, each at most until its timeout (then it is killed)."""
        while self.running:
            self.poll()
            if self.running:
                time.sleep(poll_s)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_line(f) -> str:
    try:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4096))
        lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return _clean(lines[-1]) if lines else ""


# ---------------------------------------------------------------- the supervisor's alerts


class Alerts:
    """Everything a supervisor does about alerts: `see` each batch of events, `close` at the end."""

    def __init__(self, settings: AlertSettings, *, run_id: str, run_dir: Path, workload: str,
                 device_preset: str, terminal: Terminal | None, say: Callable[[str], object]):
        self.settings = settings
        self.rules = AlertRules(frozenset(settings.on), workload)
        self.run_id, self.run_dir = run_id, Path(run_dir)
        self.workload, self.device_preset = workload, device_preset
        self.terminal = terminal if settings.terminal != "off" else None
        self.commands = Commands(settings.notify_timeout_s, say)
        self.sent: list[Alert] = []

    def see(self, events: list[dict]) -> None:
        for alert in self.rules.see(events):
            self.send(alert)
        self.commands.poll()

    def close(self) -> None:
        for alert in self.rules.flush():
            self.send(alert)
        self.commands.close()

    def send(self, alert: Alert) -> None:
        self.sent.append(alert)
        if self.terminal is not None:
            self.terminal.send(alert)
        if self.settings.desktop and (argv := desktop_argv(alert)) is not None:
            self.commands.start(argv, b"", dict(os.environ), label=None)
        if self.settings.notify_command:
            payload = self.payload(alert)
            env = {**os.environ, "COCKPIT_ALERT_EVENT": alert.event, "COCKPIT_ALERT_TITLE": alert.title,
                   "COCKPIT_ALERT_MESSAGE": alert.message, "COCKPIT_RUN_ID": self.run_id,
                   "COCKPIT_RUN_DIR": str(self.run_dir.resolve())}
            self.commands.start(self.settings.notify_command, (json.dumps(payload) + "\n").encode(),
                                env, label=f"notify command ({alert.event} alert)")

    def describe(self) -> dict:
        """Everything needed to send this run's alerts from another process: the lifeline
        sends the one that says the supervisor died."""
        t = self.terminal
        return {"settings": to_table(self.settings), "run_id": self.run_id, "run_dir": str(self.run_dir),
                "workload": self.workload, "device_preset": self.device_preset,
                "terminal": t and {"path": t.path, "owner": t.owner and str(t.owner), "mode": t.mode}}

    @classmethod
    def described(cls, d: dict, say: Callable[[str], object]) -> "Alerts":
        t = d.get("terminal")
        terminal = Terminal(t["path"], ProcessId.parse(t["owner"] or ""), t["mode"]) if t else None
        return cls(from_table(AlertSettings, d["settings"], where="alerts"), run_id=d["run_id"],
                   run_dir=Path(d["run_dir"]), workload=d["workload"], device_preset=d["device_preset"],
                   terminal=terminal, say=say)

    def payload(self, alert: Alert) -> dict:
        """What a notify command reads on stdin: one JSON object."""
        return {"v": 1, "event": alert.event, "events": list(alert.events), "title": alert.title,
                "message": alert.message, "run": self.run_id, "run_dir": str(self.run_dir.resolve()),
                "workload": self.workload, "device_preset": self.device_preset, "host": self.rules.host,
                "t": max((e.get("t", 0) for e in alert.source), default=round(time.time(), 3)),
                "source": list(alert.source)}


def for_run(run, config, *, terminal: Terminal | None, notify_command: str | None,
            say: Callable[[str], object]) -> Alerts:
    """The run's alerts from settings.toml (a broken one is said, and the defaults used: the
    run was checked when it was started; the file changed since) and the command line."""
    try:
        settings = user_settings.load().alerts
    except ConfigError as e:
        say(f"alerts use their defaults: {e.line()}")
        settings = AlertSettings()
    if notify_command is not None:
        settings = dataclasses.replace(settings, notify_command=notify_command)
    if terminal is not None:
        terminal = dataclasses.replace(terminal, mode=settings.terminal)
    return Alerts(settings, run_id=run.id, run_dir=run.path, workload=config.workload_preset,
                  device_preset=config.device_preset, terminal=terminal, say=say)
