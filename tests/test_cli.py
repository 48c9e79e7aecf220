"""`python -m explainer run` keeps CONTRACT.md's promises."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT


def write(tmp_path, name: str, code: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def plain_python(script, *args):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_script_runs_as_main_with_its_argv_and_path(tmp_path, explain_run):
    script = write(tmp_path, "show.py", """
        import sys
        print(__name__, sys.argv, sys.path[0])
    """)
    run = explain_run(script, "--lr", "0.1", "x")
    assert run.returncode == 0
    assert run.stdout == f"__main__ {[str(script), '--lr', '0.1', 'x']} {tmp_path}\n"
    assert run.findings == [] and run.stderr == ""


def test_exit_code_is_the_scripts_own(tmp_path, explain_run):
    assert explain_run(write(tmp_path, "three.py", "import sys; sys.exit(3)")).returncode == 3
    assert explain_run(write(tmp_path, "msg.py", "import sys; sys.exit('bye')")).returncode == 1


def test_unexplained_error_prints_exactly_what_python_prints(tmp_path, explain_run):
    script = write(tmp_path, "boom.py", """
        def f():
            return {}["missing"]
        f()
    """)
    run = explain_run(script)
    plain = plain_python(script)
    assert run.returncode == plain.returncode == 1
    assert run.stderr == plain.stderr
    assert run.findings == []


def test_explained_error_keeps_pythons_traceback_and_adds_the_explanation(tmp_path, explain_run):
    script = ROOT / "samples" / "rnn_hidden_chunks.py"
    run = explain_run(script)
    plain = plain_python(script)
    assert run.returncode == plain.returncode == 1
    assert run.stderr.startswith(plain.stderr.rstrip("\n"))
    assert "[explainer] second-backward" in run.stderr[len(plain.stderr.rstrip()):]
    assert run.stdout == plain.stdout


def test_json_is_written_when_the_script_ends_well(tmp_path, explain_run):
    run = explain_run(write(tmp_path, "ok.py", "print('fine')"))
    assert (run.returncode, run.stdout, run.findings) == (0, "fine\n", [])


def test_json_findings_follow_the_contract(explain_run):
    run = explain_run(ROOT / "samples" / "rnn_hidden_chunks.py")
    (finding,) = run.findings
    assert set(finding) >= {"kind", "severity", "message", "culprits", "fixes"}
    culprit = finding["culprits"][0]
    assert set(culprit) >= {"name", "filename", "location", "role"}
    assert os.path.isabs(culprit["filename"])
    for fix in finding["fixes"]:
        assert set(fix) >= {"message", "applicability", "edits"}
        for edit in fix["edits"]:
            assert set(edit) >= {"filename", "content", "location", "end_location"}
            assert edit["location"]["row"] >= 1 and edit["location"]["column"] >= 1


def test_missing_script_is_a_clear_usage_error(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "explainer", "run", "--json", str(out), "nope.py"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "nope.py" in proc.stderr
    assert json.loads(out.read_text()) == {"version": 1, "findings": []}


def test_an_unwritable_json_path_is_refused_before_the_script_runs(tmp_path):
    marker = tmp_path / "ran"
    script = write(tmp_path, "ok.py", f"open({str(marker)!r}, 'w').write('ran')\n")
    for target in (tmp_path / "no" / "such" / "out.json", tmp_path):
        proc = subprocess.run([sys.executable, "-m", "explainer", "run", "--json", str(target), str(script)],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and f"can't write --json {str(target)!r}" in proc.stderr
        assert "Traceback" not in proc.stderr and not marker.exists()


def test_json_that_cannot_be_written_at_the_end_keeps_the_scripts_exit_code(tmp_path):
    """The folder of OUT goes away while the script runs: one line says so, and the exit code
    stays the script's (it once became 1, with the tool's own traceback)."""
    folder = tmp_path / "out"
    folder.mkdir()
    script = write(tmp_path, "gone.py", f"""
        import shutil, sys
        shutil.rmtree({str(folder)!r})
        sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, "-m", "explainer", "run", "--json", str(folder / "out.json"), str(script)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "can't write --json" in proc.stderr and "Traceback" not in proc.stderr


def test_columns_count_code_points(tmp_path, explain_run):
    script = write(tmp_path, "unicode.py", """
        import torch
        rnn = torch.nn.RNN(2, 3)
        état = torch.zeros(1, 1, 3)
        for _ in range(2):
            out, état = rnn(torch.randn(4, 1, 2), état)  # é is one column
            out.sum().backward()
    """)
    run = explain_run(script)
    (finding,) = run.findings
    edit = finding["fixes"][0]["edits"][0]
    line = script.read_text().splitlines()[edit["location"]["row"] - 1]
    start, end = edit["location"]["column"] - 1, edit["end_location"]["column"] - 1
    assert line[start:end] == "état"
    assert edit["content"] == "état.detach()"


