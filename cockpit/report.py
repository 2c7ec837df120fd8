"""Report progress from inside your training script, exactly, when cockpit runs it.

cockpit reads a command's progress from its output (tqdm bars, "step N loss X" lines) with no
change to the script. When you want it exact, add a few calls; outside cockpit they do nothing,
so the script runs as before anywhere:

    from cockpit import report

    for step in range(start + 1, steps + 1):          # step: optimizer steps done
        loss = train_step(...)
        report.reached(step, samples=step * batch_size) # every step: a store into memory
        if step % 10 == 0:                              # your logging interval
            report.step(step, total=steps, loss=loss.item(), samples=step * batch_size)
        if step % 100 == 0:
            path = save_checkpoint(...)
            report.checkpoint(path, step)               # cockpit resumes from the newest
    report.eval(val_loss=evaluate(model))               # at the last step reported

- `report.step(step, total=None, loss=None, samples=None, **metrics)`: the optimizer step,
  the total steps, the loss, the samples seen so far (cumulative: cockpit measures throughput
  from it) and any other scalars (grad_norm=...); `lr=` and `epoch=` are shown as the
  learning rate and the (fractional) epoch, and `grad_norm=` (the gradient's total norm
  before clipping) is the step event's `grad_norm`, which the training-health detectors read.
- `report.eval(**metrics)`: held-out metrics, recorded at the last step reported.
- `report.checkpoint(path, step, samples=None, save_s=None)`: a checkpoint the script has
  written; cockpit resumes from the newest one, with your command's `resume` arguments, after a
  crash or a fallback. With `samples`, the resumed attempt's `report.resumed_from()` is (step,
  samples); with `save_s`, the seconds training waited for the save, cockpit's checkpoint
  advice weighs the save at its own time (without it, at what the steps around it took).
- `report.reached(step, samples=None)`: every optimizer step, where a crash is counted from.
  It costs one store into memory (no event, no system call, no sync): with it, a crash between
  two reports is told at the step where training was, and the steps it loses are exact.
  `report.step` says as much at its own steps.
- `report.active`: True when running under cockpit (on rank 0 of a multi-process job: RANK,
  SLURM_PROCID, or LOCAL_RANK and NODE_RANK say which).

Values are plain Python numbers. Call at your logging interval with numbers you already have:
a tensor's `.item()` waits for the GPU to finish (a host-device sync), so calling it every step
just to report slows training. A 0-d tensor is accepted, and syncs the same way. Bools,
strings and other non-numbers raise TypeError. A NaN or infinite loss is reported as it is:
cockpit treats it as a numerical crash and resumes from a checkpoint written before it.

Reporting never stops your training because of cockpit: if the run's events file cannot be
written, reporting goes quiet. Only a bad argument raises, and it does so outside cockpit too,
so a mistake shows when you run the script on its own.

cockpit sets the environment this module reads: COCKPIT_EVENTS (the run's events.jsonl),
COCKPIT_ATTEMPT, COCKPIT_DEVICE, COCKPIT_INJECT (faults to rehearse: at `report.step` the
due ones fail the way the real thing does, so the fallback ladder can be tried on your
command: a step fault at its step, a timed one at the first call after its time) and
COCKPIT_ATTEMPT_STARTED (when the attempt started, what a timed fault counts from) and
COCKPIT_REACHED (the file report.reached maps: engine.record.reached, stdlib too).
Importing this module is cheap: stdlib only, no torch.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import signal
import sys
import time

__all__ = ["step", "reached", "eval", "checkpoint", "active", "resumed_from"]

SCHEMA_VERSION = 1  # engine.record.events.SCHEMA_VERSION; not imported, to keep this module light

# The kinds raised from inside the process (engine.vocabulary.IN_SCRIPT_KINDS); hang and slow
# are delivered by the supervisor with real signals, from outside, and so is native-crash to
# a script that never reports. Inside, native-crash aborts as Metal does: a handler a native
# library installed for SIGABRT cannot stop it, as it can stop a SIGABRT sent from outside.
_IN_PROCESS = ("native-crash", "oom", "backend", "openmp", "nan", "user-code", "spike")

active: bool = False
_path: str | None = None
_attempt = 0
_device = "cpu"
_pending: list[tuple[str, str, int | None, float | None]] = []  # (spec, kind, step, seconds) not fired
_started = 0.0           # when the attempt started (time.time()): timed faults count from it
_fd: int | None = None
_quiet = False           # an OSError writing the events file: stop trying
_poison_loss = False     # a fired 'nan' fault: the reported loss is NaN from then on
_spiking = False         # a fired 'spike' fault: this step's reported loss is fifty times its own
_last_step: int | None = None
_resumed: tuple[int, int] | None = None  # read once, with the rest of the environment
_publisher = None        # engine.record.reached.Publisher, made at the first step told


def _reset() -> None:
    """(Re)read the environment: at import, and in tests after changing it."""
    global active, _path, _attempt, _device, _pending, _fd, _quiet, _poison_loss, _last_step
    global _resumed, _started, _publisher
    if _fd is not None:
        try:
            os.close(_fd)
        except OSError:
            pass
    if _publisher is not None:
        _publisher.close()
        _publisher = None
    _fd, _quiet, _poison_loss, _last_step = None, False, False, None
    _path = os.environ.get("COCKPIT_EVENTS") or None
    active = _path is not None and _rank_zero()
    try:
        _attempt = int(os.environ.get("COCKPIT_ATTEMPT", "0"))
    except ValueError:
        _attempt = 0
    _device = (os.environ.get("COCKPIT_DEVICE") or "cpu").strip().lower()
    _pending = _parse_inject(os.environ.get("COCKPIT_INJECT", "")) if active else []
    try:
        _started = float(os.environ["COCKPIT_ATTEMPT_STARTED"])
    except (KeyError, ValueError):
        _started = time.time()  # run by hand: the attempt is this process
    _resumed = _read_resumed()


def _rank_zero() -> bool:
    """Every process of a multi-process job inherits the environment: only the first speaks
    for the run. torchrun sets RANK; SLURM's srun SLURM_PROCID; Lightning's own launcher
    (devices=N from a plain `python train.py`) only LOCAL_RANK and NODE_RANK."""
    for names in (("RANK",), ("SLURM_PROCID",), ("LOCAL_RANK", "NODE_RANK")):
        values = [os.environ.get(n, "").strip() for n in names]
        if any(values):
            return all(v in ("", "0") for v in values)
    return True


def resumed_from() -> tuple[int, int] | None:
    """(step, samples seen) of the checkpoint this attempt resumed from, when cockpit knows
    the samples (a checkpoint reported with them): a count of samples continues from there,
    even when the fallback changed the batch."""
    return _resumed


def _read_resumed() -> tuple[int, int] | None:
    try:
        return (int(os.environ["COCKPIT_RESUME_STEP"]), int(os.environ["COCKPIT_RESUME_SAMPLES"]))
    except (KeyError, ValueError):
        return None


def _parse_inject(text: str) -> list[tuple[str, str, int | None, float | None]]:
    """The in-process faults of 'kind@step[+],kind@30s[+],...', as engine.vocabulary.parse reads
    them (parsed here by hand: importing this module must not import engine)."""
    pending: list[tuple[str, str, int | None, float | None]] = []
    for spec in (s.strip() for s in text.split(",")):
        kind, at, when = spec.rstrip("+").partition("@")
        # '+' (every attempt) is the supervisor's business: it decides what each attempt gets.
        # A mangled spec is skipped: it must not stop the user's training.
        if kind not in _IN_PROCESS or not at:
            continue
        if when.isdigit():
            pending.append((spec, kind, int(when), None))
        elif when.endswith("s") and when[:-1].replace(".", "", 1).isdigit():
            pending.append((spec, kind, None, float(when[:-1])))
    return pending


# ---------------------------------------------------------------- the API


def step(step, total=None, loss=None, samples=None, **metrics) -> None:
    """The optimizer step `step` (of `total`), its loss, the samples seen so far and any
    other scalar metrics. Call at the script's logging interval. TypeError, naming the
    argument, for a bool or a non-number; a NaN or infinite loss is reported as it is."""
    global _last_step, _spiking
    step = _integer("step", step)
    total = None if total is None else _integer("total", total)
    loss = None if loss is None else _real("loss", loss)
    samples = None if samples is None else _integer("samples", samples)
    values = {name: _real(name, v) for name, v in metrics.items()}
    if not active:
        return
    _publish(step, samples)  # reached, whatever a fault due now does
    if _pending:
        _fire(step)
    if _poison_loss:
        loss = math.nan
    elif _spiking and loss is not None:   # the rehearsal of a loss spike: the detectors see it
        loss *= 50.0
    _spiking = False
    _last_step = step
    _emit("progress", step=step, total=total, loss=loss, samples=samples, metrics=values)


def reached(step, samples=None) -> None:
    """Optimizer step `step` is done (and `samples` seen): call it every step, it costs a store
    into memory. A crash is then told at this step, not at the last one reported. TypeError,
    naming the argument, for a bool or a non-number."""
    step = _integer("step", step)
    samples = None if samples is None else _integer("samples", samples)
    if active:
        _publish(step, samples)


def eval(**metrics) -> None:  # noqa: A001 - the API's name, read as report.eval
    """Held-out metrics (val_loss=..., accuracy=...), at the last step reported."""
    values = {name: _real(name, v) for name, v in metrics.items()}
    if not active:
        return
    _emit("eval", step=_last_step, metrics=values, source="report")


def checkpoint(path, step, samples=None, save_s=None) -> None:
    """A checkpoint the script has written, at optimizer step `step`, after `samples` samples
    (optional: given, a resume from it continues the count, see resumed_from), in `save_s`
    seconds of training's time (optional)."""
    try:
        path = os.fsdecode(os.path.abspath(os.fspath(path)))
    except TypeError:
        raise TypeError(f"report: path must be a str or os.PathLike, "
                        f"got {type(path).__name__}") from None
    step = _integer("step", step)
    samples = None if samples is None else _integer("samples", samples)
    save_s = None if save_s is None else _real("save_s", save_s)
    if not active:
        return
    _emit("checkpoint", step=step, path=path, source="report",
          **({"samples": samples} if samples is not None else {}),
          **({"save_s": round(save_s, 4)} if save_s is not None and math.isfinite(save_s) and save_s >= 0 else {}))


