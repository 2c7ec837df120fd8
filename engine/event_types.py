"""The events' vocabulary: each event type of events.jsonl and the fields it carries.

One TypedDict per type, named for it (`step` -> StepFields): the fields a writer passes to
`EventWriter.emit("step", **fields)` (engine.record.events), without the envelope every event
gets from the writer (`v`, `t`, `type`, `attempt`). A field some writers leave out is
NotRequired. mypy checks every emit call against these (an overload per type, generated from
EVENT_FIELDS by tools/event_overloads.py into EventWriter.emit and engine.emit's Emit, the type
of an emit handed around): a misspelled or missing field, or an event type that does not exist,
is a type error. What is on disk is unchanged: plain JSON objects, the nested figures (device
memory, GPUs, a preset's table) plain dicts; readers still meet old runs' events, which may lack
fields added since, so a reader asks for a field with `.get`.

The ground floor: it imports nothing from engine, so every floor names the events' words here
-- the monitor's memory and warning figures and a workload's mining event as well as the
record that writes them and the front ends that read them.

Adding a field: add it here (NotRequired, unless every writer of the type sets it), then run
`python tools/event_overloads.py` only when a type is added or renamed.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# ---------------------------------------------------------------- the envelope


class Envelope(TypedDict):
    """What the writer adds to every event."""

    v: int          # the schema version (engine.record.events.SCHEMA_VERSION)
    t: float        # unix time, to the millisecond
    type: str       # one of EVENT_FIELDS
    attempt: int    # 0 before the first attempt


class Advice(TypedDict):
    """One thing a warning suggests; `set`: the --set overrides that do it, for a next run."""

    text: str
    set: NotRequired[list[str]]


# ---------------------------------------------------------------- the run (the supervisor)


class RunStartedFields(TypedDict):
    run: str
    workload: str                   # the workload preset's name
    device_preset: str
    pid: int                        # the supervisor's
    overrides: list[str]            # --set, as given
    command: bool                   # the workload is the user's command
    # `cockpit adopt`: the process it follows (pid, start, argv, cwd, logs: engine.run.launchers.adopted)
    adopted: NotRequired[dict[str, Any]]


class RunResumedFields(RunStartedFields):
    """A run continued (cockpit runs resume) by a new supervisor."""

    next_attempt: int
    resume: dict[str, Any] | None   # the resume point: step, samples_seen, path
    # an adopted run's own resume arguments (`runs resume --resume-args`), appended to its argv:
    # it resumes where they say, from a checkpoint cockpit did not see written
    resume_args: NotRequired[list[str]]


class RunFinishedFields(TypedDict):
    status: str                     # finished, stopped, failed; an adopted run's: ended, released
    attempts: int
    summary: dict[str, Any]         # attempts, how each ended, steps lost (engine.run)


class RunFailedFields(TypedDict):
    reason: str                     # the fallback decision's why
    kind: str                       # the crash kind that ended the run


class SupervisorLostFields(TypedDict):
    """The lifeline's word: the supervisor died."""

    message: str


class RunInterruptedFields(TypedDict):
    """The lifeline's last word: the run ended with its supervisor."""

    reason: str
    next: str                       # what to type to continue it, or why there is nothing to


# ---------------------------------------------------------------- attempts


class AttemptStartedFields(TypedDict):
    preset: str                     # the device preset's name
    config: dict[str, Any]          # the device preset as resolved (its TOML table)
    log: str                        # attempt-N.log
    # a command's: exactly what ran
    command: NotRequired[list[str]]
    command_line: NotRequired[str]
    cwd: NotRequired[str | None]
    resume: NotRequired[dict[str, Any] | None]
    device: NotRequired[str | None]
    precision: NotRequired[str | None]


class AttemptProcessFields(TypedDict):
    """The attempt's process, as the lifeline was told it (to stop it should the supervisor die)."""

    pid: int
    start: float                    # its create time: a reused pid cannot fool a reader
    signals: list[str]              # how it is stopped, in order
    grace_s: float                  # between two of them
    group: bool                     # to its process group (a command), or the process
    spare: NotRequired[bool]        # true: a spare started ahead became it (engine.run.spare)


