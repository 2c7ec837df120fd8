"""Watching the machine while a run trains.

    sysmon    the system sampler: RSS of the process tree, memory, swap, pressure
    slowdown  throughput far below its best while memory is the reason: a warning with advice
"""
