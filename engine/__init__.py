"""cockpit's engine: presets, training, supervision and the run directory.

It never imports a UI; the TUI and the headless CLI are front ends over these modules:
    engine.presets     read, validate and save workload and device presets
    engine.runconfig   a run's resolved configuration (presets + --set overrides)
    engine.rundir      the run directory, run listing and summaries (the reader API)
    engine.events      events.jsonl: writer, reader, follower
    engine.supervisor  runs attempts as child processes, foreground or detached
    engine.launch      one attempt's launch: the built-in trainer or the user's command
    engine.trainer     one attempt of a built-in or protocol workload: the training loop
    engine.command     command workloads: the user's own script, its placeholders, checkpoints
    engine.progress    a command's progress read from its output (tqdm, step lines, HF dicts)
    engine.tracker     that progress (or cockpit.report's) as step events with rates and ETA

Process model: the front end (TUI worker thread, `cockpit --no-ui`, `cockpit run`) starts a
supervisor, in the foreground or detached; the supervisor runs one attempt at a time as a
child process in its own session — a Launch: argv, env, cwd, how progress is read, how it
is stopped — classifies how it ended, and starts the next from the fallback ladder and the
resume point. The built-in trainer is one kind of launch, a user's command the other.
Importing engine is cheap: torch loads only with the trainer, the device and the workloads.
"""

__version__ = "0.1.0"
