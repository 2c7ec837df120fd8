"""What both front ends say about a run, so the headless CLI and the TUI word it alike:

    words.py        durations, ETAs, rates as shown, resume points, a run's summary, statuses
    lines.py        one line per event (the step line, the live status line, crashes, fallbacks...)
    transcript.py   events folded into lines in a log file's rhythm (or live, with a status line)

No Textual and no terminal here: cockpit/headless.py prints these, cockpit/ui/ shows them.
"""
