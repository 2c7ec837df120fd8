"""How true cockpit's figures are for a user's own script (issue 26): each shape in
tests/scripts/shapes/ run under `cockpit run` with a crash injected mid-run and the script's own
resume argument and checkpoints, then every figure of `cockpit runs show RUN --json` held against
what the script wrote down itself (truth.json: the steps each attempt trained, where it resumed,
each checkpoint written, its samples and tokens per step, its last logged loss, eval and metric).

    python benchmarks/command_fidelity.py                      # all seven shapes, about two minutes
    python benchmarks/command_fidelity.py --shapes nanogpt retriever

Seven shapes: nanoGPT, run_clm under the HF Trainer, Lightning's Rich bar, a per-epoch counter
(retriever), TRL's GRPO, a hand-written loop of slow steps (2 s) under a Rich bar that redraws
itself ten times a second (richbar), and mlx-lm's LoRA itself on a tiny Llama at a Mac's pace
(mlx_lora: its rows, its live bar, 2 s iterations; needs mlx-lm, skipped without it).

Steps lost are read three times: `runs show` (the fold behind runs list, compare and the TUI),
the headless last line and run_finished's summary (what the alerts say); they must agree.
Verdicts: `exact` equal; `ok` within the tolerance below; `WRONG`; `absent` the field is not in
`runs show --json` at all. A figure the script never states and cockpit cannot know (tokens per
step of a retriever) is exact when cockpit says it does not know (null), WRONG when it guesses.
Tolerances, and why:
- samples seen and steps lost: one optimizer step. A script prints its step number either after
  training it (the Trainer's bar: `41/60` when 41 are done) or as the step's index (nanoGPT's
  `iter 40` is its 41st step), and nothing in the output says which.
- samples/s: 25 %. Never exact: the truth is the script's own clock from its first printed step
  to its last in each attempt; cockpit's is the same samples over its reporting windows (1 s),
  whose ends it learns by polling the script's output (every 0.1 s or so): a few windows per
  attempt here, so a poll at each end of each is 10-20 %. A misread unit is off by a factor of 2
  to 40, far outside it.
- losses and metrics: exact to the digits the script printed (the truth is what it printed).
- rate in lines: 15 %. What the step lines show (the smoothed samples/s, or a window's steps/s
  where the samples per step are not known), each against the script's own clock over the same
  steps (its per-step print times in truth.json); the worst line of the run, as a ratio. Lines
  whose rate holds one step are left out (a refresh late at either end of one step of 2 s is
  10 %), as is each attempt's first window (warm-up, held aside by the rate).
- ETA at half-way: 25 % (and the 0.1 s a step event rounds it to: the five fast shapes are half
  a second from their end there). The ETA of the first step line past half of what the last
  attempt trains, against the time the script really took from that step to its last.
- tokens/s: 25 %, as samples/s (the run's average).

Exits 0: it is a measurement. tests/test_command_fidelity.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES_DIR = ROOT / "tests" / "scripts" / "shapes"
CRASH_AT = 30          # every shape checkpoints before it and runs well past it (or says its own)
RATE_TOLERANCE = 0.25  # samples/s and tokens/s, relative (see the docstring)
LINE_RATE_TOLERANCE = 0.15   # the rate each step line shows
ETA_TOLERANCE = 0.25         # the ETA at half-way
ETA_ROUNDING_S = 0.1         # step events round their ETA to this


@dataclass(frozen=True)
class Shape:
    script: str
    argv: tuple[str, ...]          # after the script, with cockpit's placeholders
    resume: tuple[str, ...]        # the workload's resume arguments
    checkpoints: str               # its checkpoint glob
    batch_size: int
    accumulation: int
    preset: dict = field(default_factory=dict)  # command.* settings, passed where cockpit has them
    crash_at: int = CRASH_AT       # a step after a checkpoint, well before the end
    needs: str | None = None       # a module the script imports that may not be installed


SHAPES = {
    "nanogpt": Shape("nanogpt.py", ("--out_dir={run_dir}/out", "--batch_size={batch_size}",
                                    "--gradient_accumulation_steps={accumulation}", "--max_iters=60"),
                     ("--init_from=resume",), "{run_dir}/out/ckpt.pt", 4, 4),
    "run_clm": Shape("run_clm.py", ("--output_dir", "{run_dir}/out", "--per_device_train_batch_size",
                                    "{batch_size}", "--gradient_accumulation_steps", "{accumulation}",
                                    "--num_train_epochs", "3", "{hf_device_flag}"),
                     ("--resume_from_checkpoint", "{checkpoint}"), "{run_dir}/out/checkpoint-*", 4, 2,
                     # the Trainer states its samples per step, never its tokens: the preset does
                     {"tokens_per_step": 4 * 2 * 16}),
    "lightning": Shape("lightning.py", ("--out", "{run_dir}/out", "--max_steps", "60",
                                        "--accumulate_grad_batches", "{accumulation}",
                                        "--batch_size", "{batch_size}", "--accelerator", "{device}"),
                       ("--ckpt_path", "{checkpoint}"), "{run_dir}/out/*.ckpt", 4, 2),
    "retriever": Shape("retriever.py", ("--bs", "{batch_size}", "--accum", "{accumulation}",
                                        "--device", "{device}", "--out", "{run_dir}/out", "--epochs", "4"),
                       ("--resume", "{checkpoint}"), "{run_dir}/out/last.pt", 4, 4),
    "grpo": Shape("grpo.py", ("--output_dir", "{run_dir}/out", "--per_device_train_batch_size",
                              "{batch_size}", "--gradient_accumulation_steps", "{accumulation}",
                              "--max_steps", "60", "{hf_device_flag}"),
                  ("--resume_from_checkpoint", "{checkpoint}"), "{run_dir}/out/checkpoint-*", 4, 2),
    # steps of seconds, the bar redrawn through them: 10 steps, a crash after 5, back from 4
    "richbar": Shape("richbar.py", ("--out", "{run_dir}/out", "--steps", "10", "--step_s", "2.0",
                                    "--bs", "{batch_size}", "--accum", "{accumulation}", "--save_every", "2"),
                     ("--resume", "{checkpoint}"), "{run_dir}/out/last.pt", 4, 2, crash_at=5),
    # mlx-lm counts from 1 again after a resume (steps_restart); a crash at the row for 6, back
    # from its adapters of 4; its evaluations at the first and last iteration
    "mlx_lora": Shape("mlx_lora.py", ("--out", "{run_dir}/out", "--iters", "12", "--step_s", "2.0",
                                      "--batch-size", "{batch_size}",
                                      "--grad-accumulation-steps", "{accumulation}"),
                      ("--resume-adapter-file", "{checkpoint}"),
                      "{run_dir}/out/adapters/*_adapters.safetensors", 4, 1,
                      {"steps_restart": True}, crash_at=6, needs="mlx_lm"),
}

FIGURES = ("final step", "total", "samples/step", "tokens/step", "samples seen", "steps lost",
           "lost, last line", "lost, finished", "checkpoints", "final loss", "eval shown", "main metric",
           "samples/s", "tokens/s", "rate in lines", "ETA half-way")
ABSENT = "absent"


@dataclass
class Row:
    figure: str
    cockpit: object
    truth: object
    verdict: str
    source: str = ""


@dataclass
class Result:
    shape: str
    returncode: int
    outcomes: list
    rows: list
    output: str = ""
    truth: dict | None = None

    def share(self) -> str:
        exact = sum(r.verdict == "exact" for r in self.rows)
        ok = sum(r.verdict == "ok" for r in self.rows)
        return f"{exact}/{len(self.rows)} exact" + (f", {ok} within tolerance" if ok else "")


# ---------------------------------------------------------------- running a shape

def _toml(value) -> str:
    return json.dumps(value)  # a JSON string, number or list of strings is TOML too


def command_settings() -> set[str]:
    """The command.* settings this cockpit knows (new ones land while issue 26 is worked on)."""
    import dataclasses
    sys.path.insert(0, str(ROOT))
    from engine.command import CommandSpec
    return {f.name for f in dataclasses.fields(CommandSpec)}


def cockpit_argv(shape: Shape) -> list[str]:
    known = command_settings()
    sets = ["--set", f"batch_size={shape.batch_size}", "--set", f"accumulation={shape.accumulation}",
            "--set", f"command.resume={_toml(list(shape.resume))}",
            "--set", f"command.checkpoints={shape.checkpoints}"]
    for key, value in shape.preset.items():
        if key in known:
            sets += ["--set", f"command.{key}={_toml(value)}"]
    return ["run", "-d", "cpu", "--inject", f"native-crash@{shape.crash_at}", *sets, "--",
            sys.executable, str(SHAPES_DIR / shape.script), *shape.argv]


def run_shape(name: str, env: dict, runs_dir: Path, timeout: float = 300,
              rate_tolerance: float = RATE_TOLERANCE, line_tolerance: float = LINE_RATE_TOLERANCE,
              eta_tolerance: float = ETA_TOLERANCE) -> Result:
    """Run one shape under `cockpit run` (env: its COCKPIT_* dirs, PYTHONPATH; SIGINT left at
    its default for the children) and compare its figures with the script's truth."""
    shape = SHAPES[name]
    cockpit = [sys.executable, "-m", "cockpit"]
    done = subprocess.run(cockpit + cockpit_argv(shape), capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=str(ROOT))
    output = done.stdout + done.stderr
    runs = sorted(p for p in Path(runs_dir).iterdir() if (p / "run.toml").exists())
    if not runs:
        return Result(name, done.returncode, [], [], output)
    run = runs[-1]
    shown = subprocess.run(cockpit + ["runs", "show", str(run), "--json"], capture_output=True,
                           text=True, env=env, timeout=60)
    summary = json.loads(shown.stdout)
    truth = json.loads((run / "out" / "truth.json").read_text())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    outcomes = [e.get("outcome") for e in events if e.get("type") == "attempt_ended"]
    # steps lost, one figure everywhere: the headless last lines and run_finished (the alerts)
    said = re.findall(r"(\d[\d,]*) steps? lost to crashes", done.stdout)
    summary["_lost_last_line"] = int(said[-1].replace(",", "")) if said else 0
    finished = [e for e in events if e.get("type") == "run_finished"]
    summary["_lost_finished"] = (finished[-1].get("summary") or {}).get("steps_lost", ABSENT) if finished else ABSENT
    summary["_steps"] = [e for e in events if e.get("type") == "step"]
    return Result(name, done.returncode, outcomes,
                  compare(summary, truth, rate_tolerance, line_tolerance, eta_tolerance), output, truth)


