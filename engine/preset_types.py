"""What a preset is: the frozen dataclasses a device preset and a workload preset are read into,
each with the checks that hold whatever the values came from (a file, --set, a run's run.toml).

The ground floor: it imports nothing above it, so the floors below the presets -- the
monitor resolving a device, a workload checking its batch, a command filling in its argv --
name a DevicePreset without importing engine.presets, which reads and writes the TOML (and
imports the workloads and the command to check their tables).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from engine.schema import FieldError, setting
from engine.vocabulary import ACTIONS, CRASH_KINDS, ENV_FIXES, parse as parse_fault

Device = Literal["auto", "cpu", "mps", "cuda"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
CachePolicy = Literal["never", "before-mining", "every-epoch"]
MAX_THREADS = 1024        # more than any machine's cores; torch segfaults at 100000
MAX_SEED = 2**64 - 1      # torch.manual_seed takes 64 bits
# A micro-batch, or micro-batches a step, past what a 32-bit count holds fits no device and no
# data set: a typo, refused where it is written (presets list and show call the file broken)
# rather than by whatever workload or script would first try to use it.
MAX_BATCH = 2**31 - 1
SLURM_WARNING_S = 120     # the warning signal's lead on the time limit (Lightning's and submitit's 90-120)
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}")   # sbatch --time: minutes, h:m:s, d-h[:m[:s]]


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmSettings:
    """[slurm]: what `cockpit submit` asks SLURM for; its flags (--time, --partition, ...)
    override these."""

    time: str = setting("", "the job's time limit (sbatch --time: minutes, h:m:s, d-h:m:s); "
                            "empty: the partition's default", aka=("time_limit", "walltime"))
    partition: str = setting("", "sbatch --partition; empty: the cluster's default",
                             aka=("queue",))
    account: str = setting("", "sbatch --account; empty: your default account")
    gpus_per_node: int | Literal["auto"] = setting(
        "auto", "sbatch --gpus-per-node; 'auto': nproc_per_node on cuda, else none", min=0,
        aka=("gres",))
    warning_s: int = setting(SLURM_WARNING_S, "seconds before the time limit that SLURM warns the "
                                              "job (SIGUSR1): it checkpoints and is requeued", min=1,
                             aka=("warning",))

    def __post_init__(self):
        problem = self.time_problem(self.time)
        if problem:
            raise FieldError("time", f"got {self.time!r}, {problem}")

    @staticmethod
    def time_problem(text: str) -> str | None:
        """What is wrong with a time limit for sbatch --time ('' is the partition's default), or None."""
        if not text or _SLURM_TIME.fullmatch(text):
            return None
        return "expected a SLURM time limit: minutes, h:m:s or d-h:m:s"


HealthAction = Literal["warn", "stop", "rewind", "lower-lr"]
REWINDS = ("rewind", "lower-lr")   # the health actions that go back to a checkpoint


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthSettings:
    """[health]: what a run that goes bad and keeps going looks like (engine.run.training_health).
    The defaults are the field's: OLMo-core's z-score of 6 over the last 128 steps, llm-foundry's
    2x the window's mean, Megatron's 10x for a gradient norm."""

    window: int = setting(128, "reports (step events) the mean and spread are taken over", min=8)
    min_reports: int = setting(16, "reports seen before anything is judged", min=2)
    loss_z: float = setting(6.0, "a loss spike: this many standard deviations above the window's "
                                 "mean ...", above=0.0)
    loss_ratio: float = setting(2.0, "... and this many times the window's mean", above=1.0)
    grad_z: float = setting(6.0, "a gradient-norm explosion: this many standard deviations above "
                                 "the window's mean ...", above=0.0)
    grad_ratio: float = setting(10.0, "... and this many times the window's mean", above=1.0)
    diverge_evals: int = setting(3, "divergence: the eval loss rose this many evals in a row; 0 = off",
                                 min=0)
    plateau_evals: int = setting(10, "a plateau (a warning only): the eval loss has not beaten its "
                                     "best for this many evals in a row; 0 = off", min=0)
    on_spike: HealthAction = setting("rewind", "a loss spike: 'warn' (a health event and an alert), "
                                               "'stop' (stop the run gracefully), 'rewind' (to a "
                                               "checkpoint before it, skipping the batches after "
                                               "it) or 'lower-lr' (rewind, and halve the learning "
                                               "rate from there)")
    on_explosion: HealthAction = setting("warn", "a gradient-norm explosion: warn, stop, rewind or "
                                                 "lower-lr (clipping often absorbs one: warn)")
    on_divergence: HealthAction = setting("warn", "divergence: warn, stop, rewind or lower-lr "
                                                  "(an eval loss that climbs may be overfitting: "
                                                  "warn)")
    rewind_steps: int = setting(100, "a rewind goes to the newest checkpoint at least this many "
                                     "steps before the spike began (PaLM: about 100); the "
                                     "trainer keeps one that old whatever keep_checkpoints prunes",
                                min=0)
    skip_batches: int = setting(200, "batches skipped after a rewind, past the ones that spiked "
                                     "(PaLM skipped 200 to 500); a command skips through "
                                     "{skip_batches} or {data_offset} in its argv", min=0)
    max_rewinds: int = setting(3, "rewinds within rewind_window steps before the run stops: "
                                  "a spike that keeps coming back is not the data's", min=1)
    rewind_window: int = setting(1000, "the steps max_rewinds counts over", min=1)

    def action(self, kind: str) -> str:
        """What is done about a finding of this kind (a plateau only warns)."""
        return {"loss-spike": self.on_spike, "grad-explosion": self.on_explosion,
                "divergence": self.on_divergence}.get(kind, "warn")

    @property
    def rewinds(self) -> bool:
        """Some finding is answered by going back to a checkpoint."""
        return any(a in REWINDS for a in (self.on_spike, self.on_explosion, self.on_divergence))


@dataclass(frozen=True, kw_only=True, slots=True)
class DevicePreset:
    """How to run: the device and everything that decides memory and speed on it."""

    description: str = setting("", "one line shown in lists")
    device: Device = setting("auto", "auto picks CUDA, then MPS, then CPU", aka=("accelerator",))
    batch_size: int = setting(32, "micro-batch: samples per forward/backward", min=1, max=MAX_BATCH,
                             aka=("bs", "micro_batch_size", "per_device_train_batch_size",
                                  "train_batch_size", "batch"))
    accumulation: int = setting(1, "micro-batches per optimizer step", min=1, max=MAX_BATCH,
                               aka=("grad_accum", "grad_accumulation", "gradient_accumulation",
                                    "gradient_accumulation_steps", "accumulate_grad_batches",
                                    "accum", "accum_steps"))
    precision: Precision = setting("auto", "auto: bf16 on CUDA when supported, else fp32",
                                  aka=("dtype", "mixed_precision", "amp", "bf16", "fp16"))
    grad_checkpointing: bool = setting(False, "recompute activations in backward to save memory",
                                      aka=("gradient_checkpointing", "activation_checkpointing"))
    compile: bool = setting(False, "torch.compile the model (refused on MPS)", aka=("torch_compile",))
    compile_regions: bool = setting(True, "with compile: each of the workload's repeated blocks "
                                          "compiled once for all (a faster compile), not the whole "
                                          "model (fusion across blocks); the whole model under "
                                          "grad_checkpointing", aka=("regional_compile",))
    parity_check: bool = setting(False, "before training, check the device's loss, gradients and "
                                        "optimizer step against the CPU in fp32 (`cockpit check`); "
                                        "wrong numbers are a crash of kind numerical-parity")
    threads: int = setting(0, "CPU threads for torch, the most (see adapt_threads); 0 keeps "
                                "torch's default", min=0,
                          aka=("num_threads", "torch_threads"))
    adapt_threads: bool = setting(True, "on the CPU, lower torch's threads while other processes "
                                        "take the cores, and raise them again (to `threads` at "
                                        "most) when the cores are free: threads beyond the free "
                                        "cores wait on each other (engine.train.threads)")
    nproc_per_node: int = setting(1, "processes on this machine; above 1 the attempt runs under "
                                     "torchrun with DDP (one per GPU on CUDA, gloo on CPU)", min=1,
                                 aka=("devices", "gpus", "num_processes", "world_size"))
    nnodes: int | str = setting(1, "machines in the run (torchrun --nnodes): N, or 'MIN:MAX' to go "
                                   "on at fewer after a node is lost and grow back when it returns; "
                                   "above 1 needs rdzv_endpoint and `cockpit --node` on each machine",
                                min=1, aka=("num_nodes",))
    rdzv_endpoint: str = setting("", "host:port of the rendezvous for a multi-machine run (in a SLURM "
                                     "job: the job's first node when empty)")
    max_restarts: int = setting(3, "times a node re-forms the run after a node is lost (nnodes "
                                   "'MIN:MAX'); the supervisor counts them, not torchrun", min=0)
    env: Mapping[str, str] = setting({}, "environment for the trainer process, set before torch loads")
    empty_cache: CachePolicy = setting("never", "when to empty the device cache")
    fallback: tuple[str, ...] = setting([], "device presets to fall back to, in order")
    rules: Mapping[str, str] = setting({}, "crash kind -> action (next, retry, retry-progress, "
                                           "retry-env, fp32, halve-batch, stop); unnamed kinds use "
                                           "the defaults")
    max_attempts: int = setting(5, "attempts a run may make, the first included", min=1,
                                aka=("retries", "max_retries"))
    hang_timeout_s: float = setting(300.0, "no progress for this long (or 10x the slowest "
                                           "interval seen, if longer) is a hang", above=0.0)
    on_slowdown: Literal["warn", "fallback"] = setting(
        "warn", "throughput far below its best under memory pressure: 'warn' (a warning with "
                "advice) or 'fallback' (also checkpoint and resume on the next ladder preset)")
    inject: tuple[str, ...] = setting([], "faults to inject, KIND@STEP or KIND@SECONDSs (e.g. "
                                          "'native-crash@117', 'hang@30s'); each fires once per "
                                          "run, with + in every attempt")
    health: HealthSettings = setting(HealthSettings(), "what a run going bad looks like (loss "
                                                         "spikes, gradient explosions, divergence) "
                                                         "and what is done about it")
    slurm: SlurmSettings = setting(SlurmSettings(), "the job `cockpit submit` asks SLURM for "
                                                    "([slurm]); its flags override each key")

    def __post_init__(self):
        if self.threads > MAX_THREADS:
            raise FieldError("threads", f"got {self.threads}, expected 0 (torch's default) to "
                                        f"{MAX_THREADS}: threads beyond the cores only slow torch "
                                        "down, and at counts like this its thread pool crashes")
        if self.device == "mps" and self.compile:
            raise FieldError("compile", "true is refused on MPS: torch.compile's Metal backend is "
                                        "immature and segfaults; expected false")
        if self.device == "mps" and self.world_size > 1:
            raise FieldError("nproc_per_node", f"{self.nproc_per_node} is refused on MPS: torch."
                             "distributed has no MPS backend; expected 1 (or device 'cuda'/'cpu')")
        if isinstance(self.nnodes, str):
            found = re.fullmatch(r"(\d+):(\d+)", self.nnodes.strip())
            if found is None or not 1 <= int(found[1]) <= int(found[2]):
                raise FieldError("nnodes", f"got {self.nnodes!r}, expected a positive integer or "
                                           "'MIN:MAX' with 1 <= MIN <= MAX (e.g. '1:2')")
        # empty: a SLURM job's first node (engine.run.slurm); elsewhere `--node` asks for it
        if self.rdzv_endpoint and not re.fullmatch(r"[^\s:]+:\d+", self.rdzv_endpoint):
            raise FieldError("rdzv_endpoint", f"got {self.rdzv_endpoint!r}; expected the rendezvous "
                                              "as 'host:port' (e.g. 'node1:29400')")
        if self.device == "mps" and self.precision == "fp16":
            raise FieldError("precision", "'fp16' needs a GradScaler, which MPS lacks; expected "
                                          "'fp32' or 'bf16'")
        for name in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise FieldError(f"env.{name}", "is not an environment variable name")
        for kind, action in self.rules.items():
            if kind not in CRASH_KINDS:
                raise FieldError(f"rules.{kind}", "is not a crash kind; expected one of "
                                 + ", ".join(CRASH_KINDS))
            if action not in ACTIONS:
                raise FieldError(f"rules.{kind}", f"got {action!r}, expected one of "
                                 + ", ".join(repr(a.value) for a in ACTIONS))
            if kind == "user-code" and action != "stop":
                raise FieldError("rules.user-code", f"got {action!r}, expected 'stop': falling "
                                                    "back does not fix a bug in the workload")
            if action == "retry-env" and kind not in ENV_FIXES:
                raise FieldError(f"rules.{kind}", "'retry-env' has an environment fix only for "
                                 + ", ".join(ENV_FIXES) + "; expected another action")
        if self.on_slowdown == "fallback" and not self.fallback:
            raise FieldError("on_slowdown", "'fallback' needs a fallback ladder (fallback = "
                                            "[...]) to fall back to; expected 'warn'")
        for spec in self.inject:
            try:
                parse_fault(spec)
            except ValueError as e:
                raise FieldError("inject", str(e)) from None

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step on one process (times the world size under torchrun)."""
        return self.batch_size * self.accumulation

    @property
    def nodes(self) -> tuple[int, int]:
        """(fewest, most) machines: nnodes N is (N, N), 'MIN:MAX' elastic."""
        if isinstance(self.nnodes, int):
            return self.nnodes, self.nnodes
        low, high = self.nnodes.strip().split(":")
        return int(low), int(high)

    @property
    def elastic(self) -> bool:
        """The run goes on at fewer machines after one is lost."""
        low, high = self.nodes
        return low < high

    @property
    def world_size(self) -> int:
        """Processes in the run at its largest."""
        return self.nproc_per_node * self.nodes[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSettings:
    """The schedule of a run: how long, how fast it learns, when it reports and saves."""

    epochs: float = setting(1.0, "passes over the workload's training samples", above=0.0,
                            aka=("num_train_epochs", "num_epochs", "max_epochs", "n_epochs"))
    max_steps: int = setting(0, "stop after this many optimizer steps of the first attempt's "
                                "global batch (a budget of samples, kept across fallbacks); "
                                "0 = no limit", min=0,
                            aka=("max_iters", "steps", "num_steps", "training_steps"))
    optimizer: Literal["adamw", "sgd"] = setting("adamw", "adamw (betas, eps; fused on CUDA) or sgd "
                                                          "(with momentum)", aka=("optim",))
    lr: float = setting(1e-3, "peak learning rate: reached after warmup_steps, then kept (schedule "
                              "'constant') or decayed to min_lr", min=0.0,
                      aka=("learning_rate", "max_lr"))
    schedule: Literal["constant", "cosine", "linear"] = setting(
        "constant", "the learning rate after warmup, over the samples of the run: constant, or a "
                    "cosine or linear decay from lr to min_lr",
        aka=("lr_scheduler", "lr_scheduler_type", "scheduler", "lr_schedule"))
    warmup_steps: int = setting(0, "linear warmup from 0 to lr over this many optimizer steps of the "
                                   "first attempt's global batch (samples: kept across fallbacks)", min=0,
                                aka=("warmup", "warmup_iters"))
    min_lr: float = setting(0.0, "where cosine and linear decay end, at the last sample", min=0.0,
                            aka=("min_learning_rate",))
    weight_decay: float = setting(0.0, "weight decay (decoupled in AdamW)", min=0.0, aka=("wd",))
    weight_decay_params: Literal["matrices", "all"] = setting(
        "matrices", "which parameters weight decay reaches: 'matrices' (2-D and up; norms, biases "
                    "and embeddings excluded) or 'all'")
    beta1: float = setting(0.9, "AdamW's beta1: decay of the gradient's running mean", min=0.0,
                           aka=("adam_beta1",))
    beta2: float = setting(0.999, "AdamW's beta2: decay of the squared gradient's running mean "
                                  "(0.95 for LLMs, as nanoGPT)", min=0.0, aka=("adam_beta2",))
    eps: float = setting(1e-8, "AdamW's epsilon", above=0.0, aka=("adam_epsilon", "epsilon"))
    momentum: float = setting(0.9, "SGD's momentum; 0 = plain SGD", min=0.0)
    grad_clip: float = setting(0.0, "clip the gradient norm to this; 0 = off", min=0.0,
                               aka=("max_grad_norm", "gradient_clip_val", "clip_grad_norm"))
    seed: int = setting(0, "seeds the model, the data order and every RNG", min=0, max=MAX_SEED,
                        aka=("random_seed",))
    report_every_s: float = setting(0.5, "seconds per reporting window (one step event each)",
                                    above=0.0)
    eval_every_steps: int = setting(0, "evaluate every N optimizer steps; 0 = at the end only",
                                    min=0, aka=("eval_steps", "eval_interval"))
    checkpoint_every_steps: int | Literal["auto"] = setting(
        0, "checkpoint every N optimizer steps; 0 = off; 'auto': the interval that loses least "
           "for the measured save time and crash rate (Young/Daly)", min=0,
        aka=("save_steps", "checkpoint_interval"))
    checkpoint_every_minutes: float = setting(5.0, "checkpoint every M minutes; 0 = off", min=0.0)
    keep_checkpoints: int = setting(3, "how many recent checkpoints to keep", min=1,
                                    aka=("save_total_limit",))

    def __post_init__(self):
        for name in ("beta1", "beta2", "momentum"):
            if getattr(self, name) >= 1:
                raise FieldError(name, f"got {getattr(self, name)!r}, expected a number from 0 to "
                                       "below 1 (at 1 nothing is ever forgotten)")
        if self.min_lr > self.lr:
            raise FieldError("min_lr", f"got {self.min_lr!r}, above lr {self.lr!r}; expected at most "
                                       "lr (the schedule decays from lr to min_lr)")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadPreset:
    """What to train: a workload, its schedule and its own parameters; or the user's own
    command (workload COMMAND, params an engine.command.CommandSpec, train unused)."""

    workload: str
    description: str = ""
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)
    params: Any = None  # the workload's own frozen Params dataclass

    @property
    def is_command(self) -> bool:
        return self.workload == COMMAND


# The workload name of a command preset (`command = [...]` instead of `workload = ...`).
COMMAND = "command"
