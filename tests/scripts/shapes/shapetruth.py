"""What a shape script really did, written by the script itself to OUT/truth.json, so that
benchmarks/command_fidelity.py and tests/test_command_fidelity.py can hold cockpit's figures
against it. Stdlib only; imported by the five scripts beside it (a script's own directory is
on its sys.path).

    {"shape": "nanogpt", "total": 60, "samples_per_step": 16, "tokens_per_step": 256,
     "first_index": 0,          # the number the script prints for its first optimizer step
     "loss": 3.9, "eval": {"name": "val_loss", "value": 4.1},
     "main_metric": {"name": "reward", "value": 0.5} | null,
     "attempts": [{"resumed_from": 0, "first": 0, "reached": 33, "finished": false,
                   "checkpoints": [{"path": ".../ckpt.pt", "step": 20}],
                   "span": [t_first_print, step_first_print, t_last_print, step_last_print],
                   "times": [[step, t_print], ...]}]}   # each printed step, when it was

Steps are in the script's own numbering, the one it prints: `first` is the index of the first
step an attempt trained, `reached` the index of the last one it printed; `resumed_from` is the
step its checkpoint held (steps done). The file is rewritten after every printed step, inside
`shown()`, which holds SIGABRT back for as long as the print and the write take: cockpit's
injected native-crash is a real SIGABRT from outside, and without the block a script killed
between printing step N and writing it down would leave a truth one step behind what cockpit
read.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time


class Truth:
    def __init__(self, out: str, shape: str, *, total: int, samples_per_step: int | None,
                 tokens_per_step: int | None, first_index: int, resumed_from: int,
                 eval_name: str | None = None, main_metric: str | None = None):
        os.makedirs(out, exist_ok=True)
        self.path = os.path.join(out, "truth.json")
        try:
            with open(self.path) as f:
                self.data = json.load(f)
        except (OSError, ValueError):
            self.data = {"attempts": []}
        self.data.update(shape=shape, total=total, samples_per_step=samples_per_step,
                         tokens_per_step=tokens_per_step, first_index=first_index)
        self.data.setdefault("loss", None)
        self.data.setdefault("eval", {"name": eval_name, "value": None} if eval_name else None)
        self.data.setdefault("main_metric",
                             {"name": main_metric, "value": None} if main_metric else None)
        self.attempt = {"resumed_from": resumed_from, "first": None, "reached": None,
                        "finished": False, "checkpoints": [], "span": None, "times": []}
        self.data["attempts"].append(self.attempt)
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def shown(self, step: int | None = None, **values):
        """Around the print of step `step` (None: a line that is no step, e.g. an eval):
        SIGABRT waits until the print and its truth are both written. `values`: loss=, eval=,
        metric= as the line shows them (rounded as printed)."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGABRT})
        try:
            yield
            if step is not None:
                self._stepped(step)
            if "loss" in values:
                self.data["loss"] = values["loss"]
            if "eval" in values and self.data["eval"] is not None:
                self.data["eval"]["value"] = values["eval"]
            if "metric" in values and self.data["main_metric"] is not None:
                self.data["main_metric"]["value"] = values["metric"]
            self.save()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _stepped(self, step: int) -> None:
        a, now = self.attempt, time.time()
        if a["first"] is None:
            a["first"] = step
        a["reached"] = step
        if a["span"] is None:
            a["span"] = [now, step, now, step]
        a["span"][2:] = [now, step]
        a["times"].append([step, now])   # the rate of any window and the time left at any step

    def checkpoint(self, path: str, step: int) -> None:
        """A checkpoint written (rewritten, under the same name, counts again) holding `step`."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGABRT})
        try:
            self.attempt["checkpoints"].append({"path": os.path.abspath(path), "step": step})
            self.save()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def finished(self) -> None:
        self.attempt["finished"] = True
        self.save()


class Bar:
    """tqdm's bar as it draws itself on a stream that is no terminal: `\\r`, then the bar, no
    newline until it is closed; `write` clears it, prints a line to stdout and redraws it
    (tqdm.write). Redrawn at every update here: with steps slower than tqdm's mininterval
    (0.1 s) that is what tqdm does too."""

    def __init__(self, total: int | None, *, initial: int = 0, desc: str = "", stream=None,
                 nested: bool = False, leave: bool = True):
        import sys
        self.total, self.n, self.desc, self.leave = total, initial, desc, leave
        self.stream, self.nested = stream or sys.stderr, nested
        self.start = time.time()
        self.last_len = 0
        self.draw()

    def text(self) -> str:
        elapsed = time.time() - self.start
        rate = self.n / elapsed if elapsed > 0 and self.n else None
        rate_s = f"{rate:5.2f}it/s" if rate else "?it/s"
        desc = f"{self.desc}: " if self.desc else ""
        if not self.total:
            return f"{desc}{self.n}it [{_clock(elapsed)}, {rate_s}]"
        frac = self.n / self.total
        width = 10
        full = int(frac * width)
        part = " ▏▎▍▌▋▊▉"[int((frac * width - full) * 8)] if full < width else ""
        bar = ("█" * full + part).ljust(width)
        left = (self.total - self.n) / rate if rate else None
        return (f"{desc}{frac * 100:3.0f}%|{bar}| {self.n}/{self.total} "
                f"[{_clock(elapsed)}<{_clock(left) if left is not None else '?'}, {rate_s}]")

    def draw(self) -> None:
        text = self.text()
        pad = " " * max(0, self.last_len - len(text))
        self.last_len = len(text)
        if self.nested:  # position 1: one line down, draw, back up (tqdm's nested bars)
            self.stream.write(f"\n\r{text}{pad}\x1b[A")
        else:
            self.stream.write(f"\r{text}{pad}")
        self.stream.flush()

    def update(self, k: int = 1) -> None:
        self.n += k
        self.draw()

    def write(self, line: str) -> None:
        self.stream.write("\r" + " " * self.last_len + "\r")
        self.stream.flush()
        print(line, flush=True)
        self.draw()

    def close(self) -> None:
        if self.leave:
            self.stream.write("\n")
        elif self.nested:
            self.stream.write("\n\r" + " " * self.last_len + "\r\x1b[A")
        else:
            self.stream.write("\r" + " " * self.last_len + "\r")
        self.stream.flush()


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
