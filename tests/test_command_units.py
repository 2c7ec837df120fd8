"""What a command's step is, and where cockpit learnt it (engine.command.tracker, .units): samples
and tokens per step with their source, never guessed; batch counters turned into optimizer steps
where the accumulation is known; the total and its source; and the checkpoint a script rewrites
under one name, each write with the step it holds, so that a crash recurring at the step it
resumed from is not taken for progress."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import FIXTURES, child_env, cockpit_cmd
from engine import command
from engine.command import statements
from engine.command.progress import OutputParser
from engine.command.tracker import Tracker, Units
from engine.preset_types import DevicePreset
from engine.record.rundir import list_runs


def feed(tracker: Tracker, lines: list[str], parser: OutputParser | None = None,
         every_s: float = 1.0) -> list[dict]:
    """The step events the tracker makes of these lines, one line per `every_s` of the script."""
    parser = parser or OutputParser(known=tracker.known)
    steps = []
    for i, line in enumerate(lines):
        for obs in parser.feed(line + "\n"):
            steps += [f for kind, f in tracker.parsed(obs, float(i) * every_s) if kind == "step"]
    return steps + [f for kind, f in tracker.flush(len(lines) * every_s) if kind == "step"]


def spec(*argv: str, **settings) -> command.CommandSpec:
    return command.CommandSpec(command=("python", "train.py", *argv), **settings)


def test_samples_are_never_guessed_where_nothing_says_them():
    units = command.units(spec("--bs", "{batch_size}"), DevicePreset(batch_size=32))
    assert units.samples_per_step is None and units.samples_source == "unknown"
    steps = feed(Tracker(units), [f"step {i} loss={1 / i:.3f}" for i in range(1, 6)])
    assert steps and all(s["samples_seen"] is None and s["samples_per_s"] is None for s in steps)
    assert steps[-1]["steps_per_s"] > 0
    assert steps[-1]["units"]["samples_source"] == "unknown"


def test_placeholders_give_samples_only_with_batch_and_accumulation():
    preset = DevicePreset(batch_size=8, accumulation=4)
    both = command.units(spec("--bs", "{batch_size}", "--accum", "{accumulation}"), preset)
    assert (both.samples_per_step, both.samples_source) == (32, "placeholders")
    assert (both.accumulation, both.accumulation_source) == (4, "placeholders")
    effective = command.units(spec("--global-batch", "{effective_batch}"), preset)
    assert (effective.samples_per_step, effective.samples_source) == (32, "placeholders")
    # a literal accumulation argument beside {batch_size} says it too
    argv = ["--bs", "8", "--accumulate_grad_batches", "2"]
    literal = command.units(spec("--bs", "{batch_size}", "--accumulate_grad_batches", "2"), preset,
                            statements.from_argv(argv))
    assert (literal.samples_per_step, literal.accumulation, literal.accumulation_source) == (16, 2, "argv")
    # the preset's own figure wins over what the placeholders imply
    told = command.units(spec("--bs", "{batch_size}", "--accum", "{accumulation}",
                              samples_per_step=100), preset)
    assert (told.samples_per_step, told.samples_source) == (100, "preset")


def test_the_scripts_own_statement_outranks_the_placeholders():
    preset = DevicePreset(batch_size=8, accumulation=4)
    units = command.units(spec("--bs", "{batch_size}", "--accum", "{accumulation}"), preset)
    tracker = Tracker(units)
    steps = feed(tracker, [
        "  Total train batch size (w. parallel, distributed & accumulation) = 64",
        "  Total optimization steps = 10",
        *[f"step {i} loss={1 / i:.3f}" for i in range(1, 6)]])
    last = steps[-1]
    assert last["units"]["samples_per_step"] == 64 and last["units"]["samples_source"] == "stated"
    assert "Total train batch size" in last["units"]["said"]
    assert last["samples_seen"] == 64 * last["step"]
    assert (last["total"], last["total_source"]) == (10, "stated")


def test_tokens_per_step_stated_by_the_script_give_tokens_per_second():
    steps = feed(Tracker(Units()), ["tokens per iteration will be: 8,192",
                                    *[f"iter {i}: loss {3 - i / 10:.4f}, time 10.00ms" for i in range(1, 6)]])
    last = steps[-1]
    assert last["units"]["tokens_per_step"] == 8192 and last["units"]["tokens_source"] == "stated"
    assert last["tokens_seen"] == 8192 * last["step"]
    windows = [s for s in steps if s.get("tokens_per_s") is not None]
    assert windows and all(s["tokens_per_s"] == s["steps_per_s"] * 8192 for s in windows)
    assert last["samples_seen"] is None   # tokens say nothing of samples


def test_a_per_epoch_batch_counter_becomes_optimizer_steps_with_the_accumulation():
    # 8 batches an epoch, accumulation 2: 4 optimizer steps an epoch, 3 epochs = 12 steps
    lines = [f"epoch {e} batch {b}/8 loss {1 / (e * 8 + b):.4f}" for e in range(1, 4) for b in range(1, 9)]
    tracker = Tracker(Units(accumulation=2, accumulation_source="placeholders"),
                      known={"epochs": (3, "--epochs 3")})
    steps = feed(tracker, lines)
    assert steps[-1]["step"] == 12 and steps[-1]["total"] == 12
    assert steps[-1]["units"]["counter"] == "steps"
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps)  # never restarts


def test_a_batch_counter_of_unknown_accumulation_is_said_to_count_batches():
    lines = [f"epoch {e} batch {b}/8 loss 0.5" for e in range(1, 3) for b in range(1, 9)]
    steps = feed(Tracker(Units()), lines)
    assert steps[-1]["step"] == 16 and steps[-1]["units"]["counter"] == "batches"


def test_the_total_comes_from_the_preset_then_the_output_then_the_statement_then_the_argv():
    argv = {"total": (200, "--max_iters=200")}
    lines = [f"iter {i}: loss 1.0" for i in range(1, 5)]
    assert feed(Tracker(Units(), known=argv), lines)[-1]["total_source"] == "argv"
    stated = feed(Tracker(Units(), known=argv), ["Overriding: max_iters = 150", *lines])[-1]
    assert (stated["total"], stated["total_source"]) == (150, "stated")
    counted = feed(Tracker(Units(), known=argv), [f"step {i}/120 loss=1.0" for i in range(1, 5)])[-1]
    assert (counted["total"], counted["total_source"]) == (120, "output")
    preset = feed(Tracker(Units(), total_steps=90, known=argv), lines)[-1]
    assert (preset["total"], preset["total_source"]) == (90, "preset")
    assert feed(Tracker(Units()), lines)[-1]["total"] is None


def test_no_total_is_said_once_with_how_to_give_it():
    tracker, parser, said = Tracker(Units()), OutputParser(), []
    for i in range(1, 8):
        for obs in parser.feed(f"iter {i}: loss 1.0\n"):
            said += [f for kind, f in tracker.parsed(obs, float(i)) if kind == "warning"]
    (warning,) = said
    assert warning["kind"] == "no-total" and "command.total_steps" in warning["advice"][0]["text"]


# Rewrites one `last.json` every 20 steps, and at the step it resumed from (nanoGPT re-saves its
# ckpt.pt there); crashes at step 30 whenever it gets there: a crash that recurs at the same step.
RECURRING = """\
    import json, os, sys, time
    out, resume = sys.argv[1], sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    start = json.load(open(resume[-1]))["step"] if resume else 0
    def save(step):
        tmp = os.path.join(out, "tmp")
        with open(tmp, "w") as f:
            json.dump({"step": step}, f)
        os.replace(tmp, os.path.join(out, "last.json"))
    if resume:
        save(start)
    for step in range(start + 1, 61):
        time.sleep(0.02)
        print(f"step {step}/60 loss={1 / step:.4f}", flush=True)
        if step == 30:
            os.abort()
        if step % 20 == 0:
            save(step)
