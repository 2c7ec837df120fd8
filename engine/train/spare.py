"""A spare: the next attempt's process, started before it is needed.

    python -P -m engine.train.spare [--device=DEVICE] [--workload=JSON] [--preset=JSON] [MODULE...]
                                                    (started by the supervisor, stdin a pipe)

Most of a built-in attempt's start is the interpreter's and torch's imports, seconds of a
recovery on a small machine; on a GPU, CUDA's context and a compiled model's compile too. So
while an attempt runs, the supervisor may start a spare (engine.run.spare.Spare) with the
environment the next attempt would have. In a thread, it imports torch, the trainer and the
MODULEs named (the workload's), creates DEVICE's context (CUDA's; others have none worth it),
builds the workload whose preset JSON holds (its data) and, given the device preset's JSON of a
compiled model, builds the model and compiles it where engine.train.startup says there is room
(engine.train.startup hands all of it to the trainer). Meanwhile it waits for one JSON line on
its stdin:

    {"argv": [trainer arguments], "env": {the attempt's environment}, "log": "attempt-N.log"}

Handed one, it finishes its work ahead, then becomes the attempt: its output goes to the
attempt's log (stdin from /dev/null, as an attempt started directly has), its environment is the
attempt's (the entries that vary from one attempt to the next: when it started, which timed
faults count from) and it runs engine.train.trainer.main with that argv, exiting with its exit
code, or dying of its signal, exactly as `python -P -m engine.train.trainer` would. It is already
in a session of its own, as attempts are, so the supervisor and the lifeline stop it as one.

An empty line, or the pipe closing (the supervisor ended, or died), ends it at once, whatever
its work ahead is doing: a spare never outlives its supervisor. Until it is handed an attempt,
what it prints goes to the supervisor's log.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any

from engine.handover import handed

if TYPE_CHECKING:
    from engine.preset_types import DevicePreset


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    warm = [a for a in args if not a.startswith("--")]
    options = dict(a[2:].partition("=")[::2] for a in args if a.startswith("--"))
    handed_argv = handed(lambda: prepare(warm, options))   # the work ahead beside the wait
    from engine.train import trainer

    sys.argv = [trainer.__file__, *handed_argv]
    return trainer.main(handed_argv)


def prepare(warm: list[str], options: dict[str, str]) -> None:
    started = time.monotonic()
    import torch  # noqa: F401  (the point: imported before the attempt needs it)
    import torch._dynamo  # noqa: F401  (every optimizer's constructor imports it: a second more)

    from engine.train import startup, trainer  # noqa: F401  (the trainer's imports, ahead)

    for name in warm:   # the workload's modules: a failure is the attempt's to report, not ours
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            print(f"spare: {name} not imported ahead: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    startup.timed_ahead("imports", started)
    try:
        ahead(options.get("device"), options.get("workload"), options.get("preset"))
    except Exception as e:  # noqa: BLE001  (the attempt does it again, and reports what fails)
        print(f"spare: not prepared ahead: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    finally:
        startup.done_ahead()


def ahead(device: str | None, workload: str | None, preset: str | None = None) -> None:
    """The attempt's start-up that does not wait for its launch, done now: the device's
    context, the run's workload and, given the preset of a compiled model, the model compiled
    (engine.train.startup), where compile_model_ahead allows."""
    import torch

    from engine import presets, workloads
    from engine.monitor import device as devices
    from engine.train import startup

    started = time.monotonic()
    if device and device.startswith(("cuda", "auto")) and torch.cuda.is_available():
        devices.make_ready(torch.device("cuda" if device == "auto" else device))
        startup.device_ready_ahead()
        startup.timed_ahead("device", started)
    if workload:   # the run's workload preset, as a table
        started = time.monotonic()
        chosen = presets.workload_from_table(json.loads(workload), "the spare's --workload")
        key = startup.workload_key(chosen.workload, chosen.params, chosen.train.seed)
        devices.seed_everything(chosen.train.seed)   # as the trainer seeds before its build
        built = workloads.build(chosen.workload, chosen.params, chosen.train.seed)
        startup.built_ahead(key, built, devices.rng_state())
        startup.timed_ahead("data", started)
        if preset:
            model_ahead(built, key, presets.device_from_table(json.loads(preset), "the spare's --preset"))


def model_ahead(built: Any, key: str, preset: DevicePreset) -> None:
    """The model of a compiled preset, built and compiled (engine.train.startup), where
    compile_model_ahead allows."""
    import torch

    from engine.monitor import device as devices
    from engine.train import startup

    resolved = devices.resolve(preset)
    if preset.threads:   # as the trainer sets them: Dynamo's guards check the count
        torch.set_num_threads(preset.threads)
    if not compile_model_ahead(resolved.device):
        return
    started = time.monotonic()
    try:
        startup.compile_ahead(built, key, preset, resolved)
    except torch.cuda.OutOfMemoryError:
        gc.collect()   # no room after all: the attempt builds and compiles its own
        devices.empty_cache(resolved.device)
        raise
    except Exception:
        if resolved.device.type == "cuda":
            # CUDA's context may be broken for good: this spare must not become an attempt
            # (the supervisor starts one afresh)
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        raise
    finally:
        startup.timed_ahead("model", started)


# What must stay free of the GPU's memory, beyond what the spare may take, for the attempt
# training beside it (an eval's other shapes, its allocator's growth).
MARGIN_FOR_ATTEMPT = 0.25


def compile_model_ahead(device, environ: dict[str, str] | None = None) -> bool:
    """Whether the spare builds and compiles the model: on CUDA, where the memory free exceeds
    what the attempt holds (the attempt before it, training now, at its peak: the spare's one
    pass, without an optimizer's state, needs less) by a quarter of the GPU; COCKPIT_SPARE_MODEL=1
    or 0 says so anywhere (on the CPU the compile would take the cores the attempt trains on)."""
    import torch

    said = (os.environ if environ is None else environ).get("COCKPIT_SPARE_MODEL")
    if said in ("0", "1"):
        return said == "1"
    if device.type != "cuda":
        return False
    free, total = torch.cuda.mem_get_info(device)
    held = total - free   # the attempt's, mostly (a CUDA context is half a GB)
    return free - held >= MARGIN_FOR_ATTEMPT * total


if __name__ == "__main__":
    sys.exit(main())
