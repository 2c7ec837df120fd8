"""The run directory: the single source of truth about a run.

    <runs>/<run id>/
        run.toml          resolved configuration (workload, device, ladder, overrides)
        events.jsonl      append-only events (engine.record.events)
        checkpoints/      step-<n>.pt, the last K kept
        attempt-<n>.log   the trainer's stdout and stderr, one file per attempt
        attempt-<n>.reached  the step it reached, published every step (engine.record.reached)
        supervisor.pid    pid and start time of the supervising process while it runs
        supervisor.host   the machine it runs on (a SLURM job's node, seen from the login node)
        run.lock          held (flock) by the supervisor and its lifeline
        supervisor.log    a detached supervisor's own output

Everything here can be read with no live process: the TUI, `cockpit runs`, tests and
users' scripts all go through RunDir and summarize().
"""

from __future__ import annotations

import errno
import json
import fcntl
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine import files, paths
from engine.errors import ConfigError
from engine.record.events import read_events
from engine.record.identity import ProcessId
from engine.record.state import RunState
from engine.record.stats import average_rate, samples_known
from engine.runconfig import RunConfig


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "run.toml"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def pid_path(self) -> Path:
        return self.path / "supervisor.pid"

    @property
    def supervisor_log(self) -> Path:
        return self.path / "supervisor.log"

    def attempt_log(self, attempt: int) -> Path:
        return self.path / f"attempt-{attempt}.log"

    def config(self) -> RunConfig:
        return RunConfig.from_table(files.read_toml(self.config_path), str(self.config_path))

    def preset_names(self) -> tuple[str, str]:
        """(workload preset, device preset) as run.toml names them: '?' for one it does not name,
        both '?' where it cannot be read. Read alone, without the checks config() makes."""
        try:
            config = files.read_toml(self.config_path)
        except ConfigError:
            return "?", "?"
        workload, device = config.get("workload_preset"), config.get("device_preset")
        return (workload if isinstance(workload, str) else "?", device if isinstance(device, str) else "?")

    def main_metric(self) -> str:
        """The metric the workload preset names as the run's main one (its `main_metric`, as
        run.toml says it); '' where it names none or run.toml cannot be read: then the default
        choice (choose_main_metric)."""
        try:
            named = (files.read_toml(self.config_path).get("workload") or {}).get("main_metric")
        except ConfigError:
            return ""
        return named if isinstance(named, str) else ""

    def events(self) -> list[dict]:
        return read_events(self.events_path)

    def supervisor_pid(self) -> int | None:
        """The pid of this run's live supervisor on this machine, or None. Checked by identity
        (pid and start time): a pid the kernel has since given to another process is not the
        supervisor; one on another machine (a SLURM job's node) cannot be checked from here."""
        found = self._supervisor()
        if found is None or found[1] not in (None, socket.gethostname()):
            return None
        return found[0].pid if found[0].alive() else None

    def supervisor_elsewhere(self) -> str | None:
        """The machine this run's supervisor runs on when that is not this one (a SLURM job's
        node, seen from the login node over shared storage), or None. Its liveness cannot be
        checked from here: the job's state says it (engine.run.slurm)."""
        found = self._supervisor()
        return found[1] if found is not None and found[1] not in (None, socket.gethostname()) else None

    def supervised(self) -> bool:
        """A supervisor works on the run: here and alive, or on another machine (one read); for
        a run on several machines, on any of them (engine.record.nodes)."""
        found = self._supervisor()
        if found is None and (self.path / "nodes").is_dir():
            from engine.record import nodes

            return any(member.supervised() for member in nodes.nodes_of(self))
        return found is not None and (found[1] not in (None, socket.gethostname()) or found[0].alive())

    def _supervisor(self) -> tuple[ProcessId, str | None] | None:
        """supervisor.pid ('PID START') and the machine it names, supervisor.host (None where
        none was written: a run from before it was kept)."""
        try:
            supervisor = ProcessId.parse(self.pid_path.read_text())
        except (OSError, UnicodeDecodeError):
            return None
        try:
            host: str | None = (self.path / "supervisor.host").read_text().strip() or None
        except (OSError, UnicodeDecodeError):
            host = None
        return (supervisor, host) if supervisor is not None else None

    def write_supervisor_pid(self, pid: int) -> None:
        if (supervisor := ProcessId.of(pid)) is not None:
            # the machine first: a pid is never read against another machine's name
            files.atomic_write(self.path / "supervisor.host", f"{socket.gethostname()}\n".encode())
            files.atomic_write(self.pid_path, f"{supervisor}\n".encode())

    def read_record(self, name: str) -> dict | None:
        """A JSON object kept beside run.toml (adopted.json, slurm.json: what the run is besides
        its configuration), or None where there is none or it cannot be read as one."""
        try:
            found = json.loads((self.path / name).read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def try_lock(self) -> int | None:
        """The run's exclusive lock (run.lock, flock: macOS and Linux alike), so that no two
        supervisors ever run one run: its supervisor holds it, and shares it with its lifeline,
        which keeps it until an orphaned attempt is stopped. Returns the open descriptor (the
        lock lasts while it, or a child's copy of it, is open), or None if it is held."""
        fd = os.open(self.path / "run.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None   # held
            # a filesystem without flock (Lustre mounted noflock, some NFS): said, not taken
            # for a supervisor at work
            raise ConfigError("run", self.id, f"cannot be locked where it lives ({e.strerror}): its "
                              "runs directory's filesystem has no flock; expected one that has "
                              "(most cluster filesystems: mounted with flock), or another "
                              "--runs-dir / COCKPIT_RUNS_DIR") from None
        return fd

    def locked(self) -> bool:
        """A supervisor, or its lifeline, is at work on this run (on a filesystem without flock,
        not known: no, and the supervisor that tries to take it says why)."""
        try:
            fd = self.try_lock()
        except ConfigError:
            return False
        if fd is not None:
            os.close(fd)
        return fd is None

    @classmethod
    def create(cls, config: RunConfig, root: Path | None = None) -> "RunDir":
        """Make a new run directory holding run.toml; the runs dir must be writable."""
        root = Path(root) if root else paths.runs_dir()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_id = f"{stamp}-{config.workload_preset}-{config.device_preset}-{secrets.token_hex(2)}"
        try:
            root.mkdir(parents=True, exist_ok=True)
            path = root / run_id
            path.mkdir()
            (path / "checkpoints").mkdir()
        except OSError as e:
            raise ConfigError(f"runs directory {root}", None,
                              f"is not writable ({e.strerror}); set --runs-dir or COCKPIT_RUNS_DIR") from None
        run = cls(path)
        files.atomic_write(run.config_path, files.dump_toml(config.to_table()))
        return run


# What makes a directory a run's: every command that takes a RUN says so when given another.
RUN_FILES = "a run directory holds run.toml and events.jsonl"


def continue_hint(run: RunDir) -> str:
    """What to type to continue a run that ended early: 'continue it with: cockpit runs resume
    ID', or, for a run that saved no checkpoint, that there is nothing to continue from (a
    resume would only start it over); an adopted run's resume starts its command again."""
    summary = summarize(run)
    if summary.adopted is not None:
        return (f"start its command again under cockpit with: cockpit runs resume {run.id} "
                "[--resume-args '...']")
    if summary.checkpoints:
        return f"continue it with: cockpit runs resume {run.id}"
    return "it saved no checkpoint, so there is nothing to resume from"


def interrupted_next(event: dict) -> str:
    """What a run_interrupted event says to do next (older ones carried only the command)."""
    return event.get("next") or f"continue it with: {event.get('resume', 'cockpit runs resume')}"


def find_run(ref: str, root: Path | None = None) -> RunDir:
    """A run by id, unique id prefix, unique end (its token, 'auto-2bcd': what the runs screen
    shows of an id at 80 columns), path, or 'last'. A path (anything with a '/', or a
    directory that is no run's id) is taken as it is, and one that is not a run's directory is
    said to be so: never "not found" for a directory that is there."""
    root = Path(root) if root else paths.runs_dir()
    expected = ("expected a run id, a unique prefix or end of one (cockpit runs list), 'last', "
                "or a run directory")
    if not ref:  # Path('') is '.', a directory
        raise ConfigError("run", None, f"got '', {expected}")
    if ref != "last" and Path(ref).is_dir() and (Path(ref) / "run.toml").exists():
        return RunDir(Path(ref))
    runs = list_runs(root)
    if ref == "last":
        if not runs:
            raise ConfigError("run", "last", f"no runs in {root}")
        return runs[0]
    matches = [r for r in runs if r.id.startswith(ref)] or \
        [r for r in runs if r.id.endswith("-" + ref.lstrip("…-"))]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError("run", ref, "matches several runs: " + ", ".join(r.id for r in matches[:5]))
    if Path(ref).is_dir():
        raise ConfigError("run", ref, f"is not a run directory ({RUN_FILES}; it has no run.toml); "
                                      + expected)
    if Path(ref).exists():
        raise ConfigError("run", ref, f"is a file, not a run directory ({RUN_FILES}); {expected}")
    if os.sep in ref or (os.altsep and os.altsep in ref):
        raise ConfigError("run", ref, f"no such directory; {expected}")
    raise ConfigError("run", ref, f"not found in {root}; {expected}")


def list_runs(root: Path | None = None) -> list[RunDir]:
    """Runs, newest first."""
    root = Path(root) if root else paths.runs_dir()
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir() if (p / "run.toml").exists()]
    return sorted(runs, key=lambda r: r.id, reverse=True)


@dataclass
class AttemptSummary:
    attempt: int
    device: str = "?"
    preset: str = "?"
    outcome: str = "running"
    exit: str = ""
    last_step: int = 0
    crash: str | None = None        # the crash panel's sentence, when it crashed


@dataclass
class RunSummary:
    """What a run's events say, folded into one record."""

    id: str
    workload: str
    device_preset: str
    # created | running | finished | failed | stopped | interrupted (its supervisor died; the
    # lifeline stopped the attempt) | lost (the supervisor died and nothing has said so yet);
    # an adopted run (cockpit adopt): ended (its process exited, status unknown, no error in its
    # log) | released (cockpit stopped following it; it ran on)
    status: str = "created"
    step: int = 0
    total_steps: int = 0
    # where the total came from, a command's (its step events' total_source): "output" (a bar,
    # `step N/M`), "stated" (a line of its own), "argv", "epochs" (its epochs x the steps in
    # one), "preset"; None: the trainer's schedule, or no total known
    total_source: str | None = None
    samples_seen: int | None = 0       # None: a command whose samples per step are not known
    tokens_seen: int | None = None     # where the tokens per step are known
    loss: float | None = None
    # The run's averages over time spent training, all attempts (engine.record.stats): a
    # window's own figure can be a 0.05 s fragment's. samples_per_s is None where the samples
    # per step are not known: then steps_per_s is the throughput, never a guessed sample count.
    samples_per_s: float | None = None
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    gflop_s: float | None = None
    train_s: float = 0.0
    # the last reporting window's: a live run's speed now
    window_samples_per_s: float | None = None
    window_steps_per_s: float | None = None
    window_tokens_per_s: float | None = None
    # A command's units, from its last step event: samples_per_step, samples_source,
    # tokens_per_step, tokens_source (reported | stated | preset | placeholders | unknown), said
    # (the script's line a stated figure came from), counter (steps | batches: the accumulation
    # is not known, so its steps count batches), accumulation. None: the built-in trainer's
    # figures, counted exactly.
    units: dict | None = None
    eta_s: float | None = None
    started: float | None = None
    ended: float | None = None
    last_event: float | None = None    # the newest event's time
    metrics: dict = field(default_factory=dict)   # the last eval's, as shown (shown_metrics)
    # The metric the run is judged by besides its loss (a reward, a recall): the preset's
    # main_metric ("preset") or the first reward-like, then recall-like name ("default"), with
    # its newest value from a step or an eval and the step it was reported at.
    main_metric: str | None = None
    main_metric_value: float | None = None
    main_metric_step: int | None = None
    main_metric_source: str | None = None
    attempts: list[AttemptSummary] = field(default_factory=list)
    fallbacks: list[dict] = field(default_factory=list)
    # each health finding (a loss spike, a gradient explosion, divergence, a plateau): {"step",
    # "kind", "sentence", "action", "value", "mean", "std", "z", "rule", "done"}, `done` what was
    # done about it in words (engine.run.training_health, engine.run.rewind)
    health: list[dict] = field(default_factory=list)
    # each change of torch's threads to fit the cores other processes leave (engine.train.threads):
    # {"attempt", "step", "was", "threads", "reason", "cores", "others_need"}
    threads: list[dict] = field(default_factory=list)
    steps_lost: int = 0                # steps trained again, or lost past a checkpoint, after crashes
    steps_rewound: int = 0             # steps thrown away by rewinds (engine.run.rewind)
    goodput: dict | None = None        # where its wall time went (engine.record.goodput, as_dict)
    checkpoints: int = 0               # checkpoint events: 0, and a resume starts over
    # each checkpoint written: {"attempt", "step", "step_source", "path"}; a command's step
    # source says how it is known ("name": its name says; "reached": the step read before it
    # was written; absent: the script or the trainer said it)
    checkpoint_writes: list[dict] = field(default_factory=list)
    # a command's file rewritten faster than it was still for a look: some of its writes went
    # untold, so `checkpoints` and `checkpoint_writes` are lower bounds ("at least N")
    checkpoints_at_least: bool = False
    command: list[str] | None = None   # a command workload's argv template
    # a run made with `cockpit adopt`: the process it followed (pid, start, argv, cwd, logs)
    adopted: dict | None = None
    error: str | None = None           # why a 'broken' run dir cannot be read

    @property
    def duration_s(self) -> float | None:
        """Start to end; a running run's to now, a lost one's to its last event (it is not
        getting any longer)."""
        if self.started is None:
            return None
        end = self.ended or (time.time() if self.status == "running" else self.last_event)
        return (end or self.started) - self.started

    @property
    def samples_known(self) -> bool:
        return samples_known(self.units)

    @property
    def rate(self) -> tuple[float, str] | None:
        """Its average throughput as a column shows it (engine.record.stats.average_rate)."""
        return average_rate(self.samples_per_s, self.steps_per_s, self.samples_known)


# What reading a run dir that is not as cockpit writes it raises: summarize() and the digest
# (engine.record.digest) turn these into a 'broken' summary rather than let one run hide the others.
UNREADABLE = (ConfigError, OSError, KeyError, TypeError, ValueError, AttributeError)


def summarize(run: RunDir) -> RunSummary:
    """The run's summary; a run dir that cannot be read (run.toml unreadable, an event lacking
    a key it needs) is status 'broken' with the reason in `error`, so one bad run dir never
    hides the others from `runs list` or the runs screen."""
    try:
        if not run.events_path.exists():
            from engine.record import nodes   # a run on several machines: theirs, gathered

            if members := nodes.nodes_of(run):
                return nodes.gathered(run, members)
        return _fold(run)
    except UNREADABLE as e:
        return broken(run, e)


def broken(run: RunDir, e: Exception) -> RunSummary:
    """The 'broken' summary of a run whose reading raised `e` (one of UNREADABLE): the reason in
    `error`, the workload and device presets if run.toml still says them."""
    if isinstance(e, ConfigError):
        problem = e.line()
    elif isinstance(e, OSError):
        problem = f"{e.filename or run.path}: cannot be read ({e.strerror})"
    elif isinstance(e, KeyError):
        problem = f"{run.events_path}: an event lacks {e.args[0]!r}; expected the fields cockpit writes"
    else:
        problem = f"{run.path}: cannot be summarized ({type(e).__name__}: {e})"
    workload, device_preset = run.preset_names()
    return RunSummary(id=run.id, workload=workload, device_preset=device_preset, status="broken",
                      error=problem)


def _fold(run: RunDir) -> RunSummary:
    """The run's events folded (engine.record.state), as a RunSummary."""
    config = files.read_toml(run.config_path)
    return summary_of(run, RunState.of(run.events(), strict=True), config)


def summary_of(run: RunDir, state: RunState, config: dict | None = None) -> RunSummary:
    """The summary of a run whose events `state` has folded (each `require`d): its figures as a
    record, with what run.toml says (its workload, command and main metric). A run whose
    supervisor died is 'interrupted' once its lifeline has stopped the attempt, 'lost' until
    then (or if the lifeline died too)."""
    config = files.read_toml(run.config_path) if config is None else config
    workload = config.get("workload") or {}
    averages = state.averages
    summary = RunSummary(
        id=run.id, workload=config.get("workload_preset", "?"), device_preset=config.get("device_preset", "?"),
        command=workload.get("command"), status=state.status, step=state.step, total_steps=state.total,
        total_source=averages.total_source, samples_seen=state.samples_seen, tokens_seen=state.tokens_seen,
        loss=state.loss, samples_per_s=averages.samples_per_s, steps_per_s=averages.steps_per_s,
        tokens_per_s=averages.tokens_per_s, gflop_s=averages.gflop_s, train_s=averages.train_s,
        window_samples_per_s=state.now.samples_per_s, window_steps_per_s=state.now.steps_per_s,
        window_tokens_per_s=state.now.tokens_per_s, units=averages.units, eta_s=state.eta_s,
        started=state.started_t, ended=state.ended_t, last_event=state.newest_t, metrics=dict(state.metrics),
        attempts=[AttemptSummary(attempt=a.attempt, device=a.device or "?", preset=a.preset,
                                 outcome=a.outcome, exit=a.exit, last_step=a.last_step or 0, crash=a.sentence)
                  for a in state.attempts if a.attempt is not None],
        fallbacks=list(state.fallbacks),
        health=[{**{k: e.get(k) for k in ("step", "kind", "sentence", "action", "value", "mean", "std",
                                          "z", "rule")}, "done": _done(e, state)}
                for e in state.health],
        threads=[{k: e.get(k) for k in ("attempt", "step", "was", "threads", "reason", "cores", "others_need")}
                 for e in state.threads],
        steps_lost=averages.steps_lost, steps_rewound=state.stats.steps_rewound, goodput=state.goodput().as_dict(),
        checkpoints=state.stats.checkpoints,
        checkpoint_writes=[{k: e.get(k) for k in ("attempt", "step", "step_source", "path")}
                           for e in state.checkpoints],
        checkpoints_at_least=any(e.get("writes_unseen") for e in state.checkpoints),
        adopted=state.adopted)
    named = workload.get("main_metric")
    named = named if isinstance(named, str) else ""
    if (main := state.main_of(named)) is not None:
        summary.main_metric, summary.main_metric_source = main.name, "preset" if named else "default"
        summary.main_metric_value, summary.main_metric_step = main.value, main.step
    if summary.status == "running" and not run.supervised():
        summary.status = "lost"  # the supervisor was killed; nothing will finish this run
    return summary


def _done(finding: dict, state: RunState) -> str:
    """What was done about a health finding, in words: 'warned', 'stopped the run', or its
    rewind's ('rewound to 1,100, skipping 300 batches'), or why the run stopped instead."""
    action = finding.get("action")
    if action == "stop":
        return "stopped the run"
    if action not in ("rewind", "lower-lr"):
        return "warned"
    said = f"{finding.get('short')}: "   # how engine.run.rewind begins its sentences
    for fallback in state.fallbacks:
        rewind = fallback.get("rewind") or {}
        if rewind.get("step") == finding.get("step") and rewind.get("finding") == finding.get("kind"):
            return str(fallback.get("why", "")).removeprefix(said)
    failed = next((a.failed_why for a in state.attempts if a.failed_why and a.outcome == "health"), None)
    return f"not rewound: {failed.removeprefix(said)}" if failed else "rewinding"

