"""What the log view costs on a big attempt log, and while it follows a growing one.

    python benchmarks/log_view.py                      # a 300 MB log, then 60 s of following
    python benchmarks/log_view.py --mb 50 --seconds 20 --size 200x50

Open: an attempt-1.log of --mb megabytes of tqdm output (bars redrawn with \\r, a newline per
epoch of bars, a loss line in between: the shape that makes logs this big) is made in a scratch
copy of tests/fixtures/runs/finished; the app runs headless (App.run_test) and pushes the log
view on it. Measured: seconds from the push until the log's last line is on the screen, the
lines the view holds, and this process's peak RSS growth.

Following: another process appends a tqdm-like line every 0.1 s (bars mid-redraw included)
and a 'step N' line every second to the log for --seconds; measured: this process's CPU time
(Textual's loop and the reader threads) over wall time, and the lag from a line's write (its
text carries the time) to the moment the view shows it, at the 95th percentile. The waits use
asyncio.sleep, not Pilot.pause (which messages every widget and costs what a terminal session
never pays). Headless: no terminal is written to.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "finished"

WRITER = r"""
import sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
end, n = time.time() + seconds, 0
with open(path, "a", buffering=1) as f:
    while time.time() < end:
        n += 1
        f.write("\r" + f" {n % 100:3d}%|{'#' * (n % 10):10s}| {n}/100")
        if n % 10 == 0:
            f.write(f"\nstep {n // 10} written {time.time():.3f}\n")
        f.flush()
        time.sleep(0.1)
"""


def make_log(path: Path, megabytes: int) -> None:
    bar = "".join(f"\r{p:3d}%|{'#' * (p // 10):10s}| {p}/100 [00:{p:02d}<00:10, 9.87it/s]"
                  for p in range(0, 101, 2))
    epoch = (bar + "\n" + "epoch done: loss 0.1234 accuracy 0.987\n").encode()
    with open(path, "wb") as f:
        for _ in range(megabytes * (1 << 20) // len(epoch) + 1):
            f.write(epoch)
        f.write(b"the last line\n")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure(run: Path, size: tuple[int, int], seconds: float) -> None:
    from cockpit.app import make_app
    from cockpit.ui.logs import LogScreen
    from cockpit.ui.widgets.log_pane import LogPane
    from engine.record.rundir import RunDir

    app = make_app(attach=False)
    async with app.run_test(size=size):
        await asyncio.sleep(0.5)
        before = rss_mb()
        t0 = time.perf_counter()
        screen = LogScreen(RunDir(run), attempt=1)
        app.push_screen(screen)
        while True:
            await asyncio.sleep(0.01)
            output = screen.query(LogPane).last() if screen.is_mounted else None
            if output is not None and output.lines[-1:] == ["the last line"]:
                break
        opened = time.perf_counter() - t0
        print(f"open {run.joinpath('attempt-1.log').stat().st_size / 1e6:,.0f} MB log at "
              f"{size[0]}x{size[1]}: last line shown after {opened:.2f} s; {len(output.lines):,} "
              f"lines held, {output.row_count:,} rows; peak RSS +{rss_mb() - before:,.0f} MB")

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(min(10.0, seconds))
        idle = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        print(f"idle (nothing written): CPU {100 * idle:.1f}% of a core")

        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run / "attempt-1.log"), str(seconds)])
        lags, seen = [], 0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        while writer.poll() is None:
            await asyncio.sleep(0.05)
            steps = [line for line in output.lines[-20:] if line.startswith("step ") and " written " in line]
            for line in steps:
                n = int(line.split()[1])
                if n > seen:
                    seen = n
                    lags.append(time.time() - float(line.rsplit(" ", 1)[1]))
        cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        p95 = statistics.quantiles(lags, n=20)[-1] if len(lags) >= 20 else max(lags, default=0)
        print(f"following for {seconds:.0f} s (10 writes/s): CPU {100 * cpu:.1f}% of a core; "
              f"write-to-view lag p95 {1000 * p95:.0f} ms over {len(lags)} lines "
              "(the readers poll every 0.25 s; this samples every 0.05 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--size", default="80x24")
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "20261123-000000-finished"
        shutil.copytree(FIXTURE, run)
        make_log(run / "attempt-1.log", args.mb)
        asyncio.run(measure(run, size, args.seconds))


if __name__ == "__main__":
    main()
