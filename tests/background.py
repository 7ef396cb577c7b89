"""Subprocesses that start with the session's first test (tests/conftest.py) and are awaited by
the tests that need their output, so their CPU work overlaps the files before those tests."""

import os
import subprocess


class Background:
    """`cmd` running from now on (in `env`, default the tests' own), its stdout and stderr kept in
    files under the folder `out`; at `nice` > 0 it yields the CPU to the tests until they wait for
    it."""

    def __init__(self, cmd, out, cwd=None, nice=0, env=None):
        self.cmd, self.out = cmd, out
        with open(out / "stdout.txt", "w") as stdout, open(out / "stderr.txt", "w") as stderr:
            self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=stdout, stderr=stderr, text=True, env=env)
        if nice:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, nice)

    def result(self, timeout=900):
        """The finished run, as `subprocess.run` returns it (killed after `timeout` s)."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        stdout, stderr = ((self.out / name).read_text() for name in ("stdout.txt", "stderr.txt"))
        return subprocess.CompletedProcess(self.cmd, self.proc.returncode, stdout, stderr)

    def stop(self):
        """Kill the run if it is still going (the session ends before its tests)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
