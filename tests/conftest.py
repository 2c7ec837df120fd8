from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty user config dir and runs dir, so no test sees or touches the real ones; alerts
    off (tests/test_alerts.py turns them on)."""
    config, runs = tmp_path / "config", tmp_path / "runs"
    monkeypatch.setenv("COCKPIT_CONFIG_DIR", str(config))
    monkeypatch.setenv("COCKPIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("COCKPIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COCKPIT_ALERTS", "off")  # no desktop notifications from the test suite
    return tmp_path


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