# ---------------------------------------------------------------- values


def _scalar(name: str, value) -> numbers.Real:
    if not isinstance(value, numbers.Real) and hasattr(value, "item"):
        try:
            value = value.item()  # a 0-d tensor or a numpy scalar (a tensor syncs here)
        except (ValueError, RuntimeError, TypeError):
            raise TypeError(f"report: {name} must be a number, got a {type(value).__name__} "
                            f"of more than one element") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"report: {name} must be a number, got {type(value).__name__}")
    return value


def _real(name: str, value) -> float:
    return float(_scalar(name, value))


def _integer(name: str, value) -> int:
    value = _scalar(name, value)
    if isinstance(value, numbers.Integral) or float(value).is_integer():
        return int(value)
    raise TypeError(f"report: {name} must be a whole number, got {value!r}")


# ---------------------------------------------------------------- writing


def _emit(type: str, **fields) -> None:
    """One line, one write() to an O_APPEND descriptor: engine.record.events.EventWriter's format,
    so lines never interleave with the supervisor's."""
    global _fd, _quiet
    if _quiet or _path is None:
        return
    event = {"v": SCHEMA_VERSION, "t": round(time.time(), 3), "type": type,
             "attempt": _attempt, **fields}
    try:
        if _fd is None:
            # CLOEXEC: processes the script starts do not hold the run's file open.
            _fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.write(_fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())
    except OSError:
        _quiet = True  # never fail the user's training because of cockpit


