"""Continuing a run: `cockpit runs resume RUN [-d PRESET] [--set k=v]`.

A supervisor started on a run directory that already has events continues that run instead of
starting it over (engine.run.supervisor reads its `History`): attempts are numbered on from the
last one, faults already injected are not injected again, the checkpoints the run wrote are
known, and a `run_resumed` event says where it continues. Every attempt resumes from the newest
loadable checkpoint on its own (the trainer; a command through its `resume` arguments), so a
stopped, failed or interrupted run continues at the checkpoint's sample.

`plan` decides the configuration of the continuation: by default the preset the last attempt
ran on, as run.toml recorded it; `-d` another preset (loaded and checked like a new run's) and
`--set` changes to the device or training settings. A change keeps the previous run.toml beside
it (run.before-attempt-N.toml): nothing the user had is overwritten. Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine import presets, runconfig
from engine.errors import ConfigError
from engine.run.identity import ProcessId
from engine.run.rundir import RunDir, summarize
from engine.runconfig import RunConfig

RESUMABLE = ("stopped", "failed", "interrupted", "lost", "created")


@dataclass
class History:
    """What the run's earlier supervisors recorded."""

    attempts: int = 0                   # the last attempt's number
    started: float | None = None        # when the run first started
    fired: set[tuple[str, str]] = field(default_factory=set)   # (preset, fault spec)
    checkpoints: dict[str, dict] = field(default_factory=dict)  # path -> checkpoint event
    process: dict | None = None         # the last attempt's process (attempt_process event)

    @classmethod
    def of(cls, events: list[dict]) -> "History":
        history, preset_of = cls(), {}
        for e in events:
            kind = e["type"]
            if kind == "run_started" and history.started is None:
                history.started = e["t"]
            elif kind == "attempt_started":
                history.attempts = max(history.attempts, e.get("attempt", 0))
                preset_of[e.get("attempt")] = e.get("preset")
            elif kind == "attempt_process":
                history.process = e
            elif kind == "fault_injected":
                history.fired.add((preset_of.get(e.get("attempt")), e.get("spec")))
            elif kind == "checkpoint" and e.get("path"):
                history.checkpoints[e["path"]] = e
        return history

    def orphan(self) -> ProcessId | None:
        """The last attempt's process if it is still running (its supervisor and lifeline both
        gone); None otherwise."""
        if not self.process:
            return None
        process = ProcessId(self.process["pid"], self.process["start"])
        return process if process.alive() else None


def orphaned_attempt(run: RunDir) -> ProcessId | None:
    """The run's last attempt if it runs on with no supervisor: the lifeline is stopping it
    (events still arrive), or the lifeline died too (`cockpit runs stop` stops it)."""
    return History.of(run.events()).orphan()


def check(run: RunDir) -> str:
    """The run's status if it can be resumed; a one-line ConfigError if not."""
    status = summarize(run).status
    if status == "running":
        raise ConfigError("run", run.id, f"is running; follow it with: cockpit runs follow {run.id}")
    if status == "finished":
        raise ConfigError("run", run.id, "finished; there is nothing to resume (start a new run, "
                                         "e.g. with more train.epochs)")
    if status not in RESUMABLE:
        raise ConfigError("run", run.id, f"is {status}; expected a stopped, failed or interrupted run")
    if (orphan := orphaned_attempt(run)) is not None:
        raise ConfigError("run", run.id, f"its attempt (pid {orphan.pid}) is still running without a "
                                         f"supervisor; stop it first: cockpit runs stop {run.id}")
    return status


def plan(run: RunDir, device: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """The continuation's configuration, checked; run.toml is not touched (see `save`)."""
    config, overrides = run.config(), list(overrides or [])
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key.startswith("params."):
            raise ConfigError("--set", key, "cannot change on resume: the checkpoints hold a model "
                                            "of the workload as it was; expected device.*, train.* "
                                            "or command.* settings")
    if device is None:
        attempts = summarize(run).attempts
        name = attempts[-1].preset if attempts else config.device_preset
        preset = config.device if name == config.device_preset else config.ladder.get(name, config.device)
        ladder = {}
    else:
        ref = presets.find("devices", device)
        name, preset = device, presets.load_device(device)
        ladder = presets.check_ladder(device, preset, str(ref.path))
    workload, preset = runconfig.apply_overrides(config.workload, preset, overrides)
    ladder = {**config.ladder, **ladder}
    if workload.is_command:
        workload = runconfig.check_command(workload, str(run.config_path), {name: preset, **ladder})
    else:
        from engine.train import device as devices

        devices.resolve(preset, where=f"device preset {name!r}")
    return dataclasses.replace(config, device_preset=name, device=preset, workload=workload,
                               ladder=ladder, overrides=config.overrides + tuple(overrides))


def save(run: RunDir, config: RunConfig, next_attempt: int) -> None:
    """Write the continuation's run.toml, keeping the previous one when it changes."""
    new = presets.dump_toml(config.to_table())
    old = run.config_path.read_bytes()
    if new == old:
        return
    presets.atomic_write(run.path / f"run.before-attempt-{next_attempt}.toml", old)
    presets.atomic_write(run.config_path, new)
