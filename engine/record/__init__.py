"""The run record: what a run leaves on disk, and how it is read back.

A floor below supervision and training: the supervisor (engine.run) and the trainer
(engine.train) both write here and neither imports the other for it; the front ends read it.

    rundir       the run directory, listing and summaries (the reader API)
    events       events.jsonl: writer, reader, follower
    identity     a process by pid and start time: liveness that a reused pid cannot fool
    attempt_log  an attempt's output: its tail as evidence, followed as it grows
    checkpoint   atomic checkpoints, the last K kept
    reached      the step an attempt reached, published every step, readable after SIGKILL
    stats        a run's figures folded from its events
    goodput      where a run's wall time went: training kept, and the badput by bucket
    interval     the checkpoint interval that loses least (Young/Daly), and a device's crash history
    curves       loss and metric curves from the events, for plots and comparison
    digest       a run in a few figures, for `cockpit compare`
"""
