"""What does the system sampler cost? Target: < 1% of one core at 1 Hz.

Starts a live stand-in trainer (a child holding 100 MB, with a few children of its own, as
DataLoader workers would be), samples it with engine.monitor.sysmon.SystemSampler for --seconds at
--hz, and prints this process's CPU time per sample (time.process_time around each sample:
user + system, the /proc reads' kernel time included) and the whole loop's CPU from
getrusage (sleeps and wake-ups included), each as % of one core at 1 Hz.

    python benchmarks/monitor_cost.py                 # 1 Hz for 30 s
    python benchmarks/monitor_cost.py --hz 20 --seconds 10

Faster rates keep the same mix per sample: the child-list refresh and the scan of other
processes for CPU (each every 5 s at 1 Hz) are scaled to every 5 samples.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.monitor import hardware, sysmon  # noqa: E402

TRAINER = """
import subprocess, sys, time
held = bytearray(100_000_000)
workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
           for _ in range({workers})]
print("ready", flush=True)
try:
    time.sleep(3600)
finally:
    for w in workers:
        w.kill()
"""


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--hz", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=3, help="children of the stand-in trainer")
    args = ap.parse_args()

    trainer = subprocess.Popen([sys.executable, "-c", TRAINER.format(workers=args.workers)],
                               stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert trainer.stdout.readline().strip() == b"ready"
        others = hardware.OtherProcesses(every_s=hardware.OTHERS_EVERY_S / args.hz)
        sampler = sysmon.SystemSampler(trainer.pid, children_every_s=sysmon.CHILDREN_EVERY_S / args.hz,
                                       others=others)
        period = 1.0 / args.hz
        costs = []
        loop_cpu, start = cpu_s(), time.monotonic()
        next_t = start
        while time.monotonic() - start < args.seconds:
            c0 = time.process_time()
            sample = sampler.sample()
            costs.append(time.process_time() - c0)
            next_t += period
            time.sleep(max(0.0, next_t - time.monotonic()))
        wall, loop_cpu = time.monotonic() - start, cpu_s() - loop_cpu
    finally:
        os.killpg(trainer.pid, 9)
        trainer.wait()

    first, rest = costs[0], costs[1:]
    per_sample = statistics.mean(rest)
    per_sample_loop = loop_cpu / len(costs)
    processes = sum(1 for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc") else None
    print(f"machine: {os.cpu_count()} cores, {sys.platform}, {processes or '?'} processes running")
    print(f"sampled pid {trainer.pid} ({sample['processes']} processes, rss "
          f"{sample['rss'] / 1e6:.0f} MB) {len(costs)} times at {args.hz:g} Hz over {wall:.1f} s")
    print(f"pressure: {sample['pressure']['source'] or 'unavailable'} "
          f"({sample['pressure']['detail']})")
    print(f"hardware: {hardware.summary(sample) or 'no CPU figure'}; "
          f"{len(sample['gpus'])} GPUs through NVML")
    print(f"first sample (children listed, counters primed): {first * 1e3:.2f} ms CPU")
    print(f"per sample: mean {per_sample * 1e3:.3f} ms, median {statistics.median(rest) * 1e3:.3f} ms,"
          f" max {max(rest) * 1e3:.3f} ms CPU")
    print(f"at 1 Hz: sampling {per_sample * 100:.3f}% of one core; whole loop (getrusage, "
          f"wake-ups included) {per_sample_loop * 100:.3f}% (target < 1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
