"""How many events a second the dashboard keeps up with, and what it costs at a normal rate.

    python benchmarks/ui_events.py                       # rates 1k..50k events/s, then CPU
    python benchmarks/ui_events.py --rates 5000 --seconds 5 --cpu-seconds 60
    python benchmarks/ui_events.py --rates --profile     # CPU only, with a profile of it
    python benchmarks/ui_events.py --rates --breakdown   # CPU: following, plots, the rest

Throughput: the app runs headless (App.run_test, 80x24) with the dashboard following a run
directory exactly as it follows a live run: its worker thread polls events.jsonl. A writer
process (as the trainer is) appends a recorded run's events (tests/fixtures/runs/finished:
step, memory, eval, checkpoint) at the target rate, each stamped with its write time. After
each repaint the dashboard records now - (write time of the oldest event that frame brought to
the screen): the event-to-screen lag, worst case per frame (the follower's 0.1 s poll
included). A rate is sustained when the 95th-percentile lag is under 250 ms and, when the
writer stops, the screen has every event within 250 ms.

CPU: at a normal run's rate, at 80x24 and 200x50 (target < 5% of one core at both). A recorded
run reports a step every 0.3-0.5 s and memory every second (the fixture: 1.9 steps/s, 1.0
memory/s); this writes busier, a step every 0.2 s, memory every 1 s and an eval every minute
(~6 events/s), from another process, after --history-s of the same already in events.jsonl
(a run some way in: its series are long, as on a five-hour run). Memory events carry the
hardware fields the supervisor's sampler writes (cpu_percent, cpu_count, cpu_others, gpus).
While measuring, the benchmark waits with asyncio.sleep, not Pilot.pause: a pause posts a
message to every widget on the screen and waits for each (600 messages/s at 200x50 when
polled every 0.1 s), which a real terminal session never does and which doubled the figure.
Measured: this process's CPU time (all its threads: Textual's loop and the follower) over wall
time, idle (supervisor alive, nothing written) and while following. Headless, no terminal is
written to; so then the same in a terminal: `python -m cockpit` on a pseudo-terminal of each
size attaches to the run as a user's would, its output read and dropped, its CPU from psutil
(--no-terminal skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
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
    _alive(run)
    return run


def _alive(run: Path) -> None:
    """This process as the run's supervisor (pid and start time: a bare pid is not trusted),
    so the dashboard follows the run as live."""
    from engine.record.rundir import RunDir

    RunDir(run).write_supervisor_pid(os.getpid())


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
    from engine.record.rundir import RunDir

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
            await asyncio.sleep(0.05)
        stopped = time.monotonic()
        written = [int(writer.stdout.read().strip())]
        target = 3 + written[0]
        while dash.model.events_seen < target and time.monotonic() - stopped < 10:
            await asyncio.sleep(0.01)
        catch_up = time.monotonic() - stopped
        lags = sorted(dash.frame_lags)
        frames = dash.frames - frames0
    p95 = lags[int(0.95 * (len(lags) - 1))] if lags else float("inf")
    return {"rate": rate, "written": written[0], "achieved": written[0] / seconds, "frames_per_s": frames / seconds,
            "lag_p50_ms": 1000 * statistics.median(lags) if lags else None, "lag_p95_ms": 1000 * p95,
            "lag_max_ms": 1000 * lags[-1] if lags else None, "catch_up_ms": 1000 * catch_up,
            "sustained": p95 < LAG_LIMIT_S and catch_up < LAG_LIMIT_S}


# ---------------------------------------------------------------- a normal run's rate

STEPS_TOTAL = 90_000          # a five-hour run at 5 steps/s
BATCH = 64


class NormalRun:
    """Events as a normal run writes them, made from the recorded run's templates: step k of
    STEPS_TOTAL, memory every `memory_every` s, an eval every EVAL_EVERY_S."""

    EVAL_EVERY_S = 60.0

    def __init__(self, step_every: float, memory_every: float):
        events = [json.loads(line) for line in (FIXTURE / "events.jsonl").read_text().splitlines()]
        self.step = next(e for e in events if e["type"] == "step")
        self.memory = next(e for e in events if e["type"] == "memory")
        self.eval = next(e for e in events if e["type"] == "eval")
        # the hardware fields the supervisor's sampler writes on a machine without NVML
        self.memory = {"cpu_percent": 190.0, "cpu_count": os.cpu_count() or 1, "cpu_others": [],
                       "gpus": [], **self.memory}
        self.step_every, self.memory_every = step_every, memory_every

    def at(self, elapsed: float, t: float) -> list[dict]:
        """The events written at `elapsed` seconds into the run (a multiple of step_every)."""
        k = round(elapsed / self.step_every)
        out = [self._step(k, t)]
        if (k - 1) * self.step_every // self.memory_every != k * self.step_every // self.memory_every:
            out.append({**self.memory, "t": t, "rss": self.memory["rss"] + 4096 * (k % 97)})
        if (k - 1) * self.step_every // self.EVAL_EVERY_S != k * self.step_every // self.EVAL_EVERY_S:
            out.append({**self.eval, "t": t, "step": k, "metrics": {"r2": 1 - 0.5 / (1 + k / 1000)}})
        return out

    def _step(self, k: int, t: float) -> dict:
        wobble = 1 + 0.05 * ((k * 7919) % 13 - 6) / 6
        rate = 320.0 * wobble
        return {**self.step, "t": t, "step": k, "total": STEPS_TOTAL, "samples_seen": k * BATCH,
                "total_samples": STEPS_TOTAL * BATCH, "loss": 0.1 + 2.0 / (1 + k / 2000) * wobble,
                "samples_per_s": rate, "steps_per_s": rate / BATCH, "window_s": self.step_every,
                "smoothed_samples_per_s": 320.0, "best_samples_per_s": 336.0,
                "eta_s": (STEPS_TOTAL - k) * self.step_every}


def _prepare_normal(root: Path, name: str, normal: NormalRun, history_s: float) -> tuple[Path, int]:
    """A run directory whose events.jsonl already holds `history_s` of a normal run, ending
    now; returns it and the number of events in it."""
    run = root / name
    shutil.copytree(FIXTURE, run)
    head = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()][:3]
    start = time.time() - history_s
    lines = [{**e, "t": start} for e in head]
    steps = int(history_s / normal.step_every)
    for k in range(1, steps + 1):
        lines += normal.at(k * normal.step_every, start + k * normal.step_every)
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    _alive(run)
    return run, len(lines)


def _normal_writer(path: Path, seconds: float, step_every: float, memory_every: float,
                   history_s: float) -> int:
    """The writer process: goes on from the history, one step each step_every (on a schedule,
    so a slow tick does not slow the run), until `seconds` have passed; returns the count."""
    normal = NormalRun(step_every, memory_every)
    start, written, k = time.monotonic(), 0, 0
    first = int(history_s / step_every) + 1
    with open(path, "a") as f:
        while (k + 1) * step_every <= seconds:
            k += 1
            time.sleep(max(0.0, start + k * step_every - time.monotonic()))
            events = normal.at((first + k) * step_every, time.time())
            f.write("".join(json.dumps(e) + "\n" for e in events))
            f.flush()
            written += len(events)
    return written


def _leave_out(dash, part: str) -> None:
    """For the breakdown: the dashboard paints without `part` ('plots'), or nothing at all
    ('painting': the events are still followed and folded into the model)."""
    paint = dash._paint

    def without() -> None:
        if part == "painting":
            dash._dirty.clear()
        dash._dirty.discard(part)
        paint()

    dash._paint = without   # the instance's: its paint timer looks it up there


async def _measure_cpu(root: Path, size: tuple[int, int], args, profile: bool = False,
                       leave_out: str | None = None) -> dict:
    from cockpit.app import make_app
    from engine.record.rundir import RunDir

    normal = NormalRun(args.step_every, args.memory_every)
    run, history = _prepare_normal(root, f"normal-{size[0]}x{size[1]}-{leave_out or 'all'}", normal,
                                   args.history_s)
    app = make_app(attach=False)
    async with app.run_test(size=size) as pilot:
        dash = app.open_run(RunDir(run))
        if leave_out:
            _leave_out(dash, leave_out)
        while dash.model.events_seen < history:   # the history replayed: not measured
            await pilot.pause(0.1)
        await pilot.pause(2.0)

        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(args.idle_seconds)
        idle = 100 * (time.process_time() - cpu0) / (time.monotonic() - wall0)

        profiler = None
        if profile:
            import cProfile   # the event loop's thread only: the follower thread is not in it

            profiler = cProfile.Profile()
        writer = subprocess.Popen([sys.executable, __file__, "--write-normal", str(run / "events.jsonl"),
                                   str(args.cpu_seconds), str(args.step_every), str(args.memory_every),
                                   str(args.history_s)], stdout=subprocess.PIPE, text=True)
        cpu0, wall0, frames0, seen0 = time.process_time(), time.monotonic(), dash.frames, dash.model.events_seen
        if profiler:
            profiler.enable()
        while writer.poll() is None:
            await asyncio.sleep(0.1)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        frames, seen = dash.frames - frames0, dash.model.events_seen - seen0
        written = int(writer.stdout.read().strip())
    return {"size": size, "seconds": wall, "cpu_percent": 100 * cpu / wall, "idle_percent": idle,
            "frames_per_s": frames / wall, "events_per_s": written / wall, "seen": seen, "written": written,
            "history": history, "profiler": profiler}


def _measure_cpu_terminal(root: Path, size: tuple[int, int], args) -> dict:
    """The same in a real terminal: `python -m cockpit` on a pseudo-terminal of `size`, which
    attaches to the live run at start-up as a user's would; its output is read and dropped
    here (the terminal's own cost is not the UI's). CPU is the child's, from psutil."""
    import fcntl
    import pty
    import struct
    import termios

    import psutil

    normal = NormalRun(args.step_every, args.memory_every)
    # a runs dir of its own: the cockpit attaches to the newest live run, and the runs the
    # headless measurements left (this process their supervisor) still look live
    runs = root / f"terminal-{size[0]}x{size[1]}"
    runs.mkdir()
    run, _ = _prepare_normal(runs, "run", normal, args.history_s)
    last_step = int(args.history_s / args.step_every)
    pid, fd = pty.fork()
    if pid == 0:   # the child: the terminal's size set before Textual asks for it
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        os.chdir(ROOT)
        os.environ.update(TERM="xterm-256color", PYTHONPATH=str(ROOT), COCKPIT_RUNS_DIR=str(runs))
        os.execv(sys.executable, [sys.executable, "-m", "cockpit"])
    seen = bytearray()
    reading = threading.Event()
    reading.set()

    def drain() -> None:   # the terminal: reads everything, keeps only the tail to look in
        while reading.is_set():
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)
            del seen[:-200_000]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    child = psutil.Process(pid)

    def cpu() -> float:
        t = child.cpu_times()
        return t.user + t.system

    try:
        # Attached and the history replayed: its last step on screen, or (should the step be
        # drawn in pieces) a second of under 10% CPU after the first five.
        started, deadline = time.monotonic(), time.monotonic() + 120
        while f"step {last_step}/".encode() not in seen:
            before = cpu()
            time.sleep(1.0)
            if time.monotonic() - started > 5 and cpu() - before < 0.1:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not settle within 120 s")
        time.sleep(2.0)

        cpu0, wall0 = cpu(), time.monotonic()
        time.sleep(args.idle_seconds)
        idle = 100 * (cpu() - cpu0) / (time.monotonic() - wall0)
        writer = subprocess.Popen([sys.executable, __file__, "--write-normal", str(run / "events.jsonl"),
                                   str(args.cpu_seconds), str(args.step_every), str(args.memory_every),
                                   str(args.history_s)], stdout=subprocess.PIPE, text=True)
        cpu0, wall0 = cpu(), time.monotonic()
        writer.wait()
        used, wall = cpu() - cpu0, time.monotonic() - wall0
        written = int(writer.stdout.read().strip())
        shown = f"step {last_step + int(args.cpu_seconds / args.step_every)}/".encode() in seen
    finally:
        reading.clear()
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        os.close(fd)
    return {"cpu_percent": 100 * used / wall, "idle_percent": idle, "events_per_s": written / wall,
            "shown": shown}


