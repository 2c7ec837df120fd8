"""The lifeline: an attempt never trains on unsupervised after its supervisor dies.

The supervisor can die without running any code of its own: `kill -9`, the OOM killer, the TUI
it ran in killed with it. Its attempt runs in a session of its own (so a Ctrl-C or a closed SSH
connection does not reach it) and would train on as an orphan: no hang watch, no memory
samples, no fallback, a run listed as `lost` forever.

So each supervisor starts a lifeline: a small process in its own session whose stdin is a pipe
from the supervisor. The supervisor tells it each attempt's identity and how that attempt is
stopped, and says `bye` when it ends normally. When the pipe closes without a `bye`, the
supervisor is gone (the kernel closes a dead process's pipes on macOS and Linux alike, at once,
with no polling). The lifeline then stops the attempt the way the supervisor would have (the
trainer: SIGTERM, it finishes its step, checkpoints and exits; a command: SIGINT as Ctrl-C,
then SIGTERM, then SIGKILL), and records the run as `interrupted`, with the command that
continues it:

    supervisor_lost -> (the attempt's own checkpoint) -> attempt_ended -> run_interrupted

A spare (engine.train.spare, the next attempt's process started ahead) needs nothing of the
lifeline while it waits: it reads a pipe from the supervisor too, and ends when that closes. Once
handed an attempt it is that attempt, told here like any other, and stopped as one.

    python -m engine.run.lifeline RUN_DIR        (started by the supervisor, stdin a pipe)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from engine.event_types import AttemptProcessFields
from engine.record import reached
from engine.record.events import EventWriter
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir, continue_hint  # imported now: when the supervisor dies, every moment counts
from engine.run.process import AttemptProcess, to_group, to_process

POLL_S = 0.1


class Lifeline:
    """The supervisor's end of the pipe."""

    def __init__(self, run_path: Path, log_path: Path, env: dict[str, str], lock: int):
        # `lock`, the run's lock, is shared with the lifeline: the run stays locked until an
        # orphaned attempt is stopped, so no new supervisor starts beside it.
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "engine.run.lifeline", str(run_path)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, pass_fds=(lock,))
        assert self.proc.stdin is not None  # stdin=PIPE
        self._pipe = self.proc.stdin

    def attempt(self, attempt: int, pid: int, signals: tuple[signal.Signals, ...],
                grace_s: float, group: bool) -> AttemptProcessFields | None:
        """The attempt now running, and how to stop it: `signals` in order, `grace_s` apart,
        to its whole process group (a command) or to the process (the trainer). Returns what
        was said (None if the attempt is already gone)."""
        process = ProcessId.of(pid)
        if process is None:
            return None
        stop = AttemptProcessFields(pid=process.pid, start=process.start,
                                    signals=[s.name for s in signals], grace_s=grace_s, group=group)
        self._say({"attempt": attempt, **stop})
        return stop

    def attempt_ended(self) -> None:
        self._say({"attempt": None})

    def alerts(self, description: dict) -> None:
        """How the run's alerts are sent (engine.run.alerts.Alerts.describe): should the
        supervisor die, the lifeline tells the user so."""
        self._say({"alerts": description})

    def close(self) -> None:
        """The supervisor is ending normally: nothing for the lifeline to do."""
        self._say("bye")
        try:
            self._pipe.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _say(self, message) -> None:
        try:
            self._pipe.write((json.dumps(message) + "\n").encode())
            self._pipe.flush()
        except (OSError, ValueError):
            pass  # the lifeline itself is gone; the run goes on without it


def watch(run_path: Path, lines) -> bool:
    """Read the supervisor's messages until `bye` (True) or the pipe closes without one."""
    current, alerts = None, None
    for line in lines:
        message = json.loads(line)
        if message == "bye":
            return True
        if "alerts" in message:
            alerts = message["alerts"]
            continue
        current = message if message.get("attempt") is not None else None
    stop_orphan(run_path, current, alerts=alerts)
    return False


def stop_orphan(run_path: Path, current: dict | None, by: str = "the lifeline",
                alerts: dict | None = None) -> None:
    """Record the supervisor's death, stop its attempt if it still runs, and mark the run
    interrupted; `alerts` (the supervisor's description of them) tells the user. The caller
    holds the run's lock (the lifeline shares its supervisor's)."""
    run = RunDir(run_path)
    attempt = current["attempt"] if current else 0
    with EventWriter(run.events_path, attempt=attempt) as events:
        running = current is not None and ProcessId(current["pid"], current["start"]).alive()
        events.emit("supervisor_lost", message="the supervisor died" + (
            f"; stopping attempt {attempt} so that it does not train unsupervised" if running else ""))
        if running and current is not None:
            how = _stop(current)
            got = reached.Reader(reached.path_of(run.path, attempt)).read()  # where it got to
            events.emit("attempt_ended", outcome="interrupted", exit=f"stopped by {by}: {how}",
                        last_step=got[0] if got else None)
        # Gone before the last word: whoever reads run_interrupted finds no supervisor's pid
        # (a resume checks it), however long the alert below takes.
        run.pid_path.unlink(missing_ok=True)
        ended = events.emit("run_interrupted", reason="the supervisor died", next=continue_hint(run))
        if alerts is not None:
            _alert(alerts, ended, events)


def _alert(description: dict, ended: dict, events: EventWriter) -> None:
    """The alert that the run died with its supervisor (a command's at most its timeout)."""
    from engine.run.alerts import Alerts  # only now: a lifeline with nothing to say stays light

    try:
        alerts = Alerts.described(description, say=lambda text: events.emit(
            "warning", kind="alert", message=text, advice=[], fallback=False))
    except Exception as e:  # a description this lifeline cannot read must not stop the rest
        print(f"lifeline: alerts not sent: {e}", file=sys.stderr)
        return
    alerts.see([ended])
    alerts.close()


def _stop(current: dict) -> str:
    """Stop the orphaned attempt as its supervisor would have (engine.run.process); returns what
    it took."""
    process = AttemptProcess.adopt(ProcessId(current["pid"], current["start"]),
                                   tuple(signal.Signals[name] for name in current["signals"]),
                                   current["grace_s"], deliver=to_group if current["group"] else to_process)
    sent = process.stop(POLL_S)
    return "SIGKILL" if sent == signal.SIGKILL else f"{sent.name if sent else 'nothing'}, exited"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m engine.run.lifeline RUN_DIR (stdin: the supervisor's pipe)",
              file=sys.stderr)
        return 2
    # Signals meant for the terminal's foreground job are not for the lifeline, nor SLURM's
    # warning, which reaches every process of a job's step (the supervisor acts on it).
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    watch(Path(argv[0]), sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
