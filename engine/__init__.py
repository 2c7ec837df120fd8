"""cockpit's engine: presets, training, supervision and the run directory.

It never imports a UI; the TUI and the headless CLI are front ends over these modules:
    engine.presets     read, validate and save workload and device presets
    engine.runconfig   a run's resolved configuration (presets + --set overrides)
    engine.rundir      the run directory, run listing and summaries (the reader API)
    engine.events      events.jsonl: writer, reader, follower
    engine.supervisor  runs attempts as child processes, foreground or detached
    engine.trainer     one attempt: the training loop
Importing engine is cheap: torch loads only with the trainer, the device and the workloads.
"""

__version__ = "0.1.0"
