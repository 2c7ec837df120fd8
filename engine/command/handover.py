"""A spare for a user's Python command: the command's own interpreter, started ahead with its own
flags, that imports torch while the attempt before it trains, then runs the script or module
it is handed as `python [flags] script.py args...` or `python [flags] -m module args...` would.

Run by the command's interpreter as `-c` code (engine.run.launchers.command reads this file's
text), which may be another Python than cockpit's, without cockpit: the standard library only.

    PYTHON [FLAGS] -c <this file> PATH0 MODULE...     (started by the supervisor, stdin a pipe)

PATH0 is what sys.path[0] is for the command: the script's directory, or the working directory
for -m. It takes the place of -c's '' before anything is imported, unless the flags keep it out
(-P, -I), so the MODULEs (torch's, engine.run.launchers.command says which) are imported from
where the command itself would import them. Then one JSON line on stdin, engine.run.spare's
hand-over:

    {"argv": [script or "-m", module, args...], "env": {...}, "log": "attempt-N.log"}

An empty line, or the pipe closing, ends it at once. Handed one: its stdin from /dev/null, its
output into the log, its environment the attempt's; then runpy runs the script or module as
__main__, with the sys.argv and sys.path[0] that Python gives it, so its exit code, its
traceback and a signal's death are its own (runpy's frames are above its traceback's).
"""

import json
import os
import runpy
import sys
import threading


def _ahead(modules: list) -> None:
    import importlib

    for name in modules:   # the point: imported before the script asks for them
        try:
            importlib.import_module(name)
        except BaseException:   # not there, or broken: the script imports it and says so itself
            return


def become(log_path: str, env: dict) -> None:
    """The attempt's standard streams and environment, as its launch would have given them
    (the built-in trainer's spare, engine.train.spare, becomes its attempt the same way)."""
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


def _main() -> None:
    path0 = sys.argv[1] if len(sys.argv) > 1 else ""
    own_path = sys.path[:1] == [""]   # -c's; -P and -I leave it out, as they would the script's
    if own_path:
        sys.path[0] = path0
    worker = threading.Thread(target=_ahead, args=(sys.argv[2:],), daemon=True, name="spare-ahead")
    worker.start()
    line = sys.stdin.buffer.readline()
    if not line.strip():
        os._exit(0)   # not a return: an import under way must not hold the exit up
    worker.join()
    message = json.loads(line)
    become(message["log"], message["env"])
    argv = message["argv"]
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]   # run_module puts the module's file first, as -m does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(argv[0])   # __file__ as Python 3.9+ gives the main script
        sys.argv = list(argv)
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":   # -c code runs as __main__; imported (a test, the type checker), nothing
    _main()