class AttemptEndedFields(TypedDict):
    outcome: str                    # the verdict's kind (finished, stopped, oom, ...; interrupted)
    exit: str                       # "exit 3", "SIGABRT", "not started", or the lifeline's words
    preset: NotRequired[str]
    exit_code: NotRequired[int | None]
    signal: NotRequired[str | None]
    last_step: NotRequired[int | None]  # the step it reached (engine.record.reached), or reported
    samples_seen: NotRequired[int | None]  # ... and the samples seen by then, where published
    tail: NotRequired[str]          # the end of the attempt's log
    sentence: NotRequired[str]      # a refused configuration its launcher judged (a rendezvous
                                    # that never formed): what to fix, for a person


class CrashFields(TypedDict):
    preset: str
    kind: str                       # engine.vocabulary.CrashKind
    sentence: str                   # what happened, for a person
    evidence: dict[str, Any]        # exit code, signal, last step, the message that decided it
    exception: str | None           # the traceback, when the trainer wrote one


# "from" is a Python keyword: the functional form names it.
_FallbackFrom = TypedDict("_FallbackFrom", {"from": str})


class FallbackFields(_FallbackFrom):
    """The next attempt after a crash: from the preset that crashed (`from`, a keyword: the
    writer builds the fields as a FallbackFields dict and passes **fields) to the next."""

    to: str                         # the next preset, with what the rule changed
    to_preset: str
    action: str                     # engine.vocabulary.Action, after fall-throughs
    reason: str                     # the crash kind
    why: str                        # the rule, and any fall-through, in words
    sentence: str                   # the crash's
    changed: dict[str, list[Any]] | None   # field -> [before, after]
    resume: dict[str, Any] | None
    next_attempt: int
    rewind: NotRequired[RewindFields]   # action rewind or lower-lr: a health finding's


class StopRequestedFields(TypedDict):
    request: int                    # 1 for the first Ctrl-C/stop, 2 for the next, ...
    signal: str                     # what was sent for it
    why: NotRequired[str]           # a preemption's: SIGUSR1 (SLURM's warning), SIGTERM, a rehearsal


class SlurmJobFields(TypedDict):
    """The SLURM job a supervisor runs in (engine.run.slurm), each time it starts or restarts."""

    job_id: str
    restarts: int                   # SLURM_RESTART_COUNT: 0, then one more per requeue
    node: str                       # where this start runs (SLURMD_NODENAME)
    nodes: int


class MemoryFields(TypedDict):
    """The supervisor's sample, about once a second (engine.monitor.sysmon.SystemSampler)."""

    rss: int | None                 # the attempt's process tree (macOS: physical footprint)
    processes: int
    rss_kind: NotRequired[str]      # macOS: "footprint" | "footprint+rss" | "rss"; absent: RSS
    system_total: int
    system_used: int
    system_available: int
    swap_total: int
    swap_used: int
    swap_in_per_s: float | None
    swap_out_per_s: float | None
    pressure: dict[str, Any]        # level, raw, source, detail
    cpu_percent: float | None
    cpu_count: int
    cpu_system_percent: float | None
    cpu_others: list[dict[str, Any]]
    cpu_others_percent: float | None
    gpus: list[dict[str, Any]]
    gpus_why_not: NotRequired[str]  # why there are no GPU figures


class WarningFields(TypedDict):
    kind: str                       # slowdown, cpu-contention, checkpoint-unreadable, alert, ...
    message: str
    advice: list[Advice]
    fallback: bool                  # the supervisor falls back for it
    # checkpoint-unreadable
    path: NotRequired[str | None]
    error: NotRequired[str | None]
    # fault-cannot-fire, fault-not-fired
    faults: NotRequired[list[str]]
    # slowdown
    samples_per_s: NotRequired[float]
    best_samples_per_s: NotRequired[float]
    swap_in_per_s: NotRequired[float | None]
    pressure: NotRequired[str | None]
    # cpu-contention
    cpu_others: NotRequired[list[dict[str, Any]]]
    cpu_others_percent: NotRequired[float]
    cpu_system_percent: NotRequired[float]
    cpu_percent: NotRequired[float | None]


