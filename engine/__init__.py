"""cockpit's engine: presets, training, supervision and the run directory.

It never imports a UI; the TUI and the headless CLI are front ends over it. By concern:
    engine.vocabulary  the shared words, importing nothing of engine: crash kinds, fallback
                       actions and env fixes, the trainer's exit codes, the fault grammar
    engine.presets, engine.schema, engine.runconfig
                       presets read and checked; a run's resolved configuration
    engine.settings    the user's settings.toml ([alerts])
    engine.run         the supervisor, an attempt's launch, crashes, fallback rules, fault
                       injection, alerts, the slowdown detector
    engine.record      the run record: run directory (the reader API), events, checkpoints,
                       the attempt logs, a run's figures
    engine.train       one attempt of the built-in trainer: loop, data order, optimizer
    engine.command     the user's own command: placeholders, progress from its output, tracker
    engine.monitor     the machine: its devices, the system sampler, GPU figures
    engine.probe       which device is fastest here; the largest batch that fits
    engine.workloads   the built-in workloads and the protocol for your own

Process model: the front end (TUI worker thread, `cockpit --no-ui`, `cockpit run`) starts a
supervisor, in the foreground or detached; the supervisor runs one attempt at a time as a
child process in its own session — a Launch: argv, env, cwd, how progress is read, how it
is stopped — classifies how it ended, and starts the next from the fallback ladder and the
resume point. The built-in trainer is one kind of launch, a user's command the other.
Importing engine is cheap: torch loads only with the trainer, the device and the workloads.
"""

__version__ = "0.1.0"
