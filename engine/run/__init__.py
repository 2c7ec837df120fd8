"""The run: a supervisor running attempts (each a launch: the trainer or the user's command),
how each ended and what comes next. What they leave behind is engine.record.

    supervisor   runs a run's attempts, foreground or detached; hangs, memory, stops, faults
    alerts       crash, fallback, finish, failure, slowdown, hang: terminal, desktop, notify command
    lifeline     stops the attempt when its supervisor dies; the run reads `interrupted`
    resume       continuing a stopped, failed or interrupted run (`cockpit runs resume`)
    launch       one attempt's argv, env, cwd, how its progress is read and how it is stopped
    crashes      how an attempt ended, from evidence
    fallback     the rules: what the next attempt is
    faults       fault injection, real failures on any machine
    slowdown     throughput far below its best while memory is the reason: a warning with advice
"""