"""


def test_a_crash_recurring_at_the_resumed_step_is_not_progress(home, tmp_path):
    """The retry-progress rule retries a native crash while each attempt gets a checkpoint
    further. Attempt 2 rewrites last.json at step 20 where it resumed, and crashes at 30 again:
    no step further, so the ladder moves on rather than retrying the same thing."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(RECURRING))
    done = subprocess.run(cockpit_cmd(
        "run", "-d", "cpu", "--set", "command.resume=['{checkpoint}']",
        "--set", "command.checkpoints={run_dir}/out/*.json",
        "--", sys.executable, str(path), "{run_dir}/out"),
        capture_output=True, text=True, env=child_env(), timeout=120)
    (run,) = list_runs()
    events = run.events()
    checkpoints = [e for e in events if e["type"] == "checkpoint"]
    # each write of the one file is an event, with a step no later than the one it holds
    assert [e["step_source"] for e in checkpoints] and {e["step_source"] for e in checkpoints} == {"reached"}
    assert len(checkpoints) >= 2
    assert all(e["step"] is not None and e["step"] <= 20 for e in checkpoints)
    # and what it says of one is only what is known: the step read before it was written
    assert "checkpoint after step" in done.stdout and "checkpoint at step" not in done.stdout
    assert "last.json (after step" in done.stdout   # attempt 2's `resuming from` line
    # attempt 1 got a checkpoint (step 20) and is retried; attempt 2 got none further and
    # the ladder has nowhere to go (-d cpu): the run ends there, not after max_attempts retries
    assert [e["outcome"] for e in events if e["type"] == "attempt_ended"] == \
        ["native-crash", "native-crash"], done.stdout + done.stderr
    (fallback,) = [e for e in events if e["type"] == "fallback"]
    assert fallback["to_preset"] == fallback["from"]
    assert done.returncode != 0


