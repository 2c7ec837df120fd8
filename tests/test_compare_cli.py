"""`cockpit runs compare`: the comparison table headless, in-process on the recorded fixture
runs (the same rows as the runs screen's comparison, cockpit.comparison)."""

from __future__ import annotations

import json
import re

from cockpit.cli import main
from ui_support import copy_run

FINISHED, CRASH = "20261123-000001-finished", "20261123-000002-crash"


def _rows(text: str) -> dict[str, list[str]]:
    """{row name: cells}: columns are two or more spaces apart; a name has single spaces."""
    rows = [re.split(r" {2,}", line.strip()) for line in text.splitlines()[1:] if line.strip()]
    return {name: cells for name, *cells in rows}


def test_compare_prints_results_and_only_the_settings_that_differ(home, capsys):
    copy_run(home, "finished", FINISHED)
    copy_run(home, "crash-fallback", CRASH)
    assert main(["runs", "compare", "20261123-000001", "20261123-000002"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["A", "B"]
    rows = _rows(out)
    assert rows["id"] == [FINISHED, CRASH]
    assert rows["final loss"] == ["0.009409", "0.09574"]
    assert rows["samples/s avg"] == ["327", "473"]
    # the curves in a few numbers, at steps both runs reached (the crashed run's 12): they
    # reported only 10 and 12 both, so each run's loss is interpolated between its windows
    assert [name for name in rows if name.startswith("loss ")] == [
        "loss ~ step 3", "loss ~ step 6", "loss ~ step 9", "loss ~ step 12"]
    assert rows["loss ~ step 3"] == ["1.044", "-"]            # between its steps 2 and 4; B starts at 5
    assert rows["loss ~ step 6"] == ["0.8854", "0.4741"]      # A reported step 6; B between 5 and 10
    assert rows["loss ~ step 12"] == ["0.6715", "0.09574"]
    assert rows["train.lr"] == ["0.02", "0.05"] and rows["device.inject"] == ["-", "native-crash@12"]
    assert "train.seed" not in rows and "device.accumulation" not in rows
    assert "-- 16 settings differ" in out


def test_compare_as_json(home, capsys):
    copy_run(home, "finished", FINISHED)
    copy_run(home, "crash-fallback", CRASH)
    assert main(["runs", "compare", FINISHED, CRASH, "--json"]) == 0
    finished, crash = json.loads(capsys.readouterr().out)
    assert finished["id"] == FINISHED and crash["ran_on"] == "auto(cpu)→cpu"
    assert finished["settings"]["params.n"] == "512" and crash["settings"]["params.n"] == "32"
    assert round(finished["samples_per_s"]) == 327 and finished["final_metrics"]["r2"] > 0.99
    assert "curves" not in finished


def test_compare_json_with_curves(home, capsys):
    copy_run(home, "finished", FINISHED)
    copy_run(home, "crash-fallback", CRASH)
    assert main(["runs", "compare", FINISHED, CRASH, "--json", "--curves"]) == 0
    finished, crash = json.loads(capsys.readouterr().out)
    assert crash["curves"]["loss"]["step"] == [5, 10, 11, 12]
    assert crash["curves"]["loss"]["samples"] == [640, 1280, 1792, 2048]
    assert finished["curves"]["evals"]["r2"]["step"] == [64, 128, 192, 256]
    assert len(finished["curves"]["loss"]["seconds"]) == len(finished["curves"]["loss"]["value"]) == 130


def test_compare_needs_two_different_runs(home, capsys):
    copy_run(home, "finished", FINISHED)
    assert main(["runs", "compare", FINISHED, "last"]) == 2
    assert "needs two or more different runs" in capsys.readouterr().err
    assert main(["runs", "compare", FINISHED, "nothing-like-it"]) == 2


def test_curves_without_json_is_refused(home, capsys):
    copy_run(home, "finished", FINISHED)
    copy_run(home, "crash-fallback", CRASH)
    assert main(["runs", "compare", FINISHED, CRASH, "--curves"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("cockpit: runs compare: --curves: goes with --json"), err


def test_one_differing_setting_is_counted_in_the_singular(home, capsys):
    """engine.numbers.count, as everywhere else: '1 setting differs', never '1 settings differ'."""
    from engine.files import dump_toml, read_toml

    copy_run(home, "finished", FINISHED)
    other = copy_run(home, "finished", "20261123-000003-finished")
    table = read_toml(other / "run.toml")
    table["workload"]["train"]["seed"] = table["workload"]["train"]["seed"] + 1
    (other / "run.toml").write_bytes(dump_toml(table))
    assert main(["runs", "compare", FINISHED, other.name]) == 0
    out = capsys.readouterr().out
    assert "-- 1 setting differs" in out and "settings differ" not in out
    assert _rows(out)["train.seed"] == ["0", "1"]
