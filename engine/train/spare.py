"""A spare: the next attempt's process, started before it is needed.

    python -P -m engine.train.spare [MODULE...]      (started by the supervisor, stdin a pipe)

Most of a built-in attempt's start is the interpreter's and torch's imports, seconds of a
recovery on a small machine. So while an attempt runs, the supervisor may start a spare
(engine.run.spare.Spare) with the environment the next attempt would have: it imports torch,
the trainer and the MODULEs named (the workload's), then blocks on one JSON line from its stdin:

    {"argv": [trainer arguments], "env": {the attempt's environment}, "log": "attempt-N.log"}

Handed one, it becomes the attempt: its output goes to the attempt's log (stdin from /dev/null,
as an attempt started directly has), its environment is the attempt's (the entries that vary
from one attempt to the next: when it started, which timed faults count from) and it runs
engine.train.trainer.main with that argv, exiting with its exit code, or dying of its signal,
exactly as `python -P -m engine.train.trainer` would. It is already in a session of its own, as
attempts are, so the supervisor and the lifeline stop it as one.

An empty line, or the pipe closing (the supervisor ended, or died), ends it: a spare never
outlives its supervisor. Until it is handed an attempt, what it prints goes to the supervisor's
log.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    warm = sys.argv[1:] if argv is None else argv
    import torch  # noqa: F401  (the point: imported before the attempt needs it)
    import torch._dynamo  # noqa: F401  (every optimizer's constructor imports it: a second more)

    from engine.train import trainer  # the trainer and its imports, ahead: the point as well

    for name in warm:   # the workload's modules: a failure is the attempt's to report, not ours
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            print(f"spare: {name} not imported ahead: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0   # the supervisor is gone, or has no attempt for it
    message = json.loads(line)
    become(message["log"], message["env"])
    sys.argv = [trainer.__file__, *message["argv"]]
    return trainer.main(message["argv"])


def become(log_path: str, env: dict[str, str]) -> None:
    """The attempt's standard streams and environment, as its launch would have given them."""
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(env)


if __name__ == "__main__":
    sys.exit(main())