def _print_profile(profiler, top: int = 25) -> None:
    import io
    import pstats

    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)
        print(f"--- profile of the event loop's thread, by {order}")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-4000:])


def main() -> int:
    if sys.argv[1:2] == ["--write"]:  # the writer process: PATH RATE SECONDS, prints the count
        written = [0]
        _writer(Path(sys.argv[2]), _body(), float(sys.argv[3]), float(sys.argv[4]), written)
        print(written[0])
        return 0
    if sys.argv[1:2] == ["--write-normal"]:  # PATH SECONDS STEP_EVERY MEMORY_EVERY HISTORY_S
        path, *numbers = sys.argv[2:]
        print(_normal_writer(Path(path), *map(float, numbers)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="*", default=[1000, 2000, 5000, 10000, 20000, 50000],
                        help="events/s to try (none: skip to the CPU measurement)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of writing per rate")
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="seconds at a normal run's rate, per size")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="seconds of nothing written, per size")
    parser.add_argument("--history-s", type=float, default=1800.0, help="seconds of run already in events.jsonl")
    parser.add_argument("--step-every", type=float, default=0.2)
    parser.add_argument("--memory-every", type=float, default=1.0)
    parser.add_argument("--sizes", nargs="+", default=["80x24", "200x50"])
    parser.add_argument("--profile", action="store_true", help="profile the CPU measurement (cProfile)")
    parser.add_argument("--no-terminal", action="store_true",
                        help="skip the measurement in a real (pseudo-)terminal")
    parser.add_argument("--breakdown", action="store_true",
                        help="measure again without the plots and without painting: what each costs")
    args = parser.parse_args()
    best = None
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["COCKPIT_RUNS_DIR"] = str(Path(scratch) / "runs")
        os.environ["COCKPIT_CONFIG_DIR"] = str(Path(scratch) / "config")
        os.environ.setdefault("COCKPIT_ALERTS", "off")
        root = Path(scratch) / "runs"
        root.mkdir()
        if args.rates:
            print(f"{'target/s':>9} {'written/s':>10} {'frames/s':>9} {'lag p50':>8} {'p95':>8} {'max':>8} "
                  f"{'catch-up':>9}  sustained")
        for rate in args.rates:
            r = asyncio.run(_measure_rate(root, rate, args.seconds))
            print(f"{r['rate']:>9,.0f} {r['achieved']:>10,.0f} {r['frames_per_s']:>9.1f} "
                  f"{r['lag_p50_ms']:>6.0f}ms {r['lag_p95_ms']:>6.0f}ms {r['lag_max_ms']:>6.0f}ms "
                  f"{r['catch_up_ms']:>7.0f}ms  {'yes' if r['sustained'] else 'no'}", flush=True)
            if r["sustained"]:
                best = max(best or 0, r["achieved"])
        if args.rates:
            print(f"highest sustained rate: {best:,.0f} events/s (target >= 5,000: "
                  f"{best / 5000:.1f}x)" if best else "no rate sustained with p95 lag < 250 ms")
        print(f"\nnormal run: a step every {args.step_every:g} s, memory every {args.memory_every:g} s, "
              f"an eval a minute; {args.history_s:,.0f} s of history; {args.cpu_seconds:g} s per size")
        for size in args.sizes:
            width, height = map(int, size.split("x"))
            c = asyncio.run(_measure_cpu(root, (width, height), args, profile=args.profile))
            print(f"{size:>7}: UI CPU {c['cpu_percent']:.2f}% of one core ({c['cpu_percent'] / 5:.2f}x the 5% "
                  f"target; idle {c['idle_percent']:.2f}%), {c['events_per_s']:.1f} events/s "
                  f"({c['seen']}/{c['written']} shown), {c['frames_per_s']:.1f} frames/s, "
                  f"{c['history']:,} events of history", flush=True)
            if c["profiler"] is not None:
                _print_profile(c["profiler"])
            if not args.no_terminal:
                t = _measure_cpu_terminal(root, (width, height), args)
                print(f"{'':>9}in a terminal (python -m cockpit on a pty): UI CPU {t['cpu_percent']:.2f}% "
                      f"({t['cpu_percent'] / 5:.2f}x the target; idle {t['idle_percent']:.2f}%), "
                      f"{t['events_per_s']:.1f} events/s, the last step {'shown' if t['shown'] else 'NOT shown'}",
                      flush=True)
            if args.breakdown:
                no_plots = asyncio.run(_measure_cpu(root, (width, height), args, leave_out="plots"))["cpu_percent"]
                floor = asyncio.run(_measure_cpu(root, (width, height), args, leave_out="painting"))["cpu_percent"]
                print(f"{'':>9}following and folding the events (nothing painted) {floor:.2f}%; the plots "
                      f"{c['cpu_percent'] - no_plots:.2f}%; the rest of the painting {no_plots - floor:.2f}%",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
