"""What goes wrong inside the trainer, and how a failing process says why.

The supervisor judges an attempt's end from its exit code, its events and its log
(engine.run.crashes); this is the trainer's side of that. `report_failure` turns whatever
ended the process into an event, a line in the log and an exit code (the trainer's and the
probe's worker's). The errors it knows:

- a loss the protocol does not allow (`checked_loss`): the workload's bug, a ProtocolError
  that names what it got, not a confusing error from the trainer's line that first trips on it;
- a non-finite loss or weights (`NonFiniteLoss`; `all_finite` checks weights before a
  checkpoint): exit 4, and no checkpoint written from it;
- what only the trainer can refuse, having built the data set: an optimizer step larger than
  it (`step_set_by` names the --set or the preset that sized the step) and a rehearsed fault
  past the run's last step (`refuse_unreachable_faults`), each a ConfigError (exit 2);
- a wrong result of the parity check (engine.train.parity): exit 5.

Faults rehearsed on purpose are engine.train.faults.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

from engine import presets, runconfig
from engine.errors import ConfigError, ProtocolError
from engine.presets import DevicePreset
from engine.record.events import EventWriter
from engine.train import parity
from engine.train.faults import Injector
from engine.vocabulary import EXIT_CONFIG, EXIT_FAILED, EXIT_NUMERICAL, EXIT_PARITY


class NonFiniteLoss(Exception):
    def __init__(self, step: int, what: str):
        self.step = step
        super().__init__(f"{what} at step {step}")


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element is finite: one host-device sync per device, not per tensor."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(torch.isfinite(t.detach()).all())
    return all(bool(torch.stack(flags).all()) for flags in by_device.values())


def checked_loss(loss, name: str, workload) -> torch.Tensor:
    """The loss, if it is what the protocol asks for: a scalar floating-point tensor with a
    gradient. Anything else is the workload's bug, named as such (ProtocolError), not a
    confusing error from the trainer's line that first trips over it. Metadata only: no sync."""
    if isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point() \
            and loss.requires_grad:
        return loss
    if isinstance(loss, tuple):
        got = (f"a tuple of {len(loss)} ({', '.join(type(v).__name__ for v in loss)}); return the "
               "loss alone (report other figures from evaluate())")
    elif type(loss).__module__.partition(".")[0] == "numpy":
        got = (f"a numpy {type(loss).__name__}, which has no gradient; return the torch tensor "
               "(no .numpy() or .item())")
    elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
        got = f"a Python {type(loss).__name__} ({loss:g}), which has no gradient; return the tensor, " \
              "not .item()"
    elif loss is None:
        got = "None; return the loss (a missing `return`?)"
    elif isinstance(loss, dict):
        got = (f"a dict ({', '.join(map(str, loss))}); return the loss tensor alone (report "
               "other figures from evaluate())")
    elif not isinstance(loss, torch.Tensor):
        got = f"{_article(type(loss).__name__)} {type(loss).__name__}"
    elif loss.dim() != 0:
        got = (f"a tensor of shape {tuple(loss.shape)}; return the mean over the batch "
               "(.mean()), one number")
    elif not loss.is_floating_point():
        got = f"a tensor of dtype {loss.dtype}; expected a floating-point loss"
    else:
        got = ("a tensor that does not require grad (computed under torch.no_grad(), or "
               "detached): nothing to train")
    raise ProtocolError(name, "loss", f"loss() must return a scalar tensor, got {got}",
                        getattr(workload, "loss", None))


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def step_set_by(overrides, preset: DevicePreset, preset_name: str) -> tuple[str, str]:
    """(where, key) to blame for an optimizer step larger than the data set: the --set that sized
    the step (carried to every preset of the ladder), else the preset's file. engine.runconfig blames
    before the run where the data set's size is known without building it; trm's is not."""
    factors = ("batch_size", "accumulation", "nproc_per_node", "nnodes")
    keys = {k.strip(): v.strip() for k, _, v in (item.partition("=") for item in overrides)}
    # a --set whose value this attempt runs (a fallback may have halved it since); of several,
    # the largest factor of the step
    set_here = [k for k in factors if str(getattr(preset, k)) in (keys.get(k), keys.get(f"device.{k}"))]
    if set_here:
        return "--set", "device." + max(set_here, key=lambda k: preset.nodes[1] if k == "nnodes"
                                        else getattr(preset, k))
    try:   # the file to fix, as runconfig names it before a run (the name alone is not a place)
        return str(presets.find("devices", preset_name).path), "batch_size"
    except ConfigError:   # gone since the run began, or a run's own (adopted): its name is all there is
        return f"device preset {preset_name!r}", "batch_size"


def refuse_unreachable_faults(config, preset_name: str, faults: Injector, samples: int) -> None:
    """A step fault past the run's last step would never fire, and the rehearsal would pass
    in silence. engine.runconfig.check_faults refuses it before the run where a workload
    tells its size without building its data; for the others (trm) only the trainer knows
    the run's length, so its first attempt refuses it, with the same line."""
    # counted as runconfig counts, on the ladder's smallest step (a fault may be meant for a
    # fallback's attempt), with the data set's size this process has built
    known = runconfig.last_step(config, [config.device, *config.ladder.values()], samples=samples)
    if known is None:  # not for a workload that says its size: it just did
        return
    last, why = known
    for fault in faults.faults:  # step faults (timed ones are in .timed)
        if fault.step is not None and fault.step > last:
            raise ConfigError(*runconfig.fault_from(fault.spec, [preset_name], preset_name,
                                                    f"device preset {preset_name!r}", config.overrides),
                              runconfig.past_last_step(fault, last, why))


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def report_failure(events: EventWriter, error: Exception, step: int | None) -> int:
    """Say why this process is failing, the way engine.run.crashes classifies it (an event and the
    log), and return its exit code. Shared by the trainer and the probe's worker."""
    if isinstance(error, ConfigError):
        print(error.line(), file=sys.stderr, flush=True)
        events.emit("config_error", message=error.line())
        return EXIT_CONFIG
    if isinstance(error, ProtocolError):  # the workload's bug, told without the trainer's frames
        text = f"ProtocolError: {error}" + (f"\n  {error.method}() is at {error.where}" if error.where else "")
        events.emit("exception", error="ProtocolError", message=str(error), where=error.where,
                    step=step, rank=_rank(), traceback=text)
        print(text, file=sys.stderr, flush=True)
        return EXIT_FAILED
    if isinstance(error, parity.ParityFailure):  # the parity event, written already, has the figures
        print(f"parity: {error}", file=sys.stderr, flush=True)
        return EXIT_PARITY
    if isinstance(error, NonFiniteLoss):
        events.emit("numerical", step=error.step, message=str(error), rank=_rank())
        print(f"numerical: {error}", file=sys.stderr, flush=True)
        return EXIT_NUMERICAL
    frames = traceback.extract_tb(error.__traceback__)
    events.emit("exception", error=type(error).__name__, message=str(error)[:2000],
                where=f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None,
                step=step, rank=_rank(), traceback=traceback.format_exc()[-8000:])
    traceback.print_exc()
    return EXIT_FAILED