def test_a_lightning_bar_resumed_mid_epoch_counts_on_past_its_total():
    """Lightning's bar after a mid-epoch resume counts on from the resumed batch (100) towards a
    total of what is left (70): its count, not that total, is the epoch's batches."""
    tracker = Tracker(Units(accumulation=2, accumulation_source="argv"), resumed_from=50,
                      known={"total": (120, "--max_steps 120")})
    frames = [f"Epoch 0/-2 ━━━━━━━━━━━━━━━━━━━━ {b}/70 0:00:01 • 0:00:00 125.44it/s train_loss: 5.331"
              for b in range(105, 241, 5)]
    steps = feed(tracker, frames)
    assert steps[-1]["step"] == 120 and steps[-1]["total"] == 120
    assert all(50 <= s["step"] <= 120 for s in steps)


def test_each_write_of_a_checkpoint_is_one_checkpoint_a_directory_once_it_is_written(home, tmp_path):
    """One file rewritten (nanoGPT's ckpt.pt) is a checkpoint at each write, with the step read
    by then; seen again with no step read between, it is the same save. A directory filled a
    file at a time (the HF Trainer's checkpoint-20/) is one, told once it has stayed the same
    for a look, and still one when seen again (its name's step); one whose name says no step
    (accelerate's save_state into state/), written again in place after more steps, is another."""
    import os
    from types import SimpleNamespace
    from engine import runconfig
    from engine.record.events import EventWriter
    from engine.record.rundir import RunDir
    from engine.run.kinds import CommandKind

    out = tmp_path / "out"
    out.mkdir()
    config = runconfig.resolve_command(["python", "train.py"], "script", "cpu",
                                       [f"command.checkpoints={out}/*"])
    run = RunDir.create(config)

    def at(path, mtime):
        path.touch()
        os.utime(path, (mtime, mtime))

    with EventWriter(run.events_path, attempt=1) as events:
        kind = CommandKind(run, config, events)
        kind.since = 0.0
        kind._watch = SimpleNamespace(attempt=1)
        kind._steps_read.append((100.0, 7))   # step 7 was read at t=100
        at(out / "ckpt.pt", 150.0)
        kind.look_for_checkpoints()
        kind.look_for_checkpoints()           # nothing new: no second event
        kind._steps_read.append((200.0, 12))
        at(out / "ckpt.pt", 250.0)            # the same file written again, later
        kind.look_for_checkpoints()
        at(out / "ckpt.pt", 250.5)            # ... seen mid-write, then done: no step between,
        kind.look_for_checkpoints()           # the same save, not another checkpoint
        folder = out / "checkpoint-20"
        folder.mkdir()
        at(folder / "config.json", 300.0)
        os.utime(folder, (300.0, 300.0))
        kind.look_for_checkpoints()           # being written: not yet
        at(folder / "model.safetensors", 301.0)
        os.utime(folder, (301.0, 301.0))      # (a new entry: the directory's mtime too)
        kind.look_for_checkpoints()           # still being written
        kind.look_for_checkpoints()           # the same as at the last look: written
        kind.look_for_checkpoints()
        at(folder / "model.safetensors", 400.0)   # seen again, changed: still the save of step 20
        kind.look_for_checkpoints()
        kind.look_for_checkpoints()
        state = out / "state"
        state.mkdir()
        at(state / "model.safetensors", 500.0)
        os.utime(state, (500.0, 500.0))
        kind.look_for_checkpoints()
        kind.look_for_checkpoints()
        kind._steps_read.append((550.0, 30))
        at(state / "model.safetensors", 600.0)   # written again in place, steps later
        kind.look_for_checkpoints()
        kind.look_for_checkpoints(final=True)
    said = [(e["path"].rsplit("/", 1)[-1], e["step"], e["step_source"])
            for e in run.events() if e["type"] == "checkpoint"]
    assert said == [("ckpt.pt", 7, "reached"), ("ckpt.pt", 12, "reached"),
                    ("checkpoint-20", 20, "name"), ("state", 12, "reached"), ("state", 30, "reached")]


