"""How a spare becomes its attempt: `handed` and `become` (the built-in trainer's spare,
engine.train.spare, uses them too), and the whole of a Python command's spare when run as a
program.

A command's spare is the command's own interpreter, started ahead with its own options, that
imports torch while the attempt before it trains, then runs the script or module it is handed
as `python [options] script.py args...` or `python [options] -m module args...` would. It is run
by that interpreter as `-c` code (engine.run.launchers.command reads this file's text), which
may be another Python than cockpit's, without cockpit: the standard library only.

    PYTHON [OPTIONS] -c <this file> PATH0 MODULE...   (started by the supervisor, stdin a pipe)

PATH0 is what sys.path[0] is for the command: the script's directory, or the working directory
for -m. It takes the place of -c's '' before anything else is imported, unless the options keep
it out (-P, -I), so that the MODULEs (torch's, engine.run.launchers.command says which and when)
and this file's own imports come from where the command's would. Then one JSON line on stdin,
engine.run.spare's hand-over:

    {"argv": [script, args...] or ["-m", module, args...], "env": {...}, "log": "attempt-N.log"}

An empty line, or the pipe closing, ends it at once; so does an import ahead that fails (the
attempt is then started as usual, and imports for itself). Handed one: its stdin from
/dev/null, its output into the log, its environment the attempt's; then the script runs in a
fresh __main__ module that stays __main__ after it returns (its atexit handlers and threads
still pickle its classes), with the sys.argv, sys.path[0] and __file__ Python gives a script, or
the module through runpy's own -m, so its exit code, its traceback and a signal's death are its
own (this file's frames sit above its traceback's). What the imports ahead print goes to the
supervisor's log.
"""

import sys

if __name__ == "__main__" and sys.path[:1] == [""]:   # -c's ''; -P and -I leave it out, as for the script
    sys.path[0] = sys.argv[1] if len(sys.argv) > 1 else ""

import json  # noqa: E402  (after sys.path[0]: from where the command would import them)
import os  # noqa: E402
import threading  # noqa: E402


def become(log_path: str, env: dict) -> None:
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


def _ahead(modules: list) -> None:
    import importlib
    import traceback

    for name in modules:   # the point: imported before the script asks for them
        try:
            importlib.import_module(name)
        except BaseException:   # half imported is worse than not: the attempt starts as usual
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(3)


def _fresh_main():
    """A new, empty __main__ module in sys.modules, as the interpreter starts a program with."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main


def _run_script(argv: list) -> None:
    """As `python script.py args...`: sys.argv as given, __file__ absolute (Python 3.9+)."""
    from importlib.machinery import SourceFileLoader

    script = argv[0] if os.path.isabs(argv[0]) else os.path.join(os.getcwd(), argv[0])
    main = _fresh_main()
    main.__dict__.update(__file__=script, __cached__=None, __loader__=SourceFileLoader("__main__", script))
    sys.argv = list(argv)
    with open(script, "rb") as f:   # bytes: compile() reads the coding cookie, as Python does
        code = compile(f.read(), script, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _run_module(argv: list) -> None:
    """As `python -m module args...`: runpy's own -m, in a fresh __main__."""
    import runpy

    _fresh_main()
    sys.argv = ["-m", *argv[2:]]   # -m puts the module's file first
    runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]  # what the interpreter's -m calls (private, as old as -m)


def handed(prepare) -> list:
    """A spare's life until it is handed its attempt, the trainer's (engine.train.spare) and a
    command's alike: `prepare()` (its work ahead) in a thread beside the wait for one JSON line
    on stdin, so that an empty line or the pipe closing ends it at once, whatever that work is
    doing; handed one, the work ahead finished, it becomes the attempt (`become`). The
    attempt's argv."""
    worker = threading.Thread(target=prepare, daemon=True, name="spare-ahead")
    worker.start()
    line = sys.stdin.buffer.readline()
    if not line.strip():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)   # not a return: an import or a compile under way must not hold the exit up
    worker.join()     # the attempt takes what was made ahead
    message = json.loads(line)
    become(message["log"], message["env"])
    return message["argv"]


def _main() -> None:
    argv = handed(lambda: _ahead(sys.argv[2:]))
    (_run_module if argv[0] == "-m" else _run_script)(argv)


if __name__ == "__main__":   # -c code runs as __main__; imported (handed, become), nothing
    _main()
