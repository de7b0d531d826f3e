"""fuelpipe.launch: a Ctrl-C while the CLI imports stops it even when the ``KeyboardInterrupt`` is swallowed.

Python drops an exception raised inside a weakref callback; the import machinery runs such callbacks (CI
lost a press in ``_get_module_lock``'s). The script below imports a stand-in ``fuelpipe.cli`` whose import
presses Ctrl-C inside a weakref callback, then defines a ``main`` that says it ran.
"""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT
from _support.sigint import default_sigint

SCRIPT = r'''
import importlib.abc, importlib.util, os, signal, sys, weakref

class Anything:
    pass

def press_inside_a_weakref_callback():
    obj = Anything()
    ref = weakref.ref(obj, lambda r: os.kill(os.getpid(), signal.SIGINT))
    del obj  # the callback runs now; what it raises is "ignored"

class StandInCli(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "fuelpipe.cli" else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        press_inside_a_weakref_callback()
        module.main = lambda: print("the job ran", flush=True)

sys.meta_path.insert(0, StandInCli())
if sys.argv[1] == "launch":
    from fuelpipe.launch import main
else:  # the negative control: Python's own handler, as before fuelpipe.launch
    from fuelpipe.cli import main
main()
'''


def run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          preexec_fn=default_sigint)  # as a terminal starts it, even under a run that ignores SIGINT


def test_a_press_swallowed_during_import_still_stops_the_cli_saying_nothing_ran():
    proc = run("launch")
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "nothing ran" in proc.stderr and "the job ran" not in proc.stdout


def test_negative_control_without_the_launcher_the_swallowed_press_is_lost_and_the_job_runs():
    proc = run("plain")
    assert proc.returncode == 0, proc.stderr
    assert "the job ran" in proc.stdout and "KeyboardInterrupt" in proc.stderr  # "Exception ignored in ..."