def command_kind(home, checkpoints: str):
    """A command's kind in the middle of attempt 1, its checkpoints the glob `checkpoints`."""
    from types import SimpleNamespace
    from engine import runconfig
    from engine.record.events import EventWriter
    from engine.record.rundir import RunDir
    from engine.run.kinds import CommandKind

    config = runconfig.resolve_command(["python", "train.py"], "script", "cpu",
                                       [f"command.checkpoints={checkpoints}"])
    run = RunDir.create(config)
    events = EventWriter(run.events_path, attempt=1)
    kind = CommandKind(run, config, events)
    kind.since = 0.0
    kind._watch = SimpleNamespace(attempt=1, numerical=None)
    kind._rehearsal = SimpleNamespace(at_step=lambda step, reported: None)
    kind.tracker = Tracker(Units())
    return run, events, kind


def test_an_hf_save_in_pieces_is_one_checkpoint_however_often_it_is_seen(home, tmp_path):
    """A real HF save (tests/fixtures/outputs/hf_checkpoint_pieces.json: the Trainer's files in
    the order it wrote them), looked at twice after each piece, as a loaded supervisor can while
    the Trainer works on the next one: one checkpoint, not one per pause."""
    import os

    pieces = json.loads((FIXTURES / "outputs" / "hf_checkpoint_pieces.json").read_text())["files"]
    out = tmp_path / "out"
    folder = out / "checkpoint-10"
    folder.mkdir(parents=True)
    run, events, kind = command_kind(home, f"{out}/checkpoint-*")
    with events:
        for piece in pieces:
            path, when = folder / piece["name"], 1000.0 + piece["after_s"]
            path.write_bytes(b"\0" * piece["bytes"])
            os.utime(path, (when, when))
            kind.look_for_checkpoints()
            kind.look_for_checkpoints()
        kind.look_for_checkpoints(final=True)
    said = [(e["path"], e["step"]) for e in run.events() if e["type"] == "checkpoint"]
    assert said == [(str(folder), 10)]


def progress(t: float, step: int) -> dict:
    """cockpit.report.step's event, as the script writes it."""
    return {"v": 1, "t": t, "type": "progress", "attempt": 1, "step": step, "total": 12,
            "loss": None, "samples": None, "metrics": {}}


def test_a_save_the_script_reports_is_not_told_again_from_its_glob(home, tmp_path):
    """The HF callback reports checkpoint-10 after the Trainer wrote it; the glob sees the
    directory first. Told from the glob only once the script has reported a step after the
    write, by when its own report of the save has been read: one checkpoint. A save it does not
    report (a final one written after its last step) is told at its exit."""
    import os

    out = tmp_path / "out"
    run, events, kind = command_kind(home, f"{out}/checkpoint-*")
    folder = out / "checkpoint-10"
    folder.mkdir(parents=True)
    with events:
        kind.see(progress(900.0, 10))
        (folder / "model.safetensors").write_bytes(b"weights")
        os.utime(folder / "model.safetensors", (1000.0, 1000.0))
        for _ in range(3):                     # settled, but the script has said nothing since
            kind.look_for_checkpoints()
        reported = {"type": "checkpoint", "t": 1000.1, "attempt": 1, "step": 10,
                    "path": str(folder), "source": "report"}
        kind.checkpoints[str(folder)] = reported   # as the supervisor's pump records it
        kind.see(progress(1001.0, 11))
        kind.look_for_checkpoints()
        final = out / "checkpoint-12"
        final.mkdir()
        (final / "model.safetensors").write_bytes(b"weights")
        os.utime(final / "model.safetensors", (1100.0, 1100.0))
        kind.look_for_checkpoints()
        kind.look_for_checkpoints()
        kind.look_for_checkpoints(final=True)
    told = [(e["path"], e["step"]) for e in run.events() if e["type"] == "checkpoint"]
    assert told == [(str(final), 12)]


