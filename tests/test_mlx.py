"""mlx-lm as a first-class command: its output read as it prints it (tests/fixtures/mlx_lm/ is
mlx-lm 0.32.2's own, into a pipe and drawn live), its checkpoints' names, its Metal failures,
the conventions an ad-hoc `cockpit run -- python -m mlx_lm lora ...` gets, and a tiny local
Llama (examples/mlx/tiny_model.py) fine-tuned for real on MLX's CPU build under cockpit:
crashed, resumed from its adapters, counted on from the checkpoint's step."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT, child_env, cockpit_cmd
from engine import command
from engine.command import programs
from engine.command.progress import OutputParser
from engine.command.tracker import Tracker
from engine.record.rundir import list_runs, summarize
from engine.run.crashes import COMMAND, AttemptEnd, classify
from engine.schema import FieldError
from engine.text import strip_ansi

OUTPUT = FIXTURES / "mlx_lm"


def observations(name: str) -> list:
    parser = OutputParser()
    return parser.feed((OUTPUT / name).read_text()) + parser.flush()


# ---------------------------------------------------------------- its output, as it prints it


def test_its_table_gives_steps_losses_evals_and_tokens_per_step():
    """Into a pipe mlx-lm prints only its table: a row every --steps-per-report (10) steps,
    a `val` row at its evaluations, and its bar once, finished, at the end."""
    found = observations("lora_pipe.txt")
    steps = [(o.step, o.loss) for o in found if o.kind == "step" and o.loss is not None]
    assert [s for s, _ in steps] == [10, 20, 30]
    assert steps[-1][1] < steps[0][1]   # its train_loss column, falling as it printed
    evals = [(o.step, o.metrics) for o in found if o.kind == "eval"]
    assert [s for s, _ in evals] == [1, 30] and all(set(m) == {"val_loss"} for _, m in evals)
    assert evals[-1][1]["val_loss"] < evals[0][1]["val_loss"]
    # its cumulative `tokens` column over the step it was printed at; tok/s is not a value
    tokens = [o.facts["tokens_per_step"] for o in found if o.kind == "facts"]
    assert tokens and all(300 < t < 500 for t in tokens)  # 4 paragraphs of ~100 tokens a step
    assert not any("tok_s" in o.metrics or "tokens" in o.metrics for o in found)
    assert (found[-1].step, found[-1].total) == (30, 30)   # the bar, drawn once at the end


def test_its_live_bar_gives_every_step_and_its_val_bar_nothing():
    """Drawn live (cockpit's launch environment makes Rich draw frames), its bar counts every
    step of --iters 12; the `val` bar drawn under it during an evaluation counts nothing."""
    found = observations("lora_live.txt")
    bar = sorted({o.step for o in found if o.kind == "step" and o.source == "rich"})
    assert bar == list(range(0, 13))
    assert {o.total for o in found if o.kind == "step" and o.source == "rich"} == {12}
    assert [o.step for o in found if o.kind == "eval"] == [1, 12]
    assert [o.step for o in found if o.kind == "step" and o.source == "table"] == [4, 8, 12]


def test_the_frame_drawn_with_a_row_never_moves_the_step_back():
    """Drawn live, mlx-lm prints its row for an iteration and with it its bar's frame rendered
    before that iteration: `8  6.307 ▼ ...` then `train ... 7/10` (lora_slow.jsonl, each chunk
    as it came). A run that dies there reached 8, not 7 (the issue's 25 and `24/60`)."""
    import json

    chunks = [json.loads(line)["text"] for line in (OUTPUT / "lora_slow.jsonl").read_text().splitlines()]
    parser = OutputParser()
    steps = [o.step for text in chunks for o in parser.feed(text) if o.kind == "step"]
    assert steps == sorted(steps) and steps[-1] == 10
    # cut right after the row for 8 and the stale frame printed with it
    row = next(i for i, text in enumerate(chunks) if re.search(r"^\s*8\s+[\d.]+ [▼▲]", strip_ansi(text), re.M))
    assert re.search(r"\b7\s*/10", strip_ansi(chunks[row].split("\n", 1)[1]))   # it is in the recording
    parser, tracker, said = OutputParser(), Tracker(), []
    for t, text in enumerate(chunks[:row + 1]):
        for o in parser.feed(text):
            said += tracker.parsed(o, t / 10)
    said += tracker.flush((row + 1) / 10)
    assert tracker.step == 8 and [f["step"] for kind, f in said if kind == "step"][-1] == 8


def test_the_last_rows_loss_is_said_when_its_frame_came_first():
    """Rich's refresh thread may draw `12/12` before mlx-lm prints the row for 12: the window
    closes on the frame, and the row's loss, at the step that window ended on, is the run's
    last: the attempt's end says it."""
    parser, tracker, said = OutputParser(), Tracker(), []
    lines = [(0.0, "  iter   train_loss     tok/s     tokens"),
             (0.0, "train ██████████████████████████▎░░░  88% ·     11/12"),
             (2.5, "train ██████████████████████████████ 100% ·     12/12"),
             (2.6, "    12    6.260 ▼       44      1.2k")]
    for t, line in lines:
        for o in parser.feed(line + "\n"):
            said += tracker.parsed(o, t)
    said += tracker.flush(3.0)
    steps = [f for kind, f in said if kind == "step"]
    assert steps[-1]["step"] == 12 and steps[-1]["loss"] == 6.26
    assert tracker.flush(3.5) == []   # said once


def test_a_table_row_that_does_not_fit_its_header_gives_nothing():
    parser = OutputParser()
    found = parser.feed("  iter   train_loss     tok/s     tokens\n"
                        "  2026 was a good year for small models\n"
                        "    20    1.250 ▲    512    10.2k\n")
    (step,) = [o for o in found if o.kind == "step"]
    assert (step.step, step.loss) == (20, 1.25)
    assert [o.facts for o in found if o.kind == "facts"] == [{"tokens_per_step": 510}]


@pytest.mark.parametrize("name, step", [("0000020_adapters.safetensors", 20),
                                        ("0000100_adapters.safetensors", 100),
                                        ("adapters.safetensors", None)])
def test_its_checkpoints_say_their_step_in_their_name(name, step):
    assert command.step_in_name(f"/runs/x/adapters/{name}") == step


# ---------------------------------------------------------------- its Metal failures


@pytest.mark.parametrize("tail, kind", [
    ("libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command "
     "buffer execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
     "oom"),
    ("Traceback (most recent call last):\n  File \"lora.py\", line 12\nRuntimeError: [metal::malloc] "
     "Attempting to allocate 137438953472 bytes which is greater than the maximum allowed buffer "
     "size of 77309411328 bytes.", "oom"),
    ("libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command "
     "buffer execution failed: Caused GPU Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)",
     "backend"),
])
def test_its_metal_failures_are_classified(tail, kind):
    verdict = classify(AttemptEnd(None if "abi" in tail else 1, "SIGABRT" if "abi" in tail else None,
                                  tail=tail, subject=COMMAND))
    assert verdict.kind == kind
    if kind == "backend":
        assert "MLX/Metal" in verdict.sentence


# ---------------------------------------------------------------- counting on after a resume


def test_a_script_that_counts_again_is_counted_on_from_its_checkpoint():
    """Resumed at step 20, mlx-lm's bar says 0/40 .. 12/40 and its table `12  ...`: steps 20..32
    of 60, its evaluations too."""
    tracker = Tracker(total_steps=0, report_every_s=0.0, resumed_from=20, step_offset=20)
    parser = OutputParser()
    for t, line in enumerate(["  iter   train_loss     tok/s     tokens", "     1    val 6.100    1.00s",
                              "train ░░░░░░░░   0% ·     0/40", "train █░░░░░░░  30% ·    12/40",
                              "    12    6.050 ▼    400    4.8k"]):
        out = []
        for o in parser.feed(line + "\n"):
            out += tracker.parsed(o, float(t))
        if t == 1:
            assert [f["step"] for kind, f in out if kind == "eval"] == [21]
    assert tracker.step == 32 and tracker.total == 60


# ---------------------------------------------------------------- an ad-hoc command's conventions


@pytest.mark.parametrize("argv", [
    ["python", "-m", "mlx_lm", "lora", "--train", "--iters", "600"],
    ["python", "-m", "mlx_lm.lora", "--train", "--iters=600"],
    ["/usr/local/bin/mlx_lm.lora", "--train", "--iters", "600"],
    ["python", "-m", "cockpit.integrations.mlx", "--device", "{mlx_device}", "-m", "mlx_lm", "lora",
     "--iters", "600"],
])
def test_mlx_lm_lora_commands_get_its_resume_and_checkpoints(argv):
    table = programs.conventions(argv)
    assert table["resume"] == ["--resume-adapter-file", "{checkpoint}", "--iters", "{steps_left}"]
    assert table["checkpoints"] == os.path.join("adapters", "*_adapters.safetensors")
    assert table["steps_restart"] is True and "adapter weights only" in table["resume_restores"]
    assert "total_steps" not in table   # --iters says it


def test_its_adapter_path_and_default_iters_are_taken_as_mlx_lm_takes_them():
    table = programs.conventions(["python", "-m", "mlx_lm", "lora", "--adapter-path", "{run_dir}/a"])
    assert table["checkpoints"] == os.path.join("{run_dir}/a", "*_adapters.safetensors")
    assert table["total_steps"] == programs.MLX_LM_ITERS
    assert programs.conventions(["python", "train.py", "--iters", "5"]) == {}
    assert programs.conventions(["python", "-m", "mlx_lm", "generate", "--prompt", "hi"]) == {}


def test_steps_left_needs_the_runs_total():
    with pytest.raises(FieldError) as e:
        command.CommandSpec(command=("python", "t.py"), resume=("--iters", "{steps_left}"))
    assert e.value.key == "resume" and "total" in str(e.value)
    command.CommandSpec(command=("python", "t.py", "--iters", "9"), resume=("--iters", "{steps_left}"))


# ---------------------------------------------------------------- for real, on MLX's CPU build


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("mlx_lm", reason="the test extra installs mlx-lm (and mlx[cpu] on Linux)")
    where = tmp_path_factory.mktemp("mlx")
    subprocess.run([sys.executable, str(ROOT / "examples" / "mlx" / "tiny_model.py"), str(where)],
                   check=True, capture_output=True, env=child_env(), timeout=300)
    return where


def test_mlx_lm_crashes_and_resumes_from_its_adapters_under_cockpit(tiny, home):
    """`cockpit run -- python -m cockpit.integrations.mlx ... -m mlx_lm lora`, no preset: a native
    crash at step 10 resumes from 0000008_adapters.safetensors with the 8 steps left, and the
    run ends at step 16 of 16 with its checkpoints at the run's steps."""
    argv = [sys.executable, "-m", "cockpit.integrations.mlx", "--device", "{mlx_device}",
            "-m", "mlx_lm", "lora", "--model", str(tiny / "model"), "--train", "--data", str(tiny / "data"),
            "--iters", "16", "--batch-size", "{batch_size}", "--grad-accumulation-steps", "{accumulation}",
            "--save-every", "4", "--steps-per-report", "2", "--steps-per-eval", "8",
            "--learning-rate", "1e-2", "--adapter-path", "{run_dir}/adapters"]
    done = subprocess.run(cockpit_cmd("run", "-d", "mlx-cpu", "--set", "batch_size=2",
                                      "--inject", "native-crash@10", "--", *argv),
                          capture_output=True, text=True, env=child_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list_runs()
    events = run.events()
    started = [e for e in events if e["type"] == "attempt_started"]
    assert len(started) == 2
    second = started[1]["command"]
    resumed_from = second[second.index("--resume-adapter-file") + 1]
    assert resumed_from.endswith("0000008_adapters.safetensors")
    assert second[second.index("--iters", second.index("--resume-adapter-file")) + 1] == "8"
    assert "adapter weights only" in started[1]["resume"]["restores"]
    assert "adapter weights only" in done.stdout   # said where the resume is
    steps = [e for e in events if e["type"] == "step"]
    first, resumed = ([e for e in steps if e["attempt"] == a] for a in (1, 2))
    assert max(e["step"] for e in first) <= 10   # the step the fault fired at may close a window
    # counted on, not from 0 again (a step read in the attempt's first look has no window to
    # begin: its own step, which a loaded machine reads in one burst with the next ones)
    assert min(e.get("from_step", e["step"]) for e in resumed) >= 8
    assert resumed[-1]["step"] == 16 and resumed[-1]["total"] == 16
    saved = {e["step"] for e in events if e["type"] == "checkpoint" and e["attempt"] == 2}
    assert saved == {12, 16}   # its files 0000004_ and 0000008_adapters, at the run's steps
    losses = [e["loss"] for e in steps if e.get("loss") is not None]
    assert losses[-1] < losses[0], losses
    assert any(e.get("tokens_per_s") for e in resumed)
    summary = summarize(run)
    assert summary.status == "finished"
    # the figures shown are the script's own: its last train_loss and val rows, as it printed them
    printed = strip_ansi((run.path / "attempt-2.log").read_text())
    rows = re.findall(r"^\s*(\d+)\s+(val )?(\d+\.\d+)", printed, re.M)
    assert summary.loss == float(next(loss for _, val, loss in reversed(rows) if not val))
    assert summary.metrics["val_loss"] == float(next(loss for _, val, loss in reversed(rows) if val))


def test_its_iterations_are_micro_batches_so_a_step_is_one_batch():
    """mlx-lm's --iters, table and bar count micro-batches (it updates every
    --grad-accumulation-steps of them): a step is --batch-size samples, not batch x accumulation."""
    from engine.preset_types import DevicePreset

    argv = ["python", "-m", "mlx_lm", "lora", "--iters", "9", "--batch-size", "{batch_size}",
            "--grad-accumulation-steps", "{accumulation}"]
    spec = command.CommandSpec(command=tuple(argv), steps_are_micro_batches=programs.conventions(argv)["steps_are_micro_batches"])
    assert command.units(spec, DevicePreset(batch_size=4, accumulation=2)).samples_per_step == 4
    script = command.CommandSpec(command=("python", "train.py", "--bs", "{batch_size}", "--accum", "{accumulation}"))
    assert command.units(script, DevicePreset(batch_size=4, accumulation=2)).samples_per_step == 8


def test_an_adopted_mlx_lm_run_knows_its_adapters_and_resume():
    """`nohup python -m mlx_lm lora ... &` adopted: a later `cockpit runs resume` continues from
    its newest adapters, as a command run of it would."""
    from engine.run.adoption import Adoption, config_for

    argv = ["python", "-m", "mlx_lm", "lora", "--train", "--iters", "600", "--adapter-path", "out"]
    spec = config_for(Adoption(pid=1, start=0.0, argv=argv, cwd="/tmp", env={}), "lora").workload.params
    assert spec.checkpoints == os.path.join("out", "*_adapters.safetensors") and spec.steps_restart
    assert spec.resume[:2] == ("--resume-adapter-file", "{checkpoint}")


def test_prose_that_starts_like_a_table_is_no_table():
    """`Step through the data first` is no header (no loss column), so `12 3.5` after it is no
    step; after a real header, `10 epochs 5` is no eval (epochs is no evaluation's label)."""
    parser = OutputParser()
    assert parser.feed("Step through the data first\n12 3.5\n") == []
    parser = OutputParser()
    found = parser.feed("iter train_loss tokens\n10 epochs 5\n")
    assert not [o for o in found if o.kind == "eval"]


def test_the_launcher_runs_a_script_on_the_device_it_is_given_and_refuses_a_missing_gpu(tmp_path):
    """cockpit.integrations.mlx sets MLX's default device, then runs the script unchanged; a GPU
    MLX does not have here is refused as argparse refuses (exit 2), which a run reads as config."""
    mx = pytest.importorskip("mlx.core", reason="the test extra installs MLX (its CPU build on Linux)")
    script = tmp_path / "where.py"
    script.write_text("import sys, mlx.core as mx\nprint(mx.default_device(), sys.argv[1:])\n")
    ran = subprocess.run([sys.executable, "-m", "cockpit.integrations.mlx", "--device", "cpu", str(script),
                          "--epochs", "3"], capture_output=True, text=True, env=child_env(), timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "cpu" in ran.stdout.lower() and "['--epochs', '3']" in ran.stdout
    if mx.is_available(mx.gpu):
        return  # a Mac (or MLX's CUDA build): nothing to refuse
    refused = subprocess.run([sys.executable, "-m", "cockpit.integrations.mlx", "--device", "gpu", str(script)],
                             capture_output=True, text=True, env=child_env(), timeout=120)
    assert refused.returncode == 2 and "argument --device" in refused.stderr
    verdict = classify(AttemptEnd(2, None, tail=refused.stderr, subject=COMMAND))
    assert verdict.kind == "config"


def test_a_rich_panels_padded_rows_are_no_bar_and_cost_no_backtracking():
    """mlx-lm's banner: rows of a Rich panel, coloured and padded with spaces. The percent bar's
    pattern once let three quantifiers share those spaces: 1.5 s for one 235-character row, the
    supervisor's loop stalled 5-8 s at every mlx-lm attempt's start (its memory samples and the
    first steps' times with it). Each row here is read as no bar; a row ten times as long with
    a '%' and a '·' in it would not finish in this suite's time without the fix."""
    from engine.command import progress_bars

    row = ("\x1b[34m│\x1b[0m    \x1b[39mmax seq      \x1b[0m   \x1b[1m26\x1b[0m" + " " * 180)
    long_row = "│ lora · 16 layers · rank 8 ·" + " " * 2000 + "5% · x"
    for line in (row, long_row, row.replace("26", "26 · 50%")):
        assert progress_bars.percent_bar(line) is None and progress_bars.rich_bar(line) is None
    (seen,) = progress_bars.percent_bar("Training ━━━━━━━━━━╺━━━━━━━━━  52% · 13/25") or [None]
    assert (seen.step, seen.total) == (13, 25)
