from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def home(tmp_path, monkeypatch, request):
    """An empty user config dir and runs dir, so no test sees or touches the real ones; alerts
    off (tests/test_alerts.py turns them on).

    The suite's runs are the training-health detectors' false-positive check (issue 38): a
    run of a test that does not mean its runs to go bad (@pytest.mark.health_findings) must
    have no `health` event, whatever it trains and however the machine is loaded."""
    config, runs = tmp_path / "config", tmp_path / "runs"
    monkeypatch.setenv("COCKPIT_CONFIG_DIR", str(config))
    monkeypatch.setenv("COCKPIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("COCKPIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COCKPIT_ALERTS", "off")  # no desktop notifications from the test suite
    yield tmp_path
    if request.node.get_closest_marker("health_findings") is None:
        found = health_findings(runs)
        assert not found, f"health findings in a run that was not meant to go bad: {found}"


def health_findings(runs: Path) -> list[str]:
    """Every `health` event's sentence in the run directories under `runs` (a node's too)."""
    found = []
    for log in sorted(runs.glob("**/events.jsonl")) if runs.is_dir() else []:
        for line in log.read_text(errors="replace").splitlines():
            if '"type": "health"' in line or '"type":"health"' in line:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                found.append(f"{log.parent.name}: {event.get('sentence')}")
    return found


def user_preset(home: Path, kind: str, name: str, text: str) -> Path:
    path = home / "config" / "presets" / kind / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


TINY = ["params.n=16", "params.products=2", "params.samples=256", "params.eval_samples=64",
        "train.epochs=1", "train.lr=0.05", "train.report_every_s=0.01", "threads=1",
        "batch_size=8", "accumulation=4"]


def cockpit_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cockpit", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def wait_until(condition, what: str, timeout: float = 60.0, poll_s: float = 0.05):
    """`condition()`'s first true value, looked at every `poll_s`; AssertionError naming `what`
    after `timeout` (generous: only something that never happens gets near it)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll_s)
    return value


# ---------------------------------------------------------------- processes a test starts
#
# Two promises to whoever runs the suite, checked rather than hoped for:
# - every process a test starts handles SIGINT by default, even when pytest itself was started
#   with SIGINT ignored (a shell's `&`, nohup, several CI runners): an ignored disposition is
#   inherited across exec, a handler is not, so pytest gets Python's own handler back;
# - a test leaves nothing running. Every descendant carries MARK in its environment (a child
#   that detached into a session of its own, or whose parent died, included); after each test
#   (and each module, for what its fixtures start) what appeared and did not end within
#   LEAK_GRACE_S is killed and fails that test, naming the command lines. There is no session
#   guard: a session-scoped fixture's process would be killed at the end of the first module
#   that used it, so such a fixture must not start one.

MARK = "PYTEST_SESSION_OF_COCKPIT"  # not COCKPIT_*: tests strip those for a script run alone
# a generous cap for a supervisor or lifeline that is already exiting (tests/test_suite_guards.py
# shortens it for the suite it runs)
LEAK_GRACE_S = float(os.environ.get("COCKPIT_TEST_LEAK_GRACE_S", 30))

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ[MARK] = f"{os.getpid()}-{time.time_ns()}"


def _marked() -> dict[int, str]:
    """Live processes carrying this session's MARK, by pid, with their command lines."""
    needle = f"{MARK}={os.environ[MARK]}".encode()
    found = {}
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue  # ended; only its exit status is left for its parent to read
            if sys.platform.startswith("linux"):
                with open(f"/proc/{proc.pid}/environ", "rb") as f:
                    marked = needle in f.read().split(b"\0")
            else:
                marked = proc.environ().get(MARK) == os.environ[MARK]
            if marked:
                found[proc.pid] = " ".join(proc.cmdline())[:200]
        except (OSError, psutil.Error):
            continue  # gone, or another user's
    return found


def _leaks(before: set[int]) -> dict[int, str]:
    """What appeared since `before` and is still running after LEAK_GRACE_S; killed."""
    deadline = time.monotonic() + LEAK_GRACE_S
    while (left := {p: c for p, c in _marked().items() if p not in before}) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    return left


def _guard(what: str):
    before = set(_marked())
    yield
    if left := _leaks(before):
        pytest.fail(f"{what} left {len(left)} process(es) running (killed now): "
                    + "; ".join(f"{pid}: {cmd}" for pid, cmd in left.items()), pytrace=False)


@pytest.fixture(autouse=True)
def no_process_left_by_the_test():
    yield from _guard("this test")


@pytest.fixture(autouse=True, scope="module")
def no_process_left_by_the_module():
    yield from _guard("this module's fixtures")


# ---------------------------------------------------------------- a one-node SLURM cluster

@dataclass(frozen=True)
class SlurmCluster:
    """A cluster of tools/slurm_cluster.py: its directory, and what a client (sbatch, srun,
    squeue, scontrol, scancel) needs in its environment: `env={**os.environ, **cluster.env}`."""
    dir: Path
    env: dict[str, str]


@pytest.fixture(scope="session")
def slurm_cluster():
    """The cluster $COCKPIT_SLURM_CONF names (.ci/run starts one), or the one $SLURM_CONF names
    when tools/slurm_cluster.py made it; else one started for the session and stopped at its end
    (the script scrubs the daemons' environment of MARK: they outlive every test). Where none can
    be started here (not Linux, not root, no apt-get: the script's exit 2) the tests are skipped
    with its reason, and fail instead under CI=true."""
    named = os.environ.get("COCKPIT_SLURM_CONF")
    if not named and (conf := os.environ.get("SLURM_CONF")) and (Path(conf).parent / "cluster.json").exists():
        named = conf  # one the script made; a real cluster's is not for the tests
    if named:
        root = Path(named).resolve().parent
        env_file = root / "env.json"
        yield SlurmCluster(root, json.loads(env_file.read_text()) if env_file.exists()
                           else {"SLURM_CONF": str(Path(named).resolve())})
        return
    script = [sys.executable, str(ROOT / "tools" / "slurm_cluster.py")]
    plain = {k: v for k, v in os.environ.items() if k != MARK}
    started = subprocess.run([*script, "start"], env=plain, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=900)
    if started.returncode != 0:
        why = started.stderr.strip() or f"exit {started.returncode}"
        if started.returncode == 2 and os.environ.get("CI", "").lower() not in ("true", "1"):
            pytest.skip(f"no SLURM cluster can be started here: {why}")
        pytest.fail(f"tools/slurm_cluster.py start failed: {why}", pytrace=False)
    conf = next(line.split("=", 1)[1] for line in started.stdout.splitlines()
                if line.startswith("export SLURM_CONF="))
    root = Path(conf).parent
    try:
        yield SlurmCluster(root, json.loads((root / "env.json").read_text()))
    finally:
        subprocess.run([*script, "stop", "--dir", str(root)], env=plain, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=120)
