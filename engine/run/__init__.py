"""The run: a supervisor running attempts (each a launch: the trainer or the user's command),
how each ended and what comes next, and the run directory they leave behind.

    supervisor   runs a run's attempts, foreground or detached; hangs, memory, stops, faults
    alerts       crash, fallback, finish, failure, slowdown, hang: terminal, desktop, notify command
    lifeline     stops the attempt when its supervisor dies; the run reads `interrupted`
    resume       continuing a stopped, failed or interrupted run (`cockpit runs resume`)
    identity     a process by pid and start time: liveness that a reused pid cannot fool
    launch       one attempt's argv, env, cwd, how its progress is read and how it is stopped
    attempt_log  an attempt's output: its tail as evidence, followed as it grows
    crashes      how an attempt ended, from evidence
    fallback     the rules: what the next attempt is
    faults       fault injection, real failures on any machine
    events       events.jsonl: writer, reader, follower
    rundir       the run directory, listing and summaries (the reader API)
"""
