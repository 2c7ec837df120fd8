"""A training script that cockpit did not start, for tests/test_adopt.py: it prints
`step N/M loss X` lines to a log file (flushed, a few a second) until a file appears.

    python steps.py LOG [--total M] [--every S] [--until FILE] [--fail] [anything else...]

LOG '-': its stdout (a test redirects that to a file, as `nohup ... > train.log 2>&1 &` does).

--until FILE: end cleanly at the first step after FILE exists (--fail: raise instead, leaving a
traceback in the log). Unknown arguments are printed (a resume's arguments show in the log), and
so is $ADOPT_TEST_TOKEN, so a test can see what argv and environment a relaunch got. Stdlib only.
"""

import os
import sys
import time


def main() -> int:
    args = sys.argv[1:]
    log, rest = args[0], args[1:]
    total, every, until, fail, extra = 1000, 0.1, None, False, []
    while rest:
        arg = rest.pop(0)
        if arg == "--total":
            total = int(rest.pop(0))
        elif arg == "--every":
            every = float(rest.pop(0))
        elif arg == "--until":
            until = rest.pop(0)
        elif arg == "--fail":
            fail = True
        else:
            extra.append(arg)
    out = sys.stdout if log == "-" else open(log, "a", buffering=1)
    print(f"started in {os.getcwd()} with {extra} token={os.environ.get('ADOPT_TEST_TOKEN')}",
          file=out, flush=True)
    for step in range(1, total + 1):
        print(f"step {step}/{total} loss {2.0 / step:.4f}", file=out, flush=True)
        if until and os.path.exists(until):
            if fail:
                sys.stderr = out   # the traceback goes where the steps went
                raise RuntimeError("the data loader lost its file")
            print("done", file=out, flush=True)
            return 0
        time.sleep(every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
