"""What the front ends say about a user's own script is what its events say, with where each figure
came from (issue 26): steps/s where the samples per step are not known (never a guessed sample
count), tokens/s where the tokens are, the total and its source or how to give one, the main
metric (a reward, a recall), the eval's loss before its timings, and one steps-lost figure in
every front end. The runs are written event by event, as the supervisor would write them.
"""

from __future__ import annotations

import io
import json
import re

import pytest

from cockpit.cli import main
from cockpit.commands import train
from cockpit.headless import HeadlessPrinter
from cockpit.present.lines import human_line, status_line, step_line
from cockpit.ui.model import RunModel
from cockpit.ui.runs import average_rate
from engine import runconfig
from engine.record.events import EventWriter
from engine.record.metrics import choose_main_metric, shown_metrics
from engine.record.rundir import RunDir, summarize
from engine.record.stats import averages, fold
from engine.run.alert_rules import AlertRules

UNKNOWN = {"samples_per_step": None, "samples_source": "unknown", "tokens_per_step": None,
           "tokens_source": "unknown", "counter": "steps", "accumulation": None, "said": None}
# as the tracker records it: `said` is the samples' words alone, none kept for the tokens
NANOGPT = {**UNKNOWN, "tokens_per_step": 491_520, "tokens_source": "stated"}


def command_run(*overrides: str) -> RunDir:
    return RunDir.create(runconfig.resolve_command(["python", "train.py"], "script", "cpu", list(overrides)))


def write(run: RunDir, *events: tuple[str, dict]) -> list[dict]:
    with EventWriter(run.events_path, attempt=1) as writer:
        for kind, fields in events:
            writer.emit(kind, **fields)
    return run.events()


def steps_only(step: int, *, steps_per_s: float | None, window_s: float | None, units: dict,
               total: int | None = None, total_source: str | None = None, **extra) -> tuple[str, dict]:
    """A command's step event whose samples per step are not known: its samples fields None."""
    return "step", {"step": step, "total": total, "samples_seen": None, "epoch": None, "loss": 2.0,
                    "lr": None, "samples_per_s": None, "smoothed_samples_per_s": None,
                    "steps_per_s": steps_per_s, "window_s": window_s, "eta_s": None, "units": units,
                    "total_source": total_source, **extra}


def started(run: RunDir) -> list[tuple[str, dict]]:
    return [("run_started", {"run": run.id, "workload": "script", "device_preset": "cpu"}),
            ("attempt_started", {"preset": "cpu", "device": "cpu", "command_line": "python train.py"})]


def show(run: RunDir, capsys, *flags: str) -> str:
    capsys.readouterr()
    assert main(["runs", "show", run.id, *flags]) == 0
    return capsys.readouterr().out


def test_unknown_samples_are_steps_per_second_in_every_front_end(home, capsys):
    runs = []
    for _ in range(2):
        run = command_run()
        events = write(run, *started(run),
                       steps_only(10, steps_per_s=None, window_s=None, units=UNKNOWN),   # first sighting
                       steps_only(20, steps_per_s=2.5, window_s=4.0, units=UNKNOWN),
                       ("attempt_ended", {"preset": "cpu", "outcome": "finished", "last_step": 20}),
                       ("run_finished", {"status": "finished"}))
        runs.append(run)
    step = events[-3]
    for line in (step_line(step), status_line(step, None, 5, width=80)):
        assert "2.5 steps/s" in line and "samples" not in line
    printer = HeadlessPrinter(stream=io.StringIO(), live=True, width=81)
    printer(events[:-2])
    assert "2.5 steps/s" in printer.status and "samples" not in printer.status

    out = show(run, capsys)
    assert "speed     2.5 steps/s on average" in out and "samples/s" not in out
    assert "progress  step 20/?\n" in out   # no sample count where none is known
    assert re.search(r"^samples   per step not known.*\n.*--set command\.samples_per_step=N$", out, re.M)
    as_json = json.loads(show(run, capsys, "--json"))
    assert as_json["samples_per_s"] is None and as_json["steps_per_s"] == pytest.approx(2.5)
    assert as_json["units"]["samples_source"] == "unknown" and as_json["samples_seen"] is None

    capsys.readouterr()
    assert main(["runs", "list"]) == 0
    assert all(row.split()[3:5] == ["2.5", "st/s"] for row in capsys.readouterr().out.splitlines()[1:])

    assert main(["runs", "compare", runs[0].id, runs[1].id]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("samples/s avg"))
    assert row.split()[2:] == ["2.5", "steps/s", "2.5", "steps/s"]

    train._print_summary(summarize(run))
    assert "2.5 steps/s on average" in capsys.readouterr().out

    m = RunModel()
    m.fold(events)
    assert not m.samples_known and m.avg_samples_per_s is None and m.avg_steps_per_s == pytest.approx(2.5)
    assert average_rate(averages(events)) == "2.5 st/s"   # the runs screen's column