class FaultInjectedFields(TypedDict):
    spec: str                       # as given: 'oom@120+'
    kind: str                       # engine.vocabulary.FaultKind
    step: NotRequired[int | None]
    at_s: NotRequired[float]        # a timed fault: seconds after the attempt's start
    by: NotRequired[str]            # "supervisor" for a signal delivered to a command


# ---------------------------------------------------------------- the trainer


class TrainerReadyFields(TypedDict):
    device: str
    precision: str
    reason: str                     # why that precision
    batch_size: int
    accumulation: int
    compile: bool
    # how (engine.train.compiling): 'off', 'model' (whole) or 'regional' (each of the workload's
    # repeated blocks, compiled_blocks of them)
    compiled: NotRequired[str]
    compiled_blocks: NotRequired[int]
    grad_checkpointing: bool
    threads: int
    total_steps: int
    total_samples: int
    resumed_from: dict[str, Any] | None
    parameters: int
    trainable: int
    pid: int
    torch: str
    world_size: int
    nodes: NotRequired[int]          # machines in the world (torchrun's rendezvous)
    node_rank: NotRequired[int]      # this machine's place in it
    rank: NotRequired[int]           # the speaker's global rank (0: it writes the checkpoints)
    global_batch: int
    optimizer: str
    peak_tflops: float | None
    startup_s: NotRequired[float]   # the probe's worker
    # its set-up's seconds by phase (launch, device, data, model, resume, setup) and what a
    # spare did ahead (`ahead`): engine.train.startup
    startup: NotRequired[dict[str, Any]]


class NodesChangedFields(TypedDict):
    """A node's workers restarted in another world: a machine lost, or one come back
    (engine.run.launchers.node)."""

    nodes_before: int
    nodes: int                      # machines in the world now
    world_size: int                 # processes in it
    resumed_step: int               # the checkpoint's step it resumed from
    steps_lost: int                 # steps trained past it before the restart, to train again


class HealthFields(TypedDict):
    """A run going bad and going on: a loss spike, a gradient explosion, divergence
    (engine.run.training_health), with its evidence and what was done."""

    kind: str                       # loss-spike | grad-explosion | divergence | plateau
    step: int                       # the report's (its window's last step)
    began: int                      # the first step it may have begun at: a rewind goes before it
    value: float                    # the loss or gradient norm (the window's largest), the eval loss
    mean: float | None              # the window's it was judged against
    std: float | None
    z: float | None                 # standard deviations above the mean (None: a flat window)
    rule: str                       # the rule it broke, in words with its numbers
    action: str                     # warn | stop | rewind | lower-lr
    sentence: str                   # for a person
    short: str                      # 'loss spike at step 1,204 (z 9.1)': a panel's line


class RewindFields(TypedDict):
    """A fallback's `rewind`: a health finding answered by going back (engine.run.rewind)."""

    finding: str                    # the health event's kind
    step: int                       # the finding's
    began: int                      # where it may have begun
    to_step: int | None             # the checkpoint's step it resumes from (None: the start)
    checkpoint: str | None
    skip_batches: int               # batches skipped after it (0: none, or the command has no way)
    skips: bool                     # the skip is done (a command without {skip_batches} cannot)
    lr_scale: float                 # the learning rate's factor from here on (lower-lr halves it)
    set_aside: list[str]            # the checkpoints after it, renamed *.rewound
    steps_lost: int                 # steps trained past it, trained again


class HeartbeatFields(TypedDict):
    """A rank alive inside a long accumulation group, or a rank other than 0 at a report."""

    rank: int
    step: int
    micro_batches: NotRequired[int]
    of: NotRequired[int]
    pid: NotRequired[int]


class ParityFields(TypedDict):
    """The device against the CPU on one micro-batch (engine.train.parity)."""

    verdict: str
    ok: bool
    device: str
    precision: str
    loss: float
    cpu_loss: float
    loss_rel: float | None
    worst_grad: dict[str, Any]      # name, rel
    worst_update: dict[str, Any]
    tolerance: dict[str, Any]
    batch: int
    seconds: float
    problems: list[str]
    message: str