# ---------------------------------------------------------------- the truth

def truth_figures(t: dict) -> dict:
    """The script's own account of the run, figure by figure (see shapetruth.py)."""
    attempts, base = t["attempts"], t["first_index"]
    last = attempts[-1]
    final = last["reached"] if last["reached"] is not None else last["resumed_from"] - 1 + base
    done = final - base + 1                     # optimizer steps in the run's final lineage
    sps = t["samples_per_step"]
    lost = 0
    for a, b in zip(attempts, attempts[1:]):    # trained by a, trained again by b
        if a["reached"] is not None:
            lost += max(0, a["reached"] - (b["resumed_from"] + base) + 1)
    if not last["finished"] and last["reached"] is not None:   # the run ended on a crash
        kept = max([c["step"] for c in last["checkpoints"]] + [last["resumed_from"]])
        lost += max(0, last["reached"] - (kept + base) + 1)
    steps = secs = 0.0
    for a in attempts:
        if a["span"] and a["span"][2] > a["span"][0]:
            steps += a["span"][3] - a["span"][1]
            secs += a["span"][2] - a["span"][0]
    ev, metric = t.get("eval"), t.get("main_metric")
    tps = t["tokens_per_step"]
    return {
        "final step": final, "total": t["total"], "samples/step": sps,
        "tokens/step": t["tokens_per_step"], "samples seen": None if sps is None else done * sps,
        "steps lost": lost, "lost, last line": lost, "lost, finished": lost, "checkpoints": sum(len(a["checkpoints"]) for a in attempts),
        "final loss": t["loss"], "eval shown": ev and ev["value"], "main metric": metric and metric["value"],
        "samples/s": (steps * sps / secs) if secs and sps else None,
        "tokens/s": (steps * tps / secs) if secs and tps else None,
        # the step lines' rates and the ETA: held to the script's clock line by line (below)
        "rate in lines": 1.0, "ETA half-way": None,
        "_eval_name": ev and ev["name"], "_metric_name": metric and metric["name"],
    }


