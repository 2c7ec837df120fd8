"""The device probe and the batch finder: measure instead of guessing.

Note 000 expected MPS to be about twice as fast as the CPU on its retriever; note 004
measured the CPU 8x faster than MPS on its CLIP model. Picking a device by availability is
a guess, so `cockpit probe` times real training of the workload on each candidate (its
micro-batches, so that a long accumulation group on a slow CPU still gives a figure),
each in its own process (a crash is a result, not the end of the probe), and ranks them.

    candidates.py   what to measure: devices or presets, CPU thread counts
    worker.py       the child process: a real Trainer, warm-up, timed micro-batches, batch trials
    timings.py      from timed micro-batches to samples/s and its confidence interval
    measure.py      runs one worker and watches it: memory, pressure, swap, how it ended
    command_worker.py  the same for a command workload: the user's script, timed from its output
    workers.py      which of the two times a candidate
    speed.py        the probe: budget, ranking, the recommendation in a sentence
    batch.py        the batch finder: the largest micro-batch that fits, and keeps memory calm
    cache.py        results per machine and workload configuration

Everything here but worker.py is torch-free, so `cockpit probe` answers a cached result and
the launch screen shows one without loading torch.
"""

from engine.errors import ConfigError

# Defaults both front ends show and use (kept here, where `cockpit --help` can read them
# without importing the probe's machinery).
PROBE_BUDGET_S = 60.0      # the whole probe, wall time
FINDER_BUDGET_S = 90.0     # the whole batch search
MAX_BATCH = 4096           # the largest micro-batch the finder tries
TRIAL_S = 1.5              # timed seconds per batch trial


def check_budget(seconds: float, argument: str = "budget") -> None:
    """A budget (the probe's or the finder's) the user gave: ConfigError outside 5 s to a day."""
    if not 5 <= seconds <= 24 * 3600:
        raise ConfigError(argument, None, f"got {seconds:g}; expected seconds, 5 to 86400")

# How a candidate is timed, by the trainer's worker and a command's alike.
WARMUP_SHARE = 0.25      # of the time left once it is ready (a command: at its first step)
TIMING_S = 0.25          # the trainer's: a timing of micro-batches lasts at least this (then a sync)
MAX_TIMINGS = 240        # ... and at least its time over this many (a long --budget's events stay few)
WINDOWS = 8              # a command's: timed windows aimed for in the time left after warm-up
MIN_WINDOW_S = 0.25
TRIAL_MIN_STEPS = 1      # timed steps per batch trial (at least), after the first step