class ThreadsFields(TypedDict):
    """The trainer changed torch's intra-op threads to fit the cores other processes leave
    (engine.train.threads): lowered while they take them, raised when they are free again."""

    threads: int                    # now
    was: int
    ceiling: int                    # the preset's threads (or torch's default): never above
    step: int                       # the steps done when it changed
    cores: int                      # the cores the trainer may run on
    others: float                   # cores' worth of CPU other processes used over the last reading
    others_need: float              # what they would use unsqueezed by the run's threads (estimated)
    reason: str                     # contention | free


class StepFields(TypedDict):
    """One report window of training (the trainer's, or a command's from its output)."""

    step: int
    total: int | None
    samples_seen: int | None        # None: a command whose samples per step are not known
    epoch: float | None
    loss: float | None
    lr: float | None
    samples_per_s: float | None
    steps_per_s: float | None
    window_s: float | None
    eta_s: float | None
    total_samples: NotRequired[int]
    smoothed_samples_per_s: NotRequired[float | None]
    best_samples_per_s: NotRequired[float | None]
    device_memory: NotRequired[dict[str, Any]]
    gflop_s: NotRequired[float]
    mfu: NotRequired[float]
    partial: NotRequired[bool]      # cut short by a checkpoint or the end: no rate to show
    source: NotRequired[str | None]  # a command's: where its steps were read
    metrics: NotRequired[dict[str, float]]
    # A command's (engine.command.tracker): what a step is and where that was learnt, where
    # its total came from, the step its window's rate counts from, the step its attempt began
    # at where that is earlier (a burst of lines read with the first), and tokens where known.
    units: NotRequired[dict[str, Any]]
    total_source: NotRequired[str | None]
    from_step: NotRequired[int]
    begun_step: NotRequired[int]
    tokens_seen: NotRequired[int]
    tokens_per_s: NotRequired[float]
    compile_s: NotRequired[float]   # the first window's: what compiling its first step cost
    first_step_at: NotRequired[float]   # the first window's: when its first step ended (time.time())
    epoch_base: NotRequired[int]    # a command's printed epochs, counted from 0 or 1
    # The instruments (the trainer's engine.train.window; a command's what it printed or
    # reported): the gradient's total L2 norm before clipping (unscaled under fp16), the mean
    # of the window's steps (a command's: the last seen) and the largest; the largest step
    # loss (`loss` is the window's mean); steps whose loss or norm was NaN/Inf, where any.
    grad_norm: NotRequired[float]
    grad_norm_max: NotRequired[float]
    loss_max: NotRequired[float]
    nonfinite: NotRequired[int]


class EvalStartedFields(TypedDict):
    step: int


class EvalFields(TypedDict):
    step: int | None
    metrics: dict[str, float]
    eval_s: NotRequired[float]
    source: NotRequired[str | None]  # a command's: "report", or how its output said it


class MiningStartedFields(TypedDict):
    epoch: int
    negatives: int


class MiningFields(TypedDict):
    """Hard negatives mined for an epoch (the two-tower workload), or mode "none"."""

    epoch: int
    mode: str
    negatives: NotRequired[int]
    queries: NotRequired[int]
    bank: NotRequired[int]
    index: NotRequired[str]
    exact: NotRequired[bool]
    encode_s: NotRequired[float]
    search_s: NotRequired[float]
    recall_vs_exact: NotRequired[float | None]
    recall_sample: NotRequired[int]
    recall_s: NotRequired[float]
    positive_in_top: NotRequired[float]
    filled: NotRequired[int]
    faiss_threads: NotRequired[int]
    torch_threads: NotRequired[int]
    index_build_s: NotRequired[float]
    mining_s: NotRequired[float]


