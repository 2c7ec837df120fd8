"""The run: a supervisor running attempts (each a launch: the trainer or the user's command),
how each ended and what comes next. What they leave behind is engine.record.

    supervisor   the loop: spawn an attempt, watch it, stop it, judge its end, fall back
    process      a process in a session of its own: spawn, signal its group, stop, kill a hang
    launch       one attempt's argv, env, cwd, the faults it fires and how it is stopped
    kinds        what differs by kind (trainer, command): progress, checkpoints, the resume point
    watch        what the supervisor learns of the running attempt; the hang watch; its end judged
    health       memory, slowdown and contention sampled from outside the attempt
    rehearsal    the faults the supervisor delivers to a command itself, and those that cannot fire
    faults       a fault delivered from outside: signals, the slow throttle
    crashes      how an attempt ended, from evidence
    fallback     the ladder's rungs and the rules: what the next attempt is
    slowdown     throughput far below its best while memory is the reason: a warning with advice
    alert_rules  which events alert, and what the alert says
    alerts       where an alert goes: the terminal, the desktop, a notify command
    lifeline     stops the attempt when its supervisor dies; the run reads `interrupted`
    detached     a supervisor in its own session, so that a run outlives its terminal
    follow       following a run until it ends: the one loop both front ends read a run through
    resume       continuing a stopped, failed or interrupted run (`cockpit runs resume`)
"""
