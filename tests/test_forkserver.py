"""tests/forkserver.py, the tests' runs forked from a process that has imported torch: each says
what the same run in a fresh interpreter says, and is a process of its own."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import forkserver
import trained
from conftest import ROOT, SAMPLES
from explainer.runtime.records import is_library_file

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# Ours, one run by a library, a real-world case, a fixed twin, and one that only warns.
EXPLAINED = ["rnn_hidden_chunks", "libraries/accelerate_rnn_state", "real/cleanrl_ppo_continuous_values_buffer_keeps_"
             "rollout_graph", "lstm_tuple_state_fixed", "running_loss_total"]


def both(args: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """`args` forked, then in a fresh interpreter."""
    kwargs = {"cwd": ROOT, "env": ENV, "timeout": 300, **kwargs}
    assert forkserver.forks(args, kwargs["env"])
    return (forkserver.run(args, **kwargs),
            subprocess.run(args, capture_output=True, text=True, **kwargs))


@pytest.mark.parametrize("name", EXPLAINED)
def test_the_explainer_forked_says_what_it_says_in_a_fresh_interpreter(name, tmp_path):
    script = SAMPLES / f"{name}.py"
    assert script.exists()
    forked, fresh = (run([sys.executable, "-m", "explainer", "run", "--json", str(tmp_path / f"{way}.json"), str(script)],
                         capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
                     for way, run in (("forked", forkserver.run), ("fresh", subprocess.run)))
    assert forkserver.forks(forked.args, ENV)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert json.loads((tmp_path / "forked.json").read_text()) == json.loads((tmp_path / "fresh.json").read_text())
    assert ("[explainer]" in forked.stderr) == (not name.endswith("_fixed"))


def test_a_sample_forked_trains_what_it_trains_in_a_fresh_interpreter(tmp_path):
    script = SAMPLES / "lstm_tuple_state_fixed.py"
    forked = trained.trained_by(script, tmp_path / "forked.pt", runner=forkserver.run)
    fresh = trained.trained_by(script, tmp_path / "fresh.pt")
    assert forked["error"] is None and fresh["error"] is None
    assert [label for label, _ in forked["tensors"]] == [label for label, _ in fresh["tensors"]]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(forked["tensors"], fresh["tensors"]))


PROBE = """
import os, random, sys, numpy, torch
print(sys.argv, repr(sys.path[0]), os.getcwd(), os.environ.get("PROBE"), torch.get_num_threads())
print(os.getpid(), os.getppid(), random.random(), numpy.random.rand(), torch.rand(1).item(), file=sys.stderr)
raise SystemExit(int(sys.argv[1]))
"""


def test_a_child_has_the_argv_path_folder_environment_threads_and_exit_status_it_asked_for(tmp_path):
    env = {**ENV, "PROBE": "asked", "OMP_NUM_THREADS": "1"}
    forked, fresh = both([sys.executable, "-c", PROBE, "3", "x"], cwd=tmp_path, env=env)
    assert forked.returncode == fresh.returncode == 3
    assert forked.stdout == fresh.stdout == f"['-c', '3', 'x'] '' {tmp_path} asked 1\n"
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    forked, fresh = both([sys.executable, str(script), "0"], cwd=ROOT, env=env)
    assert forked.returncode == fresh.returncode == 0
    assert forked.stdout == fresh.stdout == f"[{str(script)!r}, '0'] {str(tmp_path)!r} {ROOT} asked 1\n"


def test_each_child_is_a_process_of_its_own_with_its_own_random_draws(tmp_path):
    runs = [forkserver.run([sys.executable, "-c", PROBE, "0"], cwd=tmp_path, env=ENV, timeout=60) for _ in range(2)]
    (pid_a, server_a, *draws_a), (pid_b, server_b, *draws_b) = (run.stderr.split() for run in runs)
    assert pid_a != pid_b and os.getpid() not in (int(pid_a), int(pid_b))
    assert [a != b for a, b in zip(draws_a, draws_b)] == [True, True, True]


def test_an_uncaught_exception_ends_the_child_as_it_ends_the_interpreter(tmp_path):
    forked, fresh = both([sys.executable, "-c", "import torch\nprint('before')\nraise ValueError('boom')"],
                         cwd=tmp_path)
    assert forked.returncode == fresh.returncode == 1
    assert (forked.stdout, forked.stderr) == (fresh.stdout, fresh.stderr)
    assert forked.stderr.rstrip().endswith("ValueError: boom")


def test_what_a_fork_cannot_give_runs_in_a_fresh_interpreter(tmp_path):
    elsewhere = {**ENV, "PYTHONPATH": str(tmp_path)}
    assert not forkserver.forks([sys.executable, "-c", "pass"], elsewhere)
    assert not forkserver.forks([sys.executable, "-X", "dev", "-c", "pass"], ENV)
    (tmp_path / "here.py").write_text("")
    ran = forkserver.run([sys.executable, "-c", "import here, sys; print(here.__file__)"], cwd=ROOT, env=elsewhere,
                         timeout=60)
    assert (ran.returncode, ran.stdout) == (0, f"{tmp_path / 'here.py'}\n")


def test_a_variable_read_at_start_up_is_the_one_the_run_asked_for(tmp_path):
    """Python hashes strings with PYTHONHASHSEED, read once, as it starts."""
    for seed in ("0", "1"):
        forked, fresh = both([sys.executable, "-c", "print(hash('carried'))"], env={**ENV, "PYTHONHASHSEED": seed})
        assert forked.stdout == fresh.stdout, seed


def test_a_child_past_its_time_is_killed(tmp_path):
    marker = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([sys.executable, "-c", f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                        "time.sleep(600)"], cwd=tmp_path, env=ENV, timeout=3)
    pid = int(marker.read_text())
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "the child outlived its timeout"
        time.sleep(0.1)


THREADS = """
import signal, sys, threading, time, traceback
def later():
    time.sleep(0.5)
    print("joined", threading.current_thread() is not threading.main_thread())
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
threading.Thread(target=later).start()
print(threading.main_thread().name, threading.current_thread() is threading.main_thread())
print([f.filename for f in traceback.extract_stack()])
"""


def test_the_child_runs_on_its_main_thread_joins_the_threads_it_started_and_shows_no_frame_of_its_own(tmp_path):
    forked, fresh = both([sys.executable, "-c", THREADS], cwd=tmp_path)
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (0, "")
    assert fresh.stdout == "MainThread True\n['<string>']\njoined True\n"
    named, stack, joined = forked.stdout.splitlines()
    assert (named, joined) == ("MainThread True", "joined True")
    # Below the run, the fork's frames (threading's and its own) are all library frames.
    below = ast.literal_eval(stack)
    assert below[-1] == "<string>" and all(is_library_file(f) for f in below[:-1])


MAIN_ALIAS = """
import sys
print(getattr(sys.modules.get("__mp_main__"), "__file__", None))
import torch
print(getattr(sys.modules.get("__mp_main__"), "__file__", None))
"""


@pytest.mark.parametrize("launch", [["-m", "explainer", "run"], [], [str(SAMPLES / "trained.py")]])
def test_the_main_module_multiprocessing_keeps_is_the_one_a_fresh_interpreter_keeps(launch, tmp_path):
    """torch imports multiprocessing, which keeps the `__main__` of that moment as `__mp_main__`:
    the explainer finds a script's globals there once the script has ended."""
    script = tmp_path / "alias.py"
    script.write_text(MAIN_ALIAS)
    harness = launch == [str(SAMPLES / "trained.py")]  # it imports torch before it runs the script
    forked, fresh = both([sys.executable, *launch, str(script), *([str(tmp_path / "out.pt")] if harness else [])])
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert fresh.stdout.splitlines()[-1] == str(SAMPLES / "trained.py" if harness else script)


def test_a_script_named_from_its_folder_has_the_absolute_file_a_fresh_interpreter_gives_it(tmp_path):
    (tmp_path / "named.py").write_text("import sys\nprint(__file__, sys.argv[0], sys._getframe().f_code.co_filename)\n")
    forked, fresh = both([sys.executable, "named.py"], cwd=tmp_path)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert fresh.stdout == f"{tmp_path / 'named.py'} named.py {tmp_path / 'named.py'}\n"
