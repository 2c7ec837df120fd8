"""Record the real runs that the UI tests and the screenshots replay.

    python screenshots/record.py            # all of them (a few minutes on 2 cores)
    python screenshots/record.py finished   # one

Each is a real tiny headless run (`cockpit --no-ui`) in a scratch runs dir; its run.toml,
events.jsonl and attempt logs (not its checkpoints) are copied to tests/fixtures/runs/<name>/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "runs"
SMALL = ["params.n=32", "params.products=4", "params.samples=512", "params.eval_samples=128",
         "train.lr=0.05", "threads=1"]

RUNS = {
    # A clean run on the CPU, big enough to train for ~20 s (the plots need a time axis).
    "finished": ["--device", "cpu", *sum((["--set", s] for s in [
        "params.n=512", "params.products=24", "params.samples=8192", "params.eval_samples=256",
        "train.epochs=2", "train.report_every_s=0.25", "train.eval_every_steps=64", "threads=1",
        "batch_size=16", "accumulation=4"]), [])],
    # The rehearsal: a native crash (a real SIGABRT) at step 12 on 'auto', then the
    # fallback to 'cpu' resuming from the checkpoint at step 10.
    "crash-fallback": ["--device", "auto", "--inject", "native-crash@12", *sum((["--set", s] for s in SMALL + [
        "train.epochs=4", "train.report_every_s=0.1", "train.checkpoint_every_steps=5"]), [])],
}


def record(name: str) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "COCKPIT_RUNS_DIR": scratch, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "cockpit", "--no-ui", "--workload", "matmul", *RUNS[name]]
        print("$", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, env=env, check=False)
        (run,) = [p for p in Path(scratch).iterdir() if (p / "run.toml").exists()]
        dest = FIXTURES / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for f in run.iterdir():
            if f.is_file() and f.name != "supervisor.pid":
                shutil.copy2(f, dest / f.name)
        return dest


def main(argv: list[str]) -> int:
    for name in argv or list(RUNS):
        print(f"recorded {record(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