def _publish(step: int, samples: int | None) -> None:
    global _publisher
    if _publisher is None:
        where = os.environ.get("COCKPIT_REACHED")
        if not where:
            return
        from engine.record.reached import Publisher  # stdlib only, loaded at the first step

        _publisher = Publisher(where)
    _publisher.publish(step, samples)


# ---------------------------------------------------------------- fault injection


def _fire(step: int) -> None:
    """Fire every fault due at `step` or by now, each once, as engine.train.faults.Injector does."""
    global _poison_loss, _spiking
    # engine loads into the user's script only when a fault is injected: report is stdlib-only
    from engine.train import faults

    elapsed = time.time() - _started
    due = [p for p in _pending if (p[3] <= elapsed if p[3] is not None else p[2] is not None and p[2] <= step)]
    for spec, kind, at, after_s in due:
        _pending.remove((spec, kind, at, after_s))
        if kind == "openmp" and faults.openmp_duplicate_allowed():
            continue  # the real check lets the duplicate runtime through
        _emit("fault_injected", spec=spec, kind=kind, step=step,
              **({} if after_s is None else {"at_s": round(elapsed, 3)}))
        if kind == "nan":
            _poison_loss = True
        elif kind == "spike":
            _spiking = True
        elif kind == "native-crash":
            sys.stdout.flush()
            sys.stderr.flush()
            os.abort()  # abort(3) itself: it ends the process even past a SIGABRT handler
        elif kind == "oom":
            if _device.startswith("cuda"):
                # What CUDA raises: torch.OutOfMemoryError (a RuntimeError), if torch is loaded.
                torch = sys.modules.get("torch")
                error = getattr(torch, "OutOfMemoryError", RuntimeError)
                raise injected(error(faults.CUDA_OOM))
            # MPS raises a plain RuntimeError (MPSAllocator.mm); so does the CPU allocator.
            raise injected(RuntimeError(faults.MPS_OOM if _device.startswith("mps") else faults.CPU_OOM))
        elif kind == "backend":
            if _device.startswith("cuda"):
                raise injected(RuntimeError(faults.CUDA_ERROR))
            print(faults.METAL_ERROR, file=sys.stderr, flush=True)
            faults._die(signal.SIGABRT)  # Metal's failed command buffer aborts
        elif kind == "openmp":
            print(faults.OMP_ERROR, file=sys.stderr, flush=True)
            faults._die(signal.SIGABRT)  # libomp calls abort() after the hint
        elif kind == "user-code":
            raise injected(ValueError("too many values to unpack (expected 2, got 3) "
                                      "[injected user-code fault]"))


def injected(error: BaseException) -> BaseException:
    """A fault raised on purpose: the real exception type and text, marked so that code which
    must not let cockpit's own failures escape (the framework callbacks) lets it through."""
    setattr(error, "cockpit_injected", True)   # an attribute no exception type declares
    return error


_reset()