def first_prints(attempt: dict) -> dict[int, float]:
    """When the script first printed each step (a per-batch counter prints a step several
    times; cockpit reads it at the first)."""
    times: dict[int, float] = {}
    for step, when in attempt.get("times", []):
        times.setdefault(int(step), when)
    return times


def line_rates(steps: list[dict], t: dict, tolerance: float = LINE_RATE_TOLERANCE) -> tuple[float | None, int, int]:
    """The worst step line's shown rate over the script's own over the same steps, as a ratio
    (1.0: exact; None with no line to judge), the lines within `tolerance` and those judged. A
    line shows the smoothed samples/s, where the samples per step are known (over the attempt's
    windows after its first), else its window's steps/s (from_step to step)."""
    worst, within, judged = None, 0, 0
    sps = t["samples_per_step"]
    for number, attempt in enumerate(t["attempts"], 1):
        times = first_prints(attempt)
        mine = [e for e in steps if e.get("attempt") == number and e.get("window_s") is not None
                and e.get("steps_per_s") is not None and not e.get("partial")]
        if len(mine) < 2:
            continue
        measured = mine[0]["step"]   # the first window (warm-up) is held aside by the rate
        for e in mine[1:]:
            smoothed = e.get("smoothed_samples_per_s")
            start = measured if smoothed is not None else e["from_step"]
            if e["step"] - start < 2 or start not in times or e["step"] not in times:
                continue
            truth = (e["step"] - start) / (times[e["step"]] - times[start])
            shown = smoothed / sps if smoothed is not None and sps else e["steps_per_s"]
            ratio = shown / truth
            worst = ratio if worst is None or abs(ratio - 1) > abs(worst - 1) else worst
            judged += 1
            within += abs(ratio - 1) <= tolerance
    return worst, within, judged