def test_every_hint_to_give_a_figure_is_a_set_that_works(home, capsys):
    run = command_run()
    write(run, *started(run), steps_only(5, steps_per_s=1.0, window_s=1.0,
                                         units={**UNKNOWN, "counter": "batches"}))
    out = show(run, capsys)
    assert re.search(r"^total     not known, so no ETA; give it with\n {10}total_steps = N in the preset", out, re.M)
    assert re.search(r"^counter   batches, not optimizer steps: .*\n +\{accumulation\} in the command", out, re.M)
    assert max(map(len, out.splitlines()[6:])) <= 80   # past the run's own path and command
    hinted = set(re.findall(r"--set (\S+=N)", out))
    assert hinted == {"command.total_steps=N", "command.samples_per_step=N", "device.accumulation=N"}
    for key in hinted:  # each resolves, as the user would type it
        section, name = key[:-2].split(".")
        config = runconfig.resolve_command(["python", "train.py", "--accum", "{accumulation}"], "script", "cpu",
                                           [key.replace("=N", "=8")])
        assert config.to_table()["workload" if section == "command" else "device"][name] == 8


def test_stated_tokens_and_total_carry_their_source(home, capsys):
    run = command_run()
    events = write(run, *started(run),
                   steps_only(10, steps_per_s=None, window_s=None, units=NANOGPT, total=200,
                              total_source="stated", tokens_seen=4_915_200),
                   steps_only(20, steps_per_s=2.5, window_s=4.0, units=NANOGPT, total=200,
                              total_source="stated", tokens_seen=9_830_400, tokens_per_s=1_228_800.0))
    step = events[-1]
    assert "2.5 steps/s  1,228,800 tokens/s" in step_line(step)
    assert "1,228,800 tokens/s" in status_line(step, None, 5, width=80)
    out = show(run, capsys)
    assert "progress  step 20/200, 9,830,400 tokens\n" in out
    assert 'tokens    491,520 a step: the script said so\n' in out
    assert "total     200 steps: the script said so" in out
    assert "speed     2.5 steps/s on average, 1,228,800 tokens/s\n" in out
    as_json = json.loads(show(run, capsys, "--json"))
    assert as_json["total_steps"] == 200 and as_json["total_source"] == "stated"
    assert as_json["units"]["tokens_per_step"] == 491_520 and as_json["units"]["tokens_source"] == "stated"
    assert as_json["tokens_seen"] == 9_830_400 and as_json["tokens_per_s"] == pytest.approx(1_228_800)


def test_known_samples_say_where_they_came_from(home, capsys):
    units = {**UNKNOWN, "samples_per_step": 32, "samples_source": "stated",
             "said": "Total train batch size (w. parallel, distributed & accumulation) = 32"}
    run = command_run()
    write(run, *started(run), ("step", {"step": 10, "total": 300, "samples_seen": 320, "loss": 2.0,
                                        "samples_per_s": None, "steps_per_s": None, "window_s": None,
                                        "units": units, "total_source": "output"}),
          ("step", {"step": 20, "total": 300, "samples_seen": 640, "loss": 1.9, "samples_per_s": 80.0,
                    "steps_per_s": 2.5, "window_s": 4.0, "units": units, "total_source": "output"}))
    out = show(run, capsys)
    assert "samples   32 a step: the script said so\n          \"Total train batch size" in out
    assert "total     300 steps: the script's output" in out
    assert "speed     80 samples/s on average (2.5 steps/s)" in out and "progress  step 20/300, 640 samples" in out