def test_the_last_window_ends_at_its_last_step_not_at_the_exit():
    """Steps read in the same poll that closed a window, then 20 s of a final eval and save:
    the end of the attempt is no training, and its steps are a sighting, not a 20 s window."""
    tracker = Tracker(Units(), report_every_s=1.0)
    parser, produced = OutputParser(), []
    for i in range(1, 41):          # 10 steps a second, read every 0.5 s
        for obs in parser.feed(f"step {i}/45 loss 1.0\n"):
            produced += tracker.parsed(obs, 0.5 * ((i + 4) // 5))
    for i in range(41, 46):         # read with the poll that closed the last window
        for obs in parser.feed(f"step {i}/45 loss 1.0\n"):
            produced += tracker.parsed(obs, 0.5 * (41 // 5 + 1))
    produced += tracker.flush(24.0)
    windows = [f for kind, f in produced if kind == "step" and f.get("window_s")]
    assert all(f["steps_per_s"] >= 5 for f in windows), windows
    assert [f for kind, f in produced if kind == "step"][-1]["step"] == 45


def test_samples_after_a_fallback_that_changed_the_batch_go_on_from_the_checkpoints():
    """20 steps of 32 samples, then a fallback at 16: the checkpoint's count, then 16 a step."""
    first = Tracker(Units(32, "placeholders"))
    feed(first, [f"step {i} loss 1.0" for i in range(1, 21)])
    assert first.samples_at(20) == 640
    second = Tracker(Units(16, "placeholders"), resumed_from=20, resumed_samples=first.samples_at(20))
    last = feed(second, [f"step {i} loss 1.0" for i in range(21, 61)])[-1]
    assert last["samples_seen"] == 640 + 40 * 16


def test_a_resumed_attempt_that_dies_before_its_first_step_is_at_the_resumed_step():
    """The HF Trainer draws 0/60 before it jumps to the resumed step: dying in between, the
    attempt got to where it resumed, not to step 0."""
    tracker = Tracker(Units(), resumed_from=20)
    steps = feed(tracker, ["  0%|          | 0/60 [00:00<?, ?it/s]"])
    assert [s["step"] for s in steps] == [20]


def test_max_steps_ends_a_run_before_its_epochs_do():
    tracker = Tracker(Units(accumulation=2, accumulation_source="argv"),
                      known={"total": (60, "--max_steps 60"), "epochs": (10, "--max_epochs 10")})
    frames = [f"Epoch 0/9 ━━━━━━━━━━━━━━━━━━━━ {b}/40 0:00:01 • 0:00:00 125.44it/s train_loss: 5.3"
              for b in range(1, 41)]
    last = feed(tracker, frames)[-1]
    assert (last["step"], last["total"], last["total_source"]) == (20, 60, "argv")


def test_a_loops_own_epoch_lines_step_only_on_whole_groups_and_a_bar_on_the_last_one_too():
    # 5 batches an epoch, accumulation 2: a loop stepping on (b + 1) % 2 == 0 steps twice an
    # epoch; Lightning's bar steps a third time on the epoch's last, partial group
    units = Units(accumulation=2, accumulation_source="placeholders")
    loop = feed(Tracker(units), [f"epoch {e} batch {b}/5 loss 0.5" for e in (1, 2) for b in range(1, 6)],
                every_s=0.5)
    assert loop[-1]["step"] == 4
    bar = feed(Tracker(units), [f"Epoch {e}/1 ━━━━━━━━━━━━━━━━━━━━ {b}/5 0:00:01 • 0:00:00 5.00it/s "
                                f"train_loss: 0.5" for e in (0, 1) for b in range(1, 6)], every_s=0.5)
    assert bar[-1]["step"] == 6


def test_lightnings_bar_over_a_dataset_of_no_length_counts_batches_towards_max_steps():
    """Its total is max_steps (optimizer steps) while it counts batches: 600 batches at an
    accumulation of 2 are step 300 of 300, not a count frozen at its total."""
    tracker = Tracker(Units(accumulation=2, accumulation_source="argv"),
                      known={"total": (300, "--max_steps 300")})
    frames = [f"Epoch 0/-2 ━━━━━━━━━━━━━━━━━━━━ {b}/300 0:00:01 • 0:00:00 125.44it/s train_loss: 5.3"
              for b in range(1, 601)]
    steps = [s["step"] for s in feed(tracker, frames)]
    assert steps[-1] == 300 and steps == sorted(steps)


def test_a_continued_run_numbers_its_epochs_as_the_supervisor_before_it_did(home, tmp_path):
    """A script counting epochs from 0, continued (`cockpit runs resume`) at epoch 2: the new
    supervisor takes the base the last one settled from the step events, and `epoch 2 batch
    1/10` is batch 21, not 11."""
    from types import SimpleNamespace
    from engine import runconfig
    from engine.record.events import EventWriter
    from engine.record.rundir import RunDir
    from engine.run.kinds import CommandKind
    from engine.run.resume import History

    config = runconfig.resolve_command(["python", "train.py"], "script", "cpu", [])
    run = RunDir.create(config)
    earlier = [{"type": "step", "t": 1.0, "attempt": 1, "step": 12, "epoch_base": 0}]
    with EventWriter(run.events_path, attempt=2) as events:
        kind = CommandKind(run, config, events)
        kind.continue_from(History.of(earlier))
        launch = SimpleNamespace(parser=lambda epoch_base=None: OutputParser(epoch_base=epoch_base))
        (o,) = kind.parser(launch).feed("epoch 2 batch 1/10 loss 0.5\n")
    assert o.step == 21


def test_a_file_rewritten_faster_than_it_is_seen_is_counted_as_a_lower_bound(home, tmp_path, monkeypatch):
    """A last.pt rewritten every 0.1 s, a step trained between writes: no look ever finds it
    still for FILE_SETTLE_S, so its writes before the last are never told. The count says so
    ('at least'), in runs show and its JSON, rather than passing one checkpoint off as all."""
    import os
    from types import SimpleNamespace

    from cockpit.commands.runs import checkpoints_text
    from engine.record.rundir import summarize
    from engine.run import kinds

    clock = [1000.0]
    monkeypatch.setattr(kinds, "time", SimpleNamespace(time=lambda: clock[0]))
    out = tmp_path / "out"
    out.mkdir()
    run, events, kind = command_kind(home, f"{out}/last.pt")
    with events:
        for step in range(1, 6):
            clock[0] += 0.1
            kind.see(progress(clock[0], step))
            (out / "last.pt").write_bytes(b"state")
            os.utime(out / "last.pt", (clock[0], clock[0]))
            kind.look_for_checkpoints()        # a moment after the write: not still yet
        kind.look_for_checkpoints(final=True)
    (told,) = [e for e in run.events() if e["type"] == "checkpoint"]
    assert told["writes_unseen"] is True
    summary = summarize(run)
    assert summary.checkpoints_at_least
    assert checkpoints_text(summary).startswith("at least 1 checkpoint")


def test_a_torch_save_seen_mid_write_is_no_lower_bound(home, tmp_path, monkeypatch):
    """One save seen twice while it was written, no step between: one save, its count exact."""
    import os
    from types import SimpleNamespace

    from engine.run import kinds

    clock = [1000.0]
    monkeypatch.setattr(kinds, "time", SimpleNamespace(time=lambda: clock[0]))
    out = tmp_path / "out"
    out.mkdir()
    run, events, kind = command_kind(home, f"{out}/last.pt")
    with events:
        kind.see(progress(clock[0], 1))
        for _ in range(3):
            clock[0] += 0.1
            (out / "last.pt").write_bytes(b"state")
            os.utime(out / "last.pt", (clock[0], clock[0]))
            kind.look_for_checkpoints()
        clock[0] += 1.0
        kind.see(progress(clock[0], 2))        # still since, and the script has gone on
        kind.look_for_checkpoints()
    (told,) = [e for e in run.events() if e["type"] == "checkpoint"]
    assert told["step"] == 1 and "writes_unseen" not in told


def test_a_save_after_a_step_read_late_gets_that_step(home, tmp_path, monkeypatch):
    """A loaded supervisor reads `step 50` a second after the script printed it and saved: the
    save is after step 50 (the log was last written before the save), not after step 48."""
    import os
    from types import SimpleNamespace

    from engine.command.progress import OutputParser
    from engine.run import kinds

    clock = [1000.0]
    monkeypatch.setattr(kinds, "time", SimpleNamespace(time=lambda: clock[0]))
    out = tmp_path / "out"
    out.mkdir()
    run, events, kind = command_kind(home, f"{out}/last.pt")
    parser = OutputParser()
    with events:
        kind.progress(parser.feed("step 48/100 loss 0.5\n"), False, written_by=999.0)
        # printed at 1000.2, saved at 1000.5, read at 1001.5
        clock[0] = 1001.5
        (out / "last.pt").write_bytes(b"state")
        os.utime(out / "last.pt", (1000.5, 1000.5))
        kind.progress(parser.feed("step 50/100 loss 0.4\n"), False, written_by=1000.2)
        kind.look_for_checkpoints(final=True)
    (told,) = [e for e in run.events() if e["type"] == "checkpoint"]
    assert told["step"] == 50