def test_a_script_without_torch_never_imports_it(tmp_path, explain_run):
    script = write(tmp_path, "plain.py", """
        import sys
        print("torch" in sys.modules)
    """)
    run = explain_run(script, fresh=True)
    assert (run.returncode, run.stdout, run.stderr) == (0, "False\n", "")


def test_importing_the_package_does_not_import_torch():
    proc = subprocess.run([sys.executable, "-c", "import sys, explainer; print('torch' in sys.modules)"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout == "False\n", proc.stderr


def _explainer(*args, cwd, env=None, **options):
    return subprocess.run([sys.executable, "-m", "explainer", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, **options)


MODULE_TRAIN = """
    import sys
    import torch
    print(__name__, sys.argv, sys.path[0])
    rnn = torch.nn.RNNCell(3, 4)
    hidden = torch.zeros(1, 4)
    for step in range(3):
        hidden = rnn(torch.randn(1, 3), hidden)
        hidden.sum().backward()
"""


def test_a_module_runs_as_python_dash_m_runs_it_and_is_explained(tmp_path):
    """`explainer run -m src.train ARGS` as `python -m src.train ARGS`: __main__, argv[0] the
    module's file, the current folder first on sys.path, everything after MODULE its arguments
    (options included); the finding names the module's file."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "__init__.py").write_text("")
    train = write(tmp_path / "src", "train.py", MODULE_TRAIN)
    out = tmp_path / "out.json"
    run = _explainer("run", "--json", str(out), "-m", "src.train", "--lr", "3", "-m", "x", cwd=tmp_path)
    plain = subprocess.run([sys.executable, "-m", "src.train", "--lr", "3", "-m", "x"], capture_output=True,
                           text=True, cwd=tmp_path)
    assert run.stdout == plain.stdout == f"__main__ {[str(train), '--lr', '3', '-m', 'x']} {tmp_path}\n"
    assert run.returncode == plain.returncode == 1
    (finding,) = json.loads(out.read_text())["findings"]
    assert finding["culprits"][0]["name"] == "hidden" and finding["culprits"][0]["filename"] == str(train)
    assert finding["culprits"][0]["location"]["row"] == 8

    # A package, through its __main__, as python runs it.
    write(tmp_path / "src", "__main__.py", MODULE_TRAIN)
    package = _explainer("run", "-m", "src", cwd=tmp_path)
    assert package.returncode == 1 and "[explainer]" in package.stderr and "__main__.py" in package.stdout


MODULE_TRAINS = """
    import torch
    torch.manual_seed(0)
    rnn = torch.nn.RNNCell(3, 4)
    opt = torch.optim.SGD(rnn.parameters(), lr=0.1)
    hidden = torch.zeros(1, 4)
    for step in range(3):
        hidden = rnn(torch.randn(1, 3), hidden)
        opt.zero_grad()
        hidden.sum().backward()
        opt.step()
"""


def _trains_like(script, twin, tmp_path) -> list[str]:
    """Why `script` does not train what `twin` trains (empty when it does), seeded alike."""
    import trained  # samples/, on the path conftest sets

    return trained.like_a_twin(trained.trained_by(script, tmp_path / "fixed.pt"), [twin], tmp_path)


def _with_fix(script, fix: dict):
    from explainer.fixes.edits import apply_edits
    from explainer.model import Fix

    patched = script.with_name(f"{script.stem}_patched.py")
    patched.write_text(apply_edits(script.read_text(), Fix.from_json(fix).edits))
    return patched


def test_a_module_entry_points_fix_trains_what_its_twin_trains(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "__init__.py").write_text("")
    train = write(tmp_path / "src", "train.py", MODULE_TRAINS)
    twin = write(tmp_path, "twin.py", MODULE_TRAINS.replace("rnn(torch.randn(1, 3), hidden)",
                                                            "rnn(torch.randn(1, 3), hidden.detach())"))
    out = tmp_path / "out.json"
    assert _explainer("run", "--json", str(out), "-m", "src.train", cwd=tmp_path).returncode == 1
    (finding,) = json.loads(out.read_text())["findings"]
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"]) == ("hidden", 8)
    fixed = _with_fix(train, finding["fixes"][0])
    assert subprocess.run([sys.executable, str(fixed)], capture_output=True, cwd=tmp_path).returncode == 0
    assert _trains_like(fixed, twin, tmp_path) == []
    # the comparison can fail: the buggy script's first step alone is not the twin's training
    first_step_only = write(tmp_path, "one_step.py", MODULE_TRAINS.replace("range(3)", "range(1)"))
    assert _trains_like(first_step_only, twin, tmp_path) != []


def test_a_missing_module_is_one_line_like_python(tmp_path):
    out = tmp_path / "out.json"
    run = _explainer("run", "--json", str(out), "-m", "no_such_module", cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr == f"explainer: no module named 'no_such_module' (from {tmp_path})\n"
    assert json.loads(out.read_text()) == {"version": 1, "findings": []}


def test_a_launcher_says_what_to_run_instead(tmp_path):
    """`explainer run $(which torchrun) ...` once ran torchrun, whose workers are new processes
    the explainer never reaches, and explained nothing. The launcher pip made is recognised, and
    nothing runs."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    assert os.path.isfile(torchrun)
    marker = tmp_path / "ran"
    train = write(tmp_path, "train.py", f"open({str(marker)!r}, 'w')\n")
    run = _explainer("run", torchrun, "--nproc-per-node", "1", str(train), cwd=tmp_path)
    assert run.returncode == 2 and not marker.exists()
    assert run.stderr == ("explainer: torchrun is a launcher (torch.distributed.run): the training it starts runs in "
                          "other processes, which this run does not reach. Instead: torchrun [its options] -m "
                          "explainer run SCRIPT [ARGS]\n")


def test_run_needs_a_script_or_a_module(tmp_path):
    run = _explainer("run", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.splitlines()[-1].endswith("error: run needs SCRIPT or -m MODULE")


def test_the_torchrun_recipe_explains_once_from_the_first_failing_rank(tmp_path, monkeypatch):
    """The documented recipe, with two gloo processes: `torchrun ... -m explainer run SCRIPT`."""
    train = write(tmp_path, "ddp_train.py", """
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.GRU(3, 4, batch_first=True))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hidden = torch.zeros(1, 2, 4)
        for step in range(3):
            out, hidden = model(torch.randn(2, 5, 3), hidden)
            loss = out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    out = tmp_path / "out.json"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    run = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "explainer", "run", "--json",
                          str(out), str(train)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1
    # One explanation, from the first rank that failed; the other says in one line which.
    full = [line for line in run.stderr.splitlines() if "[explainer] second-backward (BX001 carried-state)" in line]
    short = [line for line in run.stderr.splitlines() if "Explained in full by rank" in line]
    assert len(full) == len(short) == 1, run.stderr
    first = full[0].split("]")[0].removeprefix("[rank")
    assert short[0].endswith(f"[explainer] `hidden` carries the graph of the previous iteration into this backward. "
                             f"Explained in full by rank {first}, the first rank that failed.")
    (finding,) = json.loads(out.read_text())["findings"]
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"]) == ("hidden", 10)

    # fixes[0] trains what the twin trains: each rank runs the same code, so one rank is compared
    # (a world of one, on gloo), seeded alike.
    twin = write(tmp_path, "ddp_twin.py", train.read_text().replace("model(torch.randn(2, 5, 3), hidden)",
                                                                    "model(torch.randn(2, 5, 3), hidden.detach())"))
    fixed = _with_fix(train, finding["fixes"][0])
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _trains_like(fixed, twin, tmp_path) == []


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_script_gets_the_globals_python_gives_it(tmp_path):
    """Run by a relative path: `__file__` absolute (python sets it so since 3.9; `chdir` then
    `dirname(__file__)` broke), the builtins module, a SourceFileLoader, `__package__` None; and
    the traceback names the file as python does."""
    write(tmp_path, "show.py", """
        import sys
        g = globals()
        print(repr(__file__), type(__builtins__).__name__, type(g.get("__loader__")).__name__,
              repr(g.get("__package__")), repr(g.get("__spec__")), sorted(k for k in g if k.startswith("__")),
              sys.modules["__main__"].__dict__ is g, sys.argv[0])
        raise ValueError("at the end")
    """)
    ours = _explainer("run", "show.py", cwd=tmp_path)
    python = subprocess.run([sys.executable, "show.py"], capture_output=True, text=True, cwd=tmp_path)
    assert (ours.returncode, ours.stdout, ours.stderr) == (python.returncode, python.stdout, python.stderr)
    assert f"'{tmp_path / 'show.py'}' module SourceFileLoader None None" in ours.stdout


def _sigint_as_in_a_shell():
    """SIGINT as a shell gives a command it runs: a test run started in the background
    (`nohup ... &`) passes SIGINT on ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_ends_like_python_with_130_and_still_writes_the_json(tmp_path):
    write(tmp_path, "interrupted.py", """
        import os, signal, time
        print("started", flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    """)
    out = tmp_path / "out.json"
    ours = _explainer("run", "--json", str(out), "interrupted.py", cwd=tmp_path, preexec_fn=_sigint_as_in_a_shell)
    python = subprocess.run([sys.executable, "interrupted.py"], capture_output=True, text=True, cwd=tmp_path,
                            preexec_fn=_sigint_as_in_a_shell)
    assert ours.returncode == python.returncode == -2  # killed by SIGINT: a shell says 130
    assert (ours.stdout, ours.stderr) == (python.stdout, python.stderr)
    assert json.loads(out.read_text()) == {"version": 1, "findings": []}


def test_a_syntax_error_reads_as_pythons(tmp_path):
    write(tmp_path, "broken.py", "x = (1,\nprint(x\n")
    ours = _explainer("run", "broken.py", cwd=tmp_path)
    python = subprocess.run([sys.executable, "broken.py"], capture_output=True, text=True, cwd=tmp_path)
    assert (ours.returncode, ours.stdout, ours.stderr) == (python.returncode, python.stdout, python.stderr)


CARRIED = """
    import torch
    rnn = torch.nn.RNNCell(3, 4)

    def train():
        hidden = torch.zeros(1, 4)
        for step in range(3):
            hidden = rnn(torch.randn(1, 3), hidden)
            hidden.sum().backward()
"""


ENDINGS = {
    "sys.exit after catching it, as Hydra does": (
        "import sys\ntry:\n    train()\nexcept RuntimeError as error:\n    print('failed:', type(error).__name__)\n"
        "    sys.exit(1)\n", 1),
    "re-raised as another error": (
        "class TrainingFailed(Exception):\n    pass\ntry:\n    train()\nexcept RuntimeError as error:\n"
        "    raise TrainingFailed('step failed') from error\n", 1),
    "inside an ExceptionGroup": (
        "try:\n    train()\nexcept RuntimeError as error:\n    raise ExceptionGroup('workers failed', [error])\n", 1),
    "in a thread, the script ending well": (
        "import threading\nworker = threading.Thread(target=train)\nworker.start()\nworker.join()\n", 0),
}


@pytest.mark.parametrize("ending", list(ENDINGS.values()), ids=list(ENDINGS))
def test_the_finding_is_recorded_however_the_script_ends(tmp_path, ending):
    """The JSON (and the editor) get the finding of an explained error that did not end the
    script itself."""
    tail, returncode = ending
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(CARRIED) + tail)
    out = tmp_path / "out.json"
    run = _explainer("run", "--json", str(out), str(script), cwd=tmp_path)
    assert run.returncode == returncode, run.stderr
    (finding,) = json.loads(out.read_text())["findings"]
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"]) == ("hidden", 8)


def test_an_error_caught_and_recovered_from_is_not_reported(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(CARRIED) + "try:\n    train()\nexcept RuntimeError:\n    print('skipped')\n")
    out = tmp_path / "out.json"
    run = _explainer("run", "--json", str(out), str(script), cwd=tmp_path)
    assert (run.returncode, run.stdout) == (0, "skipped\n")
    assert json.loads(out.read_text())["findings"] == []


COMPILED = """
    import torch

    rnn = torch.nn.RNNCell(3, 4)
    opt = torch.optim.SGD(rnn.parameters(), lr=0.1)


    @torch.compile(backend="eager")
    def train_step(x, hidden):
        hidden = rnn(x, hidden)
        loss = hidden.pow(2).mean()
        loss.backward()
        return hidden


    hidden = torch.zeros(1, 4)
    for step in range(3):
        hidden = train_step(torch.randn(1, 3), hidden)
        opt.step()
        opt.zero_grad()
"""

COMPILED_SHARED = """
    import torch

    encoder, head_a, head_b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)


    @torch.compile(backend="eager")
    def train_step(x):
        features = encoder(x)
        head_a(features).sum().backward()
        head_b(features).sum().backward()


    train_step(torch.randn(2, 3))
"""


def test_a_compiled_step_is_explained_or_says_why_not(tmp_path):
    """A `torch.compile`d step calls the original backward, which the hooks never see: the error
    is explained after the fact (likely), or one line says it cannot be and what to do."""
    out = tmp_path / "out.json"
    run = _explainer("run", "--json", str(out), str(write(tmp_path, "compiled.py", COMPILED)), cwd=tmp_path)
    assert run.returncode == 1 and "[explainer] second-backward (BX001 carried-state)" in run.stderr, run.stderr
    assert "or it ran inside torch.compile" in " ".join(run.stderr.split())
    (finding,) = json.loads(out.read_text())["findings"]
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"], finding["confidence"]) == \
        ("hidden", 10, "likely")

    shared = _explainer("run", "--json", str(out), str(write(tmp_path, "shared.py", COMPILED_SHARED)), cwd=tmp_path)
    assert shared.returncode == 1
    assert shared.stderr.rstrip().splitlines()[-1] == (
        "[explainer] this error was raised inside a torch.compile'd function, where the explainer records nothing, "
        "and its frames do not show the cause: run that function once without torch.compile (or under "
        "torch.compiler.disable) to have it explained.")
    assert json.loads(out.read_text())["findings"] == []


def test_python_processes_the_script_starts_are_explained_and_keep_their_own_sitecustomize(tmp_path):
    """`explainer run` reaches the Python processes its script starts (Lightning's DDP re-runs the
    script as plain `python` for its other ranks): the child explains its error, and a
    sitecustomize the user had on PYTHONPATH still runs there."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("print('their sitecustomize ran')\n")
    write(tmp_path, "child.py", """
        import torch
        rnn = torch.nn.RNNCell(3, 4)
        hidden = torch.zeros(1, 4)
        for step in range(2):
            hidden = rnn(torch.randn(1, 3), hidden)
            hidden.sum().backward()
    """)
    write(tmp_path, "parent.py", """
        import subprocess, sys
        child = subprocess.run([sys.executable, "child.py"], capture_output=True, text=True)
        print(child.stdout, end="")
        print(child.stderr, end="")
        plain = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
                               capture_output=True, text=True)
        print("torch imported by a child that does not use it:", plain.stdout.split()[-1])
    """)
    run = _explainer("run", "parent.py", cwd=tmp_path, env={"PYTHONPATH": f"{ROOT}{os.pathsep}{theirs}"})
    assert run.returncode == 0, run.stderr
    assert "their sitecustomize ran" in run.stdout
    assert "[explainer] second-backward (BX001 carried-state): `hidden` carries" in run.stdout
    assert "torch imported by a child that does not use it: False" in run.stdout


def test_lightning_ddp_ranks_are_all_explained_once(tmp_path):
    """Lightning's DDP on two CPU processes: rank 1 is started by rank 0 as plain `python SCRIPT`.
    One rank explains in full, the other says which did in one line, and --json has the finding."""
    write(tmp_path, "ddp_train.py", """
        import lightning as L
        import torch


        class Forecaster(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.rnn = torch.nn.GRU(3, 5, batch_first=True)
                self.head = torch.nn.Linear(5, 1)
                self.hidden = None

            def training_step(self, batch, batch_idx):
                x, y = batch
                out, self.hidden = self.rnn(x, self.hidden)
                return torch.nn.functional.mse_loss(self.head(out), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        if __name__ == "__main__":
            data = torch.utils.data.TensorDataset(torch.randn(8, 4, 3), torch.randn(8, 4, 1))
            loader = torch.utils.data.DataLoader(data, batch_size=2)
            trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
            model = Forecaster()
            trainer.fit(model, loader)
    """)
    out, temporary = tmp_path / "out.json", tmp_path / "tmp"
    temporary.mkdir()
    run = _explainer("run", "--json", str(out), "ddp_train.py", cwd=tmp_path, env={"TMPDIR": str(temporary)})
    assert run.returncode == 1
    full = [line for line in run.stderr.splitlines() if "[explainer] second-backward (BX001 carried-state)" in line]
    short = [line for line in run.stderr.splitlines() if "Explained in full by rank" in line]
    assert len(full) == len(short) == 1, run.stderr
    assert {full[0][:8], short[0][:8]} == {"[rank0]:", "[rank1]:"}
    # The ranks raced for one marker, named so that no later run can meet it.
    (marker,) = temporary.glob("backward-explainer-rank-*")
    assert marker.name.count("-") == 4 and marker.read_text() in ("0", "1")
    (finding,) = json.loads(out.read_text())["findings"]
    assert (finding["culprits"][0]["name"], finding["culprits"][0]["location"]["row"]) == ("self.hidden", 15)