def test_the_main_metric_is_a_reward_by_default_or_the_presets(home, capsys):
    assert choose_main_metric(["loss", "reward_std", "rewards/format/mean", "reward"]) == "reward"
    assert choose_main_metric(["reward_std", "rewards_format_mean", "rewards/x/std"]) == "rewards_format_mean"
    assert choose_main_metric(["kl", "completion_reward"]) == "completion_reward"
    assert choose_main_metric(["eval_loss", "eval_runtime", "val_acc", "recall@10"]) == "val_acc"
    assert choose_main_metric(["loss", "grad_norm"]) is None
    assert choose_main_metric(["reward", "rewards_format_mean"], "rewards/format/mean") == "rewards_format_mean"
    assert choose_main_metric(["reward"], "recall") == "recall"   # named before it is reported

    grpo = {"reward": 0.5, "reward_std": 0.1, "rewards_format_mean": 0.7}
    for named, expected in (("", "reward 0.62 at step 20 (by default)"),
                            ("rewards/format/mean", "rewards_format_mean 0.8 at step 20 (the preset's main_metric)")):
        run = command_run(*([f"command.main_metric={named}"] if named else []))
        events = write(run, *started(run),
                       steps_only(10, steps_per_s=None, window_s=None, units=UNKNOWN, metrics=grpo),
                       steps_only(20, steps_per_s=2.5, window_s=4.0, units=UNKNOWN,
                                  metrics={**grpo, "reward": 0.62, "rewards_format_mean": 0.8}))
        assert f"main      {expected}\n" in show(run, capsys)
        printer = HeadlessPrinter(stream=io.StringIO(), live=True, width=81, main_metric=run.main_metric())
        printer(events)
        assert expected.split(" at ")[0] in printer.status   # on the live line, at 80 columns
        assert len(printer.status) <= 80
        m = RunModel(main_metric=run.main_metric())
        m.fold(events)
        assert f"{m.main[0]} {m.main[1]:.4g}" == expected.split(" at ")[0]


def test_the_eval_shown_is_its_loss_and_never_a_timing(home, capsys):
    hf = {"eval_runtime": 0.11, "eval_samples_per_second": 250.2, "eval_steps_per_second": 31.3,
          "eval_loss": 2.5, "epoch": 1.0}
    assert list(shown_metrics(hf)) == ["eval_loss", "epoch"]
    # nanoGPT's eval measures the training loss beside the held-out one: the held-out one first
    assert list(shown_metrics({"train_loss": 2.9, "val_loss": 3.1})) == ["val_loss", "train_loss"]
    # one rule for timings, the output parser's too: total_flos is no metric either
    assert list(shown_metrics({"total_flos": 1e15, "train_runtime": 2.1, "recall": 0.4})) == ["recall"]
    run = command_run()
    events = write(run, *started(run), steps_only(20, steps_per_s=None, window_s=None, units=UNKNOWN),
                   ("eval", {"step": 20, "metrics": hf}))
    assert human_line(events[-1]) == "eval at step 20: eval_loss 2.5  epoch 1"
    evals = [line for line in show(run, capsys).splitlines() if line.startswith("eval ")]
    assert evals == ["eval      eval_loss 2.5", "eval      epoch 1"]
    m = RunModel()
    m.fold(events)
    assert list(m.metrics) == ["eval_loss", "epoch"] and "eval_runtime" not in m.eval_series


