"""What cockpit says about a user's own script is true (issues 26, 39): each shape in
tests/scripts/shapes/ (nanoGPT, run_clm under the HF Trainer, Lightning's Rich bar with
accumulation 2, note 001's per-epoch micro-batch counter, TRL's GRPO, slow steps under a Rich
bar that redraws itself, mlx-lm's LoRA at a Mac's pace) runs under `cockpit run` with a crash
injected after a checkpoint (step 30; 5 and 6 for the slow ones) and resumes through its own
resume argument; every figure of `cockpit runs show RUN --json` and of its step lines must
equal what the script wrote down itself. The comparison is benchmarks/command_fidelity.py's,
which prints the same figures as a table."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT, child_env

_spec = importlib.util.spec_from_file_location("command_fidelity", ROOT / "benchmarks" / "command_fidelity.py")
fidelity = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fidelity  # its dataclasses look their module up there
_spec.loader.exec_module(fidelity)

# The benchmark holds samples/s to 25 %, the step lines' rates to 15 % and the ETA at half-way
# to 25 %; here a loaded machine's polling must never fail a test (timing is measured in
# benchmarks/), so only a misreading fails it: the smallest misread unit, an accumulation of 2,
# is a factor of 2, as are the rate and ETA of 2 s steps timed by windows that lose the seconds
# in which the bar redrew the same count.
RATE_TOLERANCE = 0.45

@pytest.mark.parametrize("shape", list(fidelity.SHAPES))
def test_every_figure_is_the_scripts_own(home, shape):
    if fidelity.SHAPES[shape].needs:
        pytest.importorskip(fidelity.SHAPES[shape].needs)
    result = fidelity.run_shape(shape, child_env(), home / "runs", timeout=240,
                                rate_tolerance=RATE_TOLERANCE, line_tolerance=RATE_TOLERANCE,
                                eta_tolerance=RATE_TOLERANCE)
    assert result.returncode == 0, result.output[-4000:]
    assert result.outcomes == ["native-crash", "finished"], result.output[-4000:]
    first, second = result.truth["attempts"]
    # the yardstick itself: the crash came after a checkpoint, the script resumed from it and
    # trained some steps again, so steps lost and the checkpoint count are put to the test
    assert 0 < second["resumed_from"] < first["reached"] and second["finished"]
    wrong = [r.figure for r in result.rows if r.verdict not in ("exact", "ok")]
    assert not wrong, f"{shape}: {wrong} differ from the script's truth\n" + fidelity.table([result])
