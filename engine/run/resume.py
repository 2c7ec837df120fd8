"""Continuing a run: `cockpit runs resume RUN [-d PRESET] [--set k=v]`.

A supervisor started on a run directory that already has events continues that run instead of
starting it over (engine.run.supervisor reads its `History`): attempts are numbered on from the
last one, faults already injected are not injected again, the checkpoints the run wrote (and
those found unreadable) are known, and a `run_resumed` event says where it continues. Every
attempt resumes from the newest loadable checkpoint on its own (the trainer; a command through
its `resume` arguments), so a stopped, failed or interrupted run continues at the checkpoint's
sample.

`plan` decides the continuation's configuration, the way a new run's is decided
(runconfig.configure): by default the preset the last attempt ran on, as it ran (a rule's
halved batch or fp32 included), with what was left of its ladder; `-d` another preset, loaded
with its ladder like a new run's; `--set` changes to the device, training or command settings,
carried down the ladder. A change keeps the previous run.toml beside it
(run.before-attempt-N.toml): nothing the user had is overwritten. Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine import files, presets, runconfig
from engine.errors import ConfigError
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir, summarize
from engine.record.state import RunState
from engine.runconfig import RunConfig

# "ended", "released": an adopted run's (engine.run.launchers.adopted), once its process has ended
RESUMABLE = ("stopped", "failed", "interrupted", "lost", "created", "ended", "released", "preempted")


def literal(args) -> list[str]:
    """Arguments as a command template that fills in nothing: braces doubled (a recorded
    argv's `{"lr": 3e-4}` is not a placeholder)."""
    return [a.replace("{", "{{").replace("}", "}}") for a in args]


@dataclass
class History:
    """What the run's earlier supervisors recorded: the part of its read model
    (engine.record.state) a continuation needs."""

    attempts: int = 0                   # the last attempt's number
    started: float | None = None        # when the run first started
    fired: set[tuple[str | None, str | None]] = field(default_factory=set)   # (preset, fault spec)
    checkpoints: dict[str, dict] = field(default_factory=dict)  # path -> checkpoint event
    unreadable: set[str] = field(default_factory=set)           # checkpoints that did not load
    process: dict | None = None         # the last attempt's process (attempt_process event)
    last: dict | None = None            # the last attempt_started event: its preset as it ran
    epoch_base: int | None = None       # how a command's printed epochs are numbered (0 or 1)
    adopted: dict | None = None         # an adopted run's process (run_started's `adopted`)

    @classmethod
    def of(cls, events: list[dict]) -> "History":
        return cls.of_state(RunState.of(events))

    @classmethod
    def of_state(cls, state: RunState) -> "History":
        return cls(attempts=max((a.attempt or 0 for a in state.attempts), default=0), started=state.started_t,
                   fired=set(state.fired), checkpoints={e["path"]: e for e in state.checkpoints if e.get("path")},
                   unreadable=set(state.unreadable), process=state.process, last=state.last_started,
                   epoch_base=state.epoch_base, adopted=state.adopted)

    def orphan(self) -> ProcessId | None:
        """The last attempt's process if it is still running (its supervisor gone); None
        otherwise."""
        if self.process is None:
            return None
        try:
            process = ProcessId(self.process["pid"], self.process["start"])
        except (TypeError, KeyError):
            return None
        return process if process.alive() else None


def own_resume_args(history: History, config: RunConfig) -> list[str]:
    """The arguments an adopted run's continuation runs beyond the argv it was adopted with
    (`runs resume --resume-args`, which plan appends): [] for any other run, or none given."""
    argv = (history.adopted or {}).get("argv")
    if not isinstance(argv, list) or not config.workload.is_command:
        return []
    adopted, command = literal(map(str, argv)), list(config.workload.params.command)
    return [a.replace("{{", "{").replace("}}", "}") for a in command[len(adopted):]] \
        if command[:len(adopted)] == adopted else []


def at_work(run: RunDir) -> bool:
    """Something may still write to the run: its supervisor or the lifeline of a dead one holds
    its lock, or its last attempt runs on with neither (`cockpit runs stop` stops it). A
    follower that reads no news while this holds has not seen the end."""
    return run.locked() or History.of(run.events()).orphan() is not None


def check(run: RunDir, history: History) -> str:
    """The run's status if it can be resumed; a one-line ConfigError if not."""
    status = summarize(run).status
    if run.locked() or status == "running":
        raise ConfigError("run", run.id, f"is running; follow it with: cockpit runs follow {run.id}")
    if status == "finished":
        raise ConfigError("run", run.id, "finished; there is nothing to resume (start a new run, "
                                         "e.g. with more train.epochs)")
    if status not in RESUMABLE:
        raise ConfigError("run", run.id, f"is {status}; expected a stopped, failed or interrupted run")
    if (orphan := history.orphan()) is not None:
        raise ConfigError("run", run.id, f"its attempt (pid {orphan.pid}) is still running without a "
                                         f"supervisor; stop it first: cockpit runs stop {run.id}")
    if history.adopted is not None and history.attempts <= 1:
        adopted = ProcessId.parse(f"{history.adopted.get('pid')} {history.adopted.get('start')}")
        if adopted is not None and adopted.alive():
            raise ConfigError("run", run.id, f"its adopted process (pid {adopted.pid}) is still running; "
                                             f"a resume would start a second one (follow it again: "
                                             f"cockpit adopt {adopted.pid})")
    return status


def plan(run: RunDir, history: History, device: str | None = None,
         overrides: list[str] | None = None, resume_args: list[str] | None = None) -> RunConfig:
    """The continuation's configuration, checked; run.toml is not touched (see `save`).
    `resume_args`: an adopted run's, appended to the argv it was adopted with (not to the
    command the last resume ran: they are not piled up)."""
    config, overrides = run.config(), list(overrides or [])
    if resume_args is not None:
        if history.adopted is None or not isinstance(history.adopted.get("argv"), list):
            raise ConfigError("--resume-args", None, "is for a run made with cockpit adopt; a command "
                                                     "run resumes with its command.resume arguments "
                                                     "(--set 'command.resume=[\"--resume\", \"{checkpoint}\"]')")
        argv = literal([*map(str, history.adopted["argv"]), *resume_args])
        spec = dataclasses.replace(config.workload.params, command=tuple(argv))
        config = dataclasses.replace(config, workload=dataclasses.replace(config.workload, params=spec))
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key.startswith("params."):
            raise ConfigError("--set", key, "cannot change on resume: the checkpoints hold a model "
                                            "of the workload as it was; expected device.*, train.* "
                                            "or command.* settings")
    if device is None:
        name, start, known = *_where_it_was(run, history.last, config), config.ladder
        start_where = str(run.config_path)
    else:
        ref = presets.find("devices", device)
        name, start, known, start_where = device, presets.load_device(device), None, str(ref.path)
    resumed = runconfig.configure(config.workload, config.workload_preset, str(run.config_path),
                                  name, start, start_where, overrides, known=known)
    if not resumed.workload.is_command:
        from engine.monitor import device_rules  # the trainer's device, judged as it will be

        device_rules.check(resumed.device, where=f"device preset {name!r}")
    return dataclasses.replace(resumed, overrides=config.overrides + tuple(overrides))


def _where_it_was(run: RunDir, last: dict | None, config: RunConfig) -> tuple[str, "presets.DevicePreset"]:
    """The preset the last attempt (its attempt_started event) ran on, as it ran, falling back
    along what was left of the run's ladder (a preset's own `fallback` names the ladder only
    when the run started on it)."""
    order = [config.device_preset, *config.device.fallback]
    if last is None or last.get("preset") not in order:
        return config.device_preset, config.device
    name = last["preset"]
    try:
        ran = presets.device_from_table(last["config"], f"{run.events_path} attempt {last['attempt']}")
    except (KeyError, ConfigError):
        ran = config.device if name == config.device_preset else config.ladder[name]
    return name, dataclasses.replace(ran, fallback=tuple(order[order.index(name) + 1:]))


def save(run: RunDir, config: RunConfig, next_attempt: int) -> None:
    """Write the continuation's run.toml, keeping the previous one when it changes."""
    new = files.dump_toml(config.to_table())
    old = run.config_path.read_bytes()
    if new == old:
        return
    files.atomic_write(run.path / f"run.before-attempt-{next_attempt}.toml", old)
    files.atomic_write(run.config_path, new)


def prepare(run: RunDir, device: str | None = None, overrides: list[str] | None = None,
            resume_args: list[str] | None = None) -> RunConfig:
    """Everything `cockpit runs resume` and the TUI's `r` do before a supervisor continues the
    run: check it can be resumed, plan the continuation, write its run.toml."""
    history = History.of(run.events())
    check(run, history)
    config = plan(run, history, device, overrides, resume_args)
    save(run, config, history.attempts + 1)
    return config
