"""Training health (issue 38): how soon a run going bad is caught, how often a clean run is
judged bad, what rewinding and skipping gives back, and what the instruments cost.

Every run is a real `cockpit --no-ui` run (its own supervisor, its own trainer) on this machine;
the figures are read from each run's events.

    detection delay   --inject spike@N, nan@N and diverge@N on the sine example (noisy targets:
                      its loss levels off at 0.25): the steps from N to the first finding (a
                      `health` event; a non-finite loss is a `numerical` crash), and the kind
    false positives   clean runs of the shipped workloads, at test sizes, over several seeds:
                      every `health` event is one (target 0)
    rewind and skip   the sine example spiked at step 300 and rewound (the default rule), the
                      same spiked run only warned, and the unspiked twin: the final loss of each,
                      over several seeds, and the rewound run's against its twin
    instruments       benchmarks/instruments.py (the gradient norm each step, on and off):
                      its median ratio of seconds per step

    python benchmarks/health.py                  # all four, ~10 min on 2 cores
    python benchmarks/health.py --seeds 2 --skip-instruments
    python benchmarks/health.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.record.rundir import list_runs  # noqa: E402

# The sine example with noisy targets (tests/test_training_health.py's), checkpoints every 25
# steps; 480 steps.
SINE = ["batch_size=64", "accumulation=1", "params.samples=1024", "params.noise=0.5",
        "train.epochs=30", "threads=1", "train.report_every_s=0.01",
        "train.checkpoint_every_steps=25", "train.eval_every_steps=20"]
# The shipped workloads at the suite's sizes (tests/test_*.py), each a run of seconds, reporting
# often enough to be judged (min_reports 16) many times over.
CLEAN = {
    "matmul": ["params.n=32", "params.products=4", "params.samples=2048", "params.eval_samples=256",
               "train.epochs=16", "train.report_every_s=0.005", "threads=1", "batch_size=16",
               "accumulation=2", "train.eval_every_steps=100"],
    "clip-tiny": ["params.shapes=3", "params.colours=3", "params.samples=2048", "params.eval_samples=256",
                  "train.epochs=2.5", "batch_size=32", "accumulation=1", "threads=1",
                  "train.report_every_s=0.02", "train.eval_every_steps=40"],
    "trm-tiny": ["params.hidden_size=32", "params.L_layers=1", "params.num_heads=2", "params.H_cycles=2",
                 "params.L_cycles=1", "params.seq_len=32", "params.corpus_bytes=60000",
                 "params.eval_bytes=4096", "train.lr=0.01", "train.report_every_s=0.02", "threads=1",
                 "batch_size=16", "accumulation=1", "train.eval_every_steps=25"],
    "twotower-small": ["params.bank=4000", "params.dim=32", "params.context_len=4",
                       "params.article_len=16", "params.pairs=1500", "params.eval_pairs=300",
                       "params.hidden=64", "params.eval_k=20", "params.schedule=0:none,1-2:faiss@8",
                       "params.index=ivf", "params.ivf_lists=16", "params.ivf_probe=4",
                       "train.epochs=2", "train.report_every_s=0.005", "threads=1", "batch_size=32",
                       "accumulation=1"],
    "sine": ["batch_size=64", "accumulation=1", "params.samples=1024", "params.noise=0.5",
             "train.epochs=30", "threads=1", "train.report_every_s=0.01", "train.eval_every_steps=20"],
}


def run(home: Path, workload: str, settings: list[str], *args: str) -> list[dict]:
    """One `cockpit --no-ui` run; its events."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "examples"))),
           "COCKPIT_CONFIG_DIR": str(ROOT / "examples"), "COCKPIT_RUNS_DIR": str(home / "runs"),
           "COCKPIT_ALERTS": "off", "COCKPIT_CACHE_DIR": str(home / "cache")}
    before = {r.id for r in list_runs(home / "runs")}
    subprocess.run([sys.executable, "-m", "cockpit", "--no-ui", "-w", workload, "-d", "cpu",
                    *[a for s in settings for a in ("--set", s)], *args],
                   capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    (new,) = [r for r in list_runs(home / "runs") if r.id not in before]
    return new.events()


def first_finding(events: list[dict]) -> dict | None:
    """The first health event or non-finite loss (a numerical crash) of a run."""
    return next((e for e in events if e["type"] == "health"
                 or (e["type"] == "crash" and e.get("kind") == "numerical")), None)


def final_loss(events: list[dict]) -> float | None:
    steps = [e for e in events if e["type"] == "step"]
    return steps[-1]["loss"] if steps else None


def detection(home: Path, seeds: int) -> list[dict]:
    rows = []
    for fault in ("spike@300", "nan@300", "diverge@300"):
        for seed in range(seeds):
            events = run(home, "sine", SINE + [f"train.seed={seed}"], "--inject", fault)
            found = first_finding(events)
            step = (found or {}).get("step") or ((found or {}).get("evidence") or {}).get("last_step")
            kind = None if found is None else found.get("kind")
            rows.append({"fault": fault, "seed": seed, "found": kind,
                         "delay_steps": None if step is None else step - 300})
            print(f"  {fault:12s} seed {seed}: "
                  + (f"{kind} at step {step} ({step - 300:+d} steps)" if step is not None else "not caught"),
                  flush=True)
    return rows


def clean_runs(home: Path, seeds: int) -> list[dict]:
    rows = []
    for workload, settings in CLEAN.items():
        for seed in range(seeds):
            started = time.monotonic()
            events = run(home, workload, settings + [f"train.seed={seed}"])
            findings = [e.get("sentence") for e in events if e["type"] == "health"]
            ended = [e for e in events if e["type"] == "run_finished"]
            status = ended[-1]["status"] if ended else "?"
            reports = sum(e["type"] == "step" for e in events)
            evals = sum(e["type"] == "eval" for e in events)
            rows.append({"workload": workload, "seed": seed, "status": status, "reports": reports,
                         "evals": evals, "findings": findings})
            print(f"  {workload:15s} seed {seed}: {status}, {reports} reports, {evals} evals, "
                  f"{len(findings)} findings ({time.monotonic() - started:.0f} s)"
                  + "".join(f"\n      {f}" for f in findings), flush=True)
    return rows


def rewind_vs_twin(home: Path, seeds: int) -> list[dict]:
    rows = []
    for seed in range(seeds):
        # 20 checkpoints kept: in a run of seconds none is a minute old, so the trainer's
        # retention would keep only the oldest beyond the last 3 (a real run's are minutes apart)
        seeded = SINE + [f"train.seed={seed}", "train.keep_checkpoints=20"]
        rewound = run(home, "sine", seeded, "--inject", "spike@300")
        warned = run(home, "sine", seeded + ["health.on_spike=warn"], "--inject", "spike@300")
        twin = run(home, "sine", seeded)
        back = next((e["rewind"] for e in rewound if e["type"] == "fallback" and e.get("rewind")), None)
        row = {"seed": seed, "rewound": final_loss(rewound), "warned": final_loss(warned),
               "twin": final_loss(twin), "to_step": (back or {}).get("to_step"),
               "skipped": (back or {}).get("skip_batches")}
        rows.append(row)
        print(f"  seed {seed}: final loss rewound {row['rewound']:.4f} (to step {row['to_step']}, "
              f"{row['skipped']} batches skipped), warned only {row['warned']:.4f}, twin "
              f"{row['twin']:.4f}; rewound / twin {row['rewound'] / row['twin']:.3f}", flush=True)
    return rows


def instruments() -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "instruments.json"
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "instruments.py"), "--json", str(out)],
                              capture_output=True, text=True, cwd=ROOT, timeout=1800)
        print("  " + "\n  ".join(done.stdout.strip().splitlines()[-3:]), flush=True)
        return json.loads(out.read_text()) if out.exists() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4, help="seeds per workload and per fault (default 4: "
                                                             "20 clean runs over the 5 workloads)")
    parser.add_argument("--only", default="detection,clean,rewind,instruments",
                        help="the parts to measure, comma-separated (default: all four)")
    parser.add_argument("--skip-instruments", action="store_true")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    only = set(args.only.split(",")) - ({"instruments"} if args.skip_instruments else set())
    figures: dict = {"detection": [], "clean": [], "rewind": []}
    with tempfile.TemporaryDirectory(prefix="cockpit-health-") as tmp:
        home = Path(tmp)
        if "detection" in only:
            print("detection delay (steps from the fault to the first finding):", flush=True)
            figures["detection"] = detection(home, args.seeds)
        if "clean" in only:
            print(f"false positives over clean runs ({len(CLEAN)} workloads x {args.seeds} seeds):", flush=True)
            figures["clean"] = clean_runs(home, args.seeds)
        if "rewind" in only:
            print("rewind and skip against the unspiked twin (sine, spike@300):", flush=True)
            figures["rewind"] = rewind_vs_twin(home, args.seeds)
    if "instruments" in only:
        print("instruments (benchmarks/instruments.py):", flush=True)
        figures["instruments"] = instruments()
    clean, rewind = figures["clean"], figures["rewind"]
    print("\nsummary")
    for fault in ("spike@300", "nan@300", "diverge@300") if figures["detection"] else ():
        delays = [r["delay_steps"] for r in figures["detection"] if r["fault"] == fault and r["delay_steps"] is not None]
        caught = len(delays)
        total = sum(r["fault"] == fault for r in figures["detection"])
        print(f"  {fault:12s} caught {caught}/{total}, delay median "
              + (f"{statistics.median(delays):.0f} steps (max {max(delays)})" if delays else "-"))
    if clean:
        fp = sum(len(r["findings"]) for r in clean)
        judged = sum(r["reports"] > 16 for r in clean)   # min_reports: judged from the 17th
        print(f"  false positives: {fp} findings in {len(clean)} clean runs "
              f"({sum(r['status'] == 'finished' for r in clean)} finished, {judged} long enough to "
              f"be judged, {sum(r['reports'] for r in clean)} reports in all)")
    ratios = [r["rewound"] / r["twin"] for r in rewind if r["rewound"] and r["twin"]]
    warned = [r["warned"] / r["twin"] for r in rewind if r["warned"] and r["twin"]]
    if ratios:
        print(f"  final loss after rewind / twin: median {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f}); warned only / twin: median "
              f"{statistics.median(warned):.3f}")
    if figures.get("instruments"):
        print(f"  instruments: the gradient norm each step costs ratio on/off "
              f"{figures['instruments']['median_ratio']:.4f} (median over its rounds)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