def test_steps_lost_is_one_figure_in_every_front_end(home, capsys):
    """Attempt 1 reaches step 30, checkpointed at 20, and crashes; attempt 2 resumes from the
    checkpoint at 20 and finishes: 10 steps trained twice, said alike everywhere."""
    run = command_run()

    def step(n: int) -> tuple[str, dict]:
        return "step", {"step": n, "total": 50, "samples_seen": 8 * n, "loss": 1.0, "samples_per_s": 40.0,
                        "steps_per_s": 5.0, "window_s": 2.0, "eta_s": None}

    body = [*started(run), step(10), step(20), ("checkpoint", {"step": 20, "path": "ckpt-20.pt"}), step(30),
            ("crash", {"preset": "cpu", "kind": "native-crash", "sentence": "The command died from SIGSEGV.",
                       "evidence": {}}),
            ("attempt_ended", {"preset": "cpu", "outcome": "native-crash", "last_step": 30}),
            ("attempt_started", {"preset": "cpu", "device": "cpu", "command_line": "python train.py",
                                 "resume": {"path": "ckpt-20.pt", "step": 20}}),
            step(40), step(50), ("attempt_ended", {"preset": "cpu", "outcome": "finished", "last_step": 50})]
    with EventWriter(run.events_path, attempt=1) as writer:
        for kind, fields in body:
            writer.emit(kind, **fields)
    summary = fold(run.events()).summary()   # what the supervisor writes into run_finished
    write(run, ("run_finished", {"status": "finished", "summary": summary}))
    events = run.events()
    assert summary["steps_lost"] == 10

    assert "10 steps lost to crashes" in human_line(events[-1])               # the final line
    alert, = AlertRules(on=frozenset({"finish"}), since=None).see(events)   # the alert
    assert "10 steps lost to crashes" in alert.message
    assert summarize(run).steps_lost == 10
    assert "lost      10 steps to crashes" in show(run, capsys)
    capsys.readouterr()
    assert main(["runs", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(" 10")
    m = RunModel()
    m.fold(events)
    assert m.steps_lost == 10                                                 # the dashboard
    assert averages(events).steps_lost == 10                                  # runs screen, compare


def test_the_dashboard_at_80x24_shows_steps_and_the_reward(home):
    from textual.widgets import Static

    from cockpit.app import make_app
    from cockpit.ui.dashboard import DashboardScreen
    from ui_support import run as run_async, wait_for

    rundir = command_run()
    metrics = {"reward": 0.62, "reward_std": 0.1, "eval_runtime": 0.2}
    write(rundir, *started(rundir),
          *[steps_only(n, steps_per_s=2.5 if n > 10 else None, window_s=4.0 if n > 10 else None, units=NANOGPT,
                       total=200, total_source="stated", tokens_seen=491_520 * n,
                       tokens_per_s=1_228_800.0 if n > 10 else None, metrics=metrics)
            for n in range(10, 70, 10)],
          ("attempt_ended", {"preset": "cpu", "outcome": "finished", "last_step": 60}),
          ("run_finished", {"status": "finished"}))

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(rundir)
            await wait_for(pilot, lambda: dash.ended, what="the replay")
            assert isinstance(app.screen, DashboardScreen)

            def screen_text() -> str:
                return "\n".join(strip.text for strip in app.screen._compositor.render_strips())

            # a language model's tokens/s comes before the average, which 80 columns drop; the
            # dashboard paints the end at its next frame (a timer)
            await wait_for(pilot, lambda: "2.5 steps/s · 1,228,800 tokens/s" in screen_text(),
                           what="the throughput plot's title")
            shown = screen_text()
            assert "reward 0.62" in str(dash.query_one("#progress-text", Static).render())
            assert "samples/s" not in shown
            await pilot.press("t")          # nothing to toggle to: it stays in steps/s
            await pilot.pause(0.3)
            shown = screen_text()
            assert "2.5 steps/s" in shown and "samples/s" not in shown

    run_async(drive())


def test_a_crash_recorded_with_colour_codes_is_shown_without_them():
    """A run recorded before crash evidence was cleaned (engine.run.crashes) still reads plainly."""
    crash = {"type": "crash", "attempt": 1, "preset": "cpu", "kind": "user-code",
             "sentence": "The command raised RuntimeError after step 130.",
             "evidence": {"message": "\x1b[1;91mRuntimeError: \x1b[0mboom"},
             "exception": "\x1b[31m╭─ Traceback ─╮\x1b[0m\n\x1b[1;91mRuntimeError: \x1b[0mboom"}
    line = human_line(crash)
    assert "\x1b" not in line and line.endswith("RuntimeError: boom")
    assert "\x1b" not in human_line({**crash, "kind": "native-crash", "exception": None})


def test_a_run_whose_windows_were_all_fragments_says_its_speed_was_not_measured(home, capsys):
    """A command's windows are timed by when its output was read: fragments shorter than a
    reporting window are left out of the average (engine.record.stats), and runs show says why
    it has none rather than a dash."""
    run = command_run()
    write(run, *started(run), steps_only(10, steps_per_s=None, window_s=None, units=UNKNOWN),
          steps_only(40, steps_per_s=75.0, window_s=0.4, units=UNKNOWN, partial=True),
          ("attempt_ended", {"preset": "cpu", "outcome": "finished", "last_step": 40}),
          ("run_finished", {"status": "finished"}))
    speed = [line for line in show(run, capsys).splitlines() if line.startswith("speed")]
    assert speed and "not measured" in speed[0] and len(speed[0]) <= 80


def test_the_samples_words_are_under_the_samples_line_never_the_tokens(home, capsys):
    """A script that states both (the HF Trainer's batch line, a tokens-per-step line): the
    words the samples came from sit under the samples, and the tokens line has none of them."""
    said = "Total train batch size (w. parallel, distributed & accumulation) = 32"
    units = {**UNKNOWN, "samples_per_step": 32, "samples_source": "stated", "said": said,
             "tokens_per_step": 16_384, "tokens_source": "stated"}
    run = command_run()
    write(run, *started(run), ("step", {"step": 10, "total": 300, "samples_seen": 320, "loss": 2.0,
                                        "samples_per_s": None, "steps_per_s": None, "window_s": None,
                                        "units": units, "total_source": "output"}))
    out = show(run, capsys)
    assert f'samples   32 a step: the script said so\n          "{said}"\ntokens    16,384 a step' in out
    assert out.count(said) == 1