def eta_half_way(steps: list[dict], t: dict) -> tuple[float | None, float | None]:
    """The ETA of the last attempt's first full window past half of what it trains (else of
    its last full window before), and the time the script took from that step to its last:
    (cockpit's, the truth). An attempt with no full window has no rate to say an ETA from:
    unknown on both sides (a fast shape's short resume on a loaded machine), as the rate in
    lines is; a full window that says no ETA is WRONG."""
    last = t["attempts"][-1]
    times = first_prints(last)
    number = len(t["attempts"])
    full = [e for e in steps if e.get("attempt") == number and e.get("window_s") is not None
            and not e.get("partial") and e["step"] in times]
    if not full:
        return None, None
    half = (last["resumed_from"] + t["total"]) / 2
    e = next((e for e in full if e["step"] >= half), full[-1])
    return e.get("eta_s"), times[max(times)] - times[e["step"]]


# ---------------------------------------------------------------- cockpit's figures

def find(tree, key: str):
    """The first value under `key` anywhere in `runs show --json` (breadth first), or ABSENT:
    the fields issue 26 adds may nest (units.samples_per_step) and may not have landed yet."""
    queue = [tree]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            if key in node:
                return node[key]
            queue += list(node.values())
        elif isinstance(node, list):
            queue += node
    return ABSENT


def cockpit_figures(s: dict, eval_name: str | None, metric_name: str | None) -> dict:
    metrics = s.get("metrics") or {}
    if eval_name is None:
        shown_eval = metrics.get("eval_loss") if metrics else None   # it should show none
    elif eval_name in metrics:
        shown_eval = metrics[eval_name]
    else:
        shown_eval = f"not shown ({', '.join(metrics) or 'no eval'})"
    main = find(s, "main_metric")
    if isinstance(main, dict):
        main = main.get("value")
    elif isinstance(main, str):          # a name: its value beside it or among the metrics
        value = find(s, "main_metric_value")
        main = value if value is not ABSENT else metrics.get(main, f"{main} (no value)")
    total = s.get("total_steps", ABSENT)
    return {
        "final step": s.get("step", ABSENT), "total": total or None if total is not ABSENT else ABSENT,
        "samples/step": find(s, "samples_per_step"), "tokens/step": find(s, "tokens_per_step"),
        "samples seen": s.get("samples_seen", ABSENT), "steps lost": s.get("steps_lost", ABSENT),
        "lost, last line": s.get("_lost_last_line", ABSENT), "lost, finished": s.get("_lost_finished", ABSENT),
        "checkpoints": s.get("checkpoints", ABSENT), "final loss": s.get("loss", ABSENT),
        "eval shown": shown_eval, "main metric": main, "samples/s": s.get("samples_per_s", ABSENT),
        "tokens/s": s.get("tokens_per_s", ABSENT),
    }


