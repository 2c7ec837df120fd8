"""What the runs screen's refresh costs (it re-reads the runs dir every 3 s while shown).

    python benchmarks/runs_refresh.py                    # 200 finished runs + one 5-hour live run
    python benchmarks/runs_refresh.py --runs 1000 --hours 10

Builds a runs dir in a temporary folder: N copies of the recorded finished run
(tests/fixtures/runs/finished, 208 events) and one long run whose events are the fixture's
steps and memory samples repeated for --hours (a step every 0.33 s and memory every second,
as a recorded run writes: 5 hours is about 20 MB). Then measures this process's CPU time for:
- summarize() of every run, what the screen did on each refresh before digests;
- the digests' first refresh (every events file read once);
- a refresh with nothing new (a stat per run);
- a refresh after the long run appended 3 s of events (it reads those only);
- the app itself (headless, App.run_test at 80x24) showing the runs screen for --cpu-seconds
  while the long run goes on (3 s of events appended every 3 s): CPU time over wall time, all
  its threads, the refresh worker's included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.record.digest import RunDigests  # noqa: E402
from engine.record.rundir import RunDir, list_runs, summarize  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "finished"


def long_run_events(hours: float) -> tuple[list[dict], list[dict]]:
    """The long run's events up to now, and the next 3 s of them (what a refresh finds new)."""
    src = [json.loads(line) for line in (FIXTURE / "events.jsonl").read_text().splitlines()]
    head = [e for e in src if e["type"] in ("run_started", "attempt_started", "trainer_ready")]
    body = [e for e in src if e["type"] in ("step", "memory")]
    out, t, step = list(head), src[0]["t"], 0
    end = t + hours * 3600
    while t < end + 3:
        for e in body:
            e = dict(e, t=t)
            if e["type"] == "step":
                step += 1
                e["step"] = step
                t += 0.33
            out.append(e)
    split = next(i for i, e in enumerate(out) if e["t"] >= end)
    return out[:split], out[split:]


def cpu(f) -> float:
    start = time.process_time()
    f()
    return time.process_time() - start


async def app_cpu(root: Path, live: Path, three_seconds: str, seconds: float) -> float:
    os.environ["COCKPIT_RUNS_DIR"] = str(root)
    os.environ.setdefault("COCKPIT_ALERTS", "off")
    from cockpit.app import make_app

    app = make_app(attach=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("o")
        screen = app.screen
        while len(getattr(screen, "rows", ())) < 2:   # the first read of every run: not measured
            await pilot.pause(0.1)
        await pilot.pause(1.0)
        wall, start = time.monotonic(), time.process_time()
        while time.monotonic() - wall < seconds:
            with open(live / "events.jsonl", "a") as f:
                f.write(three_seconds)
            await pilot.pause(3.0)
        return (time.process_time() - start) / (time.monotonic() - wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="finished runs (default 200)")
    parser.add_argument("--hours", type=float, default=5.0, help="the live run's length so far")
    parser.add_argument("--cpu-seconds", type=float, default=30.0,
                        help="how long the app shows the runs screen (0: skip)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="runs-refresh-"))
    try:
        for i in range(args.runs):
            shutil.copytree(FIXTURE, root / f"20261123-{i:06d}-finished")
        live = root / "20261124-000000-live"
        shutil.copytree(FIXTURE, live)
        before, after = long_run_events(args.hours)
        lines = lambda events: "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events)  # noqa: E731
        (live / "events.jsonl").write_text(lines(before))
        RunDir(live).write_supervisor_pid(os.getpid())   # a live supervisor: the run is running
        size = (live / "events.jsonl").stat().st_size / 1e6
        print(f"{args.runs} finished runs + one {args.hours:g} h run ({len(before):,} events, {size:.1f} MB)")

        print(f"summarize() every run:          {cpu(lambda: [summarize(r) for r in list_runs(root)]):7.3f} s CPU")
        digests = RunDigests(root)
        print(f"digests, first refresh:         {cpu(digests.refresh):7.3f} s CPU")
        print(f"digests, nothing new:           {cpu(digests.refresh):7.3f} s CPU")
        with open(live / "events.jsonl", "a") as f:
            f.write(lines(after))
        print(f"digests, 3 s of the live run:   {cpu(digests.refresh):7.3f} s CPU "
              f"({len(after)} new events)")
        if args.cpu_seconds:
            share = asyncio.run(app_cpu(root, live, lines(after), args.cpu_seconds))
            print(f"the app on the runs screen:     {share:7.1%} of a core over {args.cpu_seconds:g} s")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
