"""How many events a second the dashboard keeps up with, and what it costs at a normal rate.

    python benchmarks/ui_events.py                       # rates 1k..50k events/s, 3 s each
    python benchmarks/ui_events.py --rates 5000 --seconds 5 --idle-seconds 30

The app runs headless (App.run_test, 80x24) with the dashboard following a run directory
exactly as it follows a live run: its worker thread polls events.jsonl. A writer
process (as the trainer is) appends a recorded run's events (tests/fixtures/runs/finished: step, memory, eval,
checkpoint) at the target rate, each stamped with its write time. After each repaint the
dashboard records now - (write time of the oldest event that frame brought to the screen):
the event-to-screen lag, worst case per frame (the follower's 0.1 s poll included).
A rate is sustained when the 95th-percentile lag is under 250 ms and, when the writer
stops, the screen has every event within 250 ms.

Then the UI's CPU at a normal run's rate (about 3 events/s: a step event every 0.5 s and a
memory event every second, written by a thread here): this process's CPU time over
--idle-seconds, as % of one core.
Headless: no terminal is written to, so a real terminal adds its own output cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "finished"
LAG_LIMIT_S = 0.25


def _prepare(root: Path, name: str) -> Path:
    run = root / name
    shutil.copytree(FIXTURE, run)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[:3]))
    (run / "supervisor.pid").write_text(f"{os.getpid()}\n")   # alive: followed as live
    return run


def _body() -> list[dict]:
    events = [json.loads(line) for line in (FIXTURE / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["type"] in ("step", "memory", "eval", "checkpoint")]


def _writer(path: Path, body: list[dict], rate: float, seconds: float, written: list[int]) -> None:
    """Append events at `rate` per second in 10 ms ticks, each stamped with its write time."""
    tick, i = 0.01, 0
    start = time.monotonic()
    with open(path, "a") as f:
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(rate * elapsed) - written[0]
            if due > 0:
                now = time.time()
                f.write("".join(json.dumps({**body[(i + k) % len(body)], "t": now}) + "\n" for k in range(due)))
                f.flush()
                i += due
                written[0] += due
            time.sleep(tick)


async def _measure_rate(root: Path, rate: float, seconds: float) -> dict:
    from cockpit.app import make_app
    from engine.run.rundir import RunDir

    run = _prepare(root, f"rate-{int(rate)}")
    app = make_app(attach=False)
    async with app.run_test(size=(80, 24)) as pilot:
        dash = app.open_run(RunDir(run))
        while dash.model.events_seen < 3:
            await pilot.pause(0.05)
        await pilot.pause(0.5)   # the first frame (the recorded run's own old times) is not counted
        dash.frame_lags.clear()
        frames0 = dash.frames
        # The writer is another process, as the trainer is: it does not compete for this GIL.
        writer = subprocess.Popen([sys.executable, __file__, "--write", str(run / "events.jsonl"),
                                   str(rate), str(seconds)], stdout=subprocess.PIPE, text=True)
        while writer.poll() is None:
            await pilot.pause(0.05)
        stopped = time.monotonic()
        written = [int(writer.stdout.read().strip())]
        target = 3 + written[0]
        while dash.model.events_seen < target and time.monotonic() - stopped < 10:
            await pilot.pause(0.01)
        catch_up = time.monotonic() - stopped
        lags = sorted(dash.frame_lags)
        frames = dash.frames - frames0
    p95 = lags[int(0.95 * (len(lags) - 1))] if lags else float("inf")
    return {"rate": rate, "written": written[0], "achieved": written[0] / seconds, "frames_per_s": frames / seconds,
            "lag_p50_ms": 1000 * statistics.median(lags) if lags else None, "lag_p95_ms": 1000 * p95,
            "lag_max_ms": 1000 * lags[-1] if lags else None, "catch_up_ms": 1000 * catch_up,
            "sustained": p95 < LAG_LIMIT_S and catch_up < LAG_LIMIT_S}


async def _measure_cpu(root: Path, seconds: float) -> dict:
    from cockpit.app import make_app
    from engine.run.rundir import RunDir

    run = _prepare(root, "normal")
    body = [e for e in _body() if e["type"] in ("step", "memory")]
    steps = [e for e in body if e["type"] == "step"]
    memory = [e for e in body if e["type"] == "memory"]
    app = make_app(attach=False)
    async with app.run_test(size=(80, 24)) as pilot:
        dash = app.open_run(RunDir(run))
        await pilot.pause(1.0)
        stop = threading.Event()

        def normal_run():
            # A step event every 0.5 s and a memory event every second, as a real run writes them.
            k = 0
            with open(run / "events.jsonl", "a") as f:
                while not stop.wait(0.5):
                    lines = [{**steps[k % len(steps)], "t": time.time()}]
                    if k % 2 == 0:
                        lines.append({**memory[k % len(memory)], "t": time.time()})
                    f.write("".join(json.dumps(e) + "\n" for e in lines))
                    f.flush()
                    k += 1

        writer = threading.Thread(target=normal_run)
        cpu0, wall0, frames0 = time.process_time(), time.monotonic(), dash.frames
        writer.start()
        await pilot.pause(seconds)
        stop.set()
        writer.join()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        frames = dash.frames - frames0
    return {"seconds": wall, "cpu_percent": 100 * cpu / wall, "frames_per_s": frames / wall,
            "events": dash.model.events_seen}


def main() -> int:
    if sys.argv[1:2] == ["--write"]:  # the writer process: PATH RATE SECONDS, prints the count
        written = [0]
        _writer(Path(sys.argv[2]), _body(), float(sys.argv[3]), float(sys.argv[4]), written)
        print(written[0])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1000, 2000, 5000, 10000, 20000, 50000])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of writing per rate")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="seconds at a normal run's rate")
    args = parser.parse_args()
    best = None
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["COCKPIT_RUNS_DIR"] = str(Path(scratch) / "runs")
        os.environ["COCKPIT_CONFIG_DIR"] = str(Path(scratch) / "config")
        root = Path(scratch) / "runs"
        root.mkdir()
        print(f"{'target/s':>9} {'written/s':>10} {'frames/s':>9} {'lag p50':>8} {'p95':>8} {'max':>8} "
              f"{'catch-up':>9}  sustained")
        for rate in args.rates:
            r = asyncio.run(_measure_rate(root, rate, args.seconds))
            print(f"{r['rate']:>9,.0f} {r['achieved']:>10,.0f} {r['frames_per_s']:>9.1f} "
                  f"{r['lag_p50_ms']:>6.0f}ms {r['lag_p95_ms']:>6.0f}ms {r['lag_max_ms']:>6.0f}ms "
                  f"{r['catch_up_ms']:>7.0f}ms  {'yes' if r['sustained'] else 'no'}", flush=True)
            if r["sustained"]:
                best = max(best or 0, r["achieved"])
        print(f"highest sustained rate: {best:,.0f} events/s (target >= 5,000)" if best else
              "no rate sustained with p95 lag < 250 ms")
        c = asyncio.run(_measure_cpu(root, args.idle_seconds))
        print(f"normal rate (~3 events/s) for {c['seconds']:.0f} s: UI process CPU {c['cpu_percent']:.2f}% "
              f"of one core, {c['frames_per_s']:.1f} frames/s (target < 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
