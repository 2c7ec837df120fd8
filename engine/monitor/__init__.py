"""The machine: its devices, and watching them while a run trains.

    machine     what this machine has (devices, CPU, memory, GPUs), read without torch
    device      device, precision and autocast resolved once; device memory figures
    hardware    per-GPU figures (NVML) and the machine's memory
    sysmon      the system sampler: RSS of the process tree, memory, swap, pressure
    throughput  samples/s over a window of steps
"""