class CheckpointFields(TypedDict):
    path: str                       # relative to the run (the trainer's) or absolute (a command's)
    step: int | None
    samples_seen: NotRequired[int]
    save_s: NotRequired[float]      # the training loop's stall: the check, the copy, any wait
    write_s: NotRequired[float]     # the background write's own time, alongside training
    wait_s: NotRequired[float]      # ... of save_s, waiting for the write before it
    source: NotRequired[str]        # a command's: "report" or "file"
    step_source: NotRequired[str | None]  # a file's: "name" (its name says) or "reached" (the step read by its write)
    samples: NotRequired[int]       # cockpit.report.checkpoint's samples=
    # a file's: rewritten faster than it was still for a look, some of its writes before this
    # one were never told; its count of checkpoints is a lower bound
    writes_unseen: NotRequired[bool]


class CheckpointIntervalFields(TypedDict):
    """checkpoint_every_steps = 'auto' chose (engine.record.interval)."""
    steps: int
    seconds: float
    cost_s: float                   # the save stall it was chosen for
    mtbf_s: float                   # the mean time between crashes it was chosen for
    crashes: int
    observed_s: float
    reason: str


class ConfigErrorFields(TypedDict):
    message: str


class ExceptionFields(TypedDict):
    error: str                      # the exception's type
    message: str
    where: str | None               # file:line
    step: int | None
    rank: int
    traceback: str


class NumericalFields(TypedDict):
    step: int | None
    message: str
    rank: NotRequired[int]


# ---------------------------------------------------------------- the probe's worker


class WorkerStartedFields(TypedDict):
    imports_s: float


class ProbeWarmupFields(TypedDict):
    step: int
    seconds: float
    micro_batches: int
    steps: int
    samples: int


class ProbeTimingFields(ProbeWarmupFields):
    samples_per_s: float | None     # the figure so far


class BatchTrialFields(TypedDict):
    batch: int
    phase: str                      # skipped, start, end
    num_samples: NotRequired[int]
    first_step_s: NotRequired[float]
    step_s: NotRequired[float]
    samples_per_s: NotRequired[float]
    # torch's intra-op threads when it ended: fewer than the preset's where other processes took
    # the cores (engine.train.threads)
    threads: NotRequired[int]
    peak: NotRequired[dict[str, float]]
    device_memory: NotRequired[dict[str, Any]]


class ProbeDoneFields(TypedDict):
    steps: int
    peak: dict[str, float]
    device_memory: dict[str, Any]


# ---------------------------------------------------------------- a command's own script


class ProgressFields(TypedDict):
    """cockpit.report.step, written by the user's script; the supervisor makes step events of it."""

    step: int
    total: int | None
    loss: float | None
    samples: int | None
    metrics: dict[str, float]


# Every event type, and its fields. tools/event_overloads.py writes EventWriter.emit's
# overloads and Emit's from this, in this order.
EVENT_FIELDS: dict[str, type] = {
    "run_started": RunStartedFields,
    "run_resumed": RunResumedFields,
    "run_finished": RunFinishedFields,
    "run_failed": RunFailedFields,
    "supervisor_lost": SupervisorLostFields,
    "run_interrupted": RunInterruptedFields,
    "attempt_started": AttemptStartedFields,
    "attempt_process": AttemptProcessFields,
    "attempt_ended": AttemptEndedFields,
    "crash": CrashFields,
    "fallback": FallbackFields,
    "stop_requested": StopRequestedFields,
    "slurm_job": SlurmJobFields,
    "memory": MemoryFields,
    "warning": WarningFields,
    "fault_injected": FaultInjectedFields,
    "trainer_ready": TrainerReadyFields,
    "heartbeat": HeartbeatFields,
    "health": HealthFields,
    "nodes_changed": NodesChangedFields,
    "parity": ParityFields,
    "threads": ThreadsFields,
    "step": StepFields,
    "eval_started": EvalStartedFields,
    "eval": EvalFields,
    "mining_started": MiningStartedFields,
    "mining": MiningFields,
    "checkpoint": CheckpointFields,
    "checkpoint_interval": CheckpointIntervalFields,
    "config_error": ConfigErrorFields,
    "exception": ExceptionFields,
    "numerical": NumericalFields,
    "worker_started": WorkerStartedFields,
    "probe_warmup": ProbeWarmupFields,
    "probe_timing": ProbeTimingFields,
    "batch_trial": BatchTrialFields,
    "probe_done": ProbeDoneFields,
    "progress": ProgressFields,
}
