"""Trace one FedAvg round (round 2 of a 3-round tiny run, in process) and list the project files and functions it
passes through: the round's plumbing apart from the task's own computation (tasks/, models/, data/, evaluation/,
workload.py, optim.py). Usage: .venv/bin/python scripts/round_path.py"""

import collections
import os
import sys
import tempfile
from pathlib import Path

import trustformer
from trustformer.config import load_config

try:
    from trustformer.engine.inprocess import run_in_process
except ImportError:  # the layout before the engines had a package of their own
    from trustformer.runtime.inprocess import run_in_process

ROOT = str(Path(trustformer.__file__).parent)
calls = collections.OrderedDict()
state = {"on": False}


def prof(frame, event, arg):
    if event != "call" or not state["on"]:
        return
    f = frame.f_code.co_filename
    if f.startswith(ROOT) and not frame.f_code.co_name.startswith("<"):  # functions, not comprehensions/lambdas
        calls.setdefault((os.path.relpath(f, ROOT), frame.f_code.co_name), 0)
        calls[(os.path.relpath(f, ROOT), frame.f_code.co_name)] += 1


import trustformer.recording.recorder as m

orig = m.RunRecorder.round_done


def round_done(self, rnd):
    orig(self, rnd)
    state["on"] = rnd == 1


m.RunRecorder.round_done = round_done
out = tempfile.mkdtemp()
cfg = load_config(
    "tiny",
    None,
    {
        "out": out,
        "runtime.progress": False,
        "federation.rounds": 3,
        "eval.meteor": False,
        "eval.bertscore": False,
        "runtime.checkpoint": True,
    },
)
sys.setprofile(prof)
import threading

threading.setprofile(prof)
run_in_process(cfg)
sys.setprofile(None)
EXCLUDE = ("tasks/", "models/", "data/", "evaluation/", "workload.py", "optim.py")
files = collections.Counter()
for (f, fn), n in calls.items():
    files[f] += 1
plumbing = {f: n for f, n in files.items() if not f.startswith(EXCLUDE)}
print("all files:", len(files), "functions:", len(calls))
print(
    "federation plumbing files (excluding the task's own computation: tasks/ models/ data/ evaluation/ workload optim):",
    len(plumbing),
    "functions:",
    sum(plumbing.values()),
)
for f, n in sorted(files.items(), key=lambda kv: -kv[1]):
    print(f"  {n:3d} {f}{'' if f in plumbing else '   (task)'}")
    if "--functions" in sys.argv and f in plumbing:
        print("        " + ", ".join(sorted(fn for (ff, fn) in calls if ff == f)))