def sources(s: dict) -> dict:
    """Where cockpit says a figure came from, where runs show says it."""
    out = {}
    for figure, key in (("samples/step", "samples_source"), ("tokens/step", "tokens_source"),
                        ("total", "total_source"), ("samples seen", "samples_source"),
                        ("samples/s", "samples_source")):
        value = find(s, key)
        if value is not ABSENT and value is not None:
            out[figure] = str(value)
    return out


# ---------------------------------------------------------------- the comparison

def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def verdict(figure: str, cockpit, truth, samples_per_step=None, rate_tolerance=RATE_TOLERANCE,
            line_tolerance=LINE_RATE_TOLERANCE, eta_tolerance=ETA_TOLERANCE) -> str:
    if cockpit is ABSENT:
        return ABSENT
    if truth is None or cockpit is None:
        return "exact" if truth is None and cockpit is None else "WRONG"
    if not _number(cockpit) or not _number(truth):
        return "WRONG"
    tolerance = {"samples/s": rate_tolerance, "tokens/s": rate_tolerance,
                 "rate in lines": line_tolerance, "ETA half-way": eta_tolerance}.get(figure)
    if tolerance is not None:
        # an ETA is said to 0.1 s: the fast shapes' half-way is a fraction of a second away
        slack = ETA_ROUNDING_S if figure == "ETA half-way" else 0.0
        return "ok" if abs(cockpit - truth) <= tolerance * truth + slack else "WRONG"
    if figure in ("final loss", "eval shown", "main metric"):
        return "exact" if math.isclose(cockpit, truth, rel_tol=1e-6, abs_tol=1e-9) else "WRONG"
    if cockpit == truth:
        return "exact"
    step = {"steps lost": 1, "lost, last line": 1, "lost, finished": 1,
            "samples seen": samples_per_step}.get(figure)
    return "ok" if step is not None and abs(cockpit - truth) <= step else "WRONG"


def compare(summary: dict, truth: dict, rate_tolerance: float = RATE_TOLERANCE,
            line_tolerance: float = LINE_RATE_TOLERANCE, eta_tolerance: float = ETA_TOLERANCE) -> list[Row]:
    want = truth_figures(truth)
    got = cockpit_figures(summary, want["_eval_name"], want["_metric_name"])
    steps = summary.get("_steps", [])
    got["rate in lines"], within, judged = line_rates(steps, truth, line_tolerance)
    if got["rate in lines"] is None:
        want["rate in lines"] = None   # no line to judge: said as unknown on both sides
    got["ETA half-way"], want["ETA half-way"] = eta_half_way(steps, truth)
    said = {**sources(summary), "rate in lines": f"worst of {judged} lines; {within} within"}
    return [Row(f, got[f], want[f], verdict(f, got[f], want[f], want["samples/step"], rate_tolerance,
                                            line_tolerance, eta_tolerance),
                said.get(f, "")) for f in FIGURES]


# ---------------------------------------------------------------- the table

def _show(v) -> str:
    if v is ABSENT:
        return "absent"
    if v is None:
        return "unknown"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)[:34]


def table(results: list[Result]) -> str:
    lines = [f"{'shape':<10} {'figure':<13} {'cockpit':>34} {'truth':>10}  {'verdict':<7} source",
             "-" * 92]
    for r in results:
        if not r.rows:
            lines.append(f"{r.shape:<10} no run was recorded (exit {r.returncode})")
            continue
        for row in r.rows:
            lines.append(f"{r.shape:<10} {row.figure:<13} {_show(row.cockpit):>34} {_show(row.truth):>10}  "
                         f"{row.verdict:<7} {row.source}")
        lines.append(f"{r.shape:<10} attempts {', '.join(map(str, r.outcomes)) or 'none'}; {r.share()}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = p.parse_args(argv)
    results = []
    for name in args.shapes:
        if SHAPES[name].needs and importlib.util.find_spec(SHAPES[name].needs) is None:
            print(f"{name}: skipped ({SHAPES[name].needs} is not installed)", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix=f"fidelity-{name}-") as tmp:
            home = Path(tmp)
            env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home),
                   "COCKPIT_CONFIG_DIR": str(home / "config"), "COCKPIT_RUNS_DIR": str(home / "runs"),
                   "COCKPIT_CACHE_DIR": str(home / "cache"), "COCKPIT_ALERTS": "off"}
            result = run_shape(name, env, home / "runs")
            print(f"{name}: cockpit run exited {result.returncode}; {result.share()}", flush=True)
            results.append(result)
    print()
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
