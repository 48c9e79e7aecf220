"""The tests' Python processes, forked from one that has imported torch already.

A run of `python -m explainer run` on a sample of a dozen lines spent four of its four and a half
seconds importing torch, and torch._dynamo, which the first optimizer imports; the suite starts
thousands of them, and its CI run went past its time. A process forked from one that has made
those imports starts in a tenth of a second. It is still a real process: its own pid, working
directory, environment, argv, `sys.path`, standard streams, main thread and exit status, the same
interpreter and the same torch, the explainer's command line run as `python -m` runs it, with no
frame below the run that is not a library's, and the `__main__` multiprocessing keeps where a
fresh one keeps it.

What a fork cannot give, it does not pretend to. Variables that Python, torch or its libraries
read when they start (but OMP_NUM_THREADS, which the child sets) are those its server started
with, one server for each set of them asked for. A run that asks for a PYTHONPATH other than this
checkout, or for options of the interpreter, or any run while EXPLAINER_TEST_FORK=0, is a plain
`subprocess.run`. torch is imported before the run starts, so the explainer installs its hooks at
once, not where the script imports torch: a test of that (a script that never imports torch)
asks for a fresh interpreter. tests/test_forkserver.py compares the two on the same runs.

`run` takes the arguments `subprocess.run` is given in the tests and returns what it returns.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Read by Python, torch, numpy or their runtimes while they import: a child forked after those
# imports would run with the server's values, not the ones asked for.
_READ_AT_START = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "KMP_", "MKL_", "OPENBLAS", "GOMP", "CUDA", "NVIDIA", "LD_",
                  "MALLOC", "NUMPY", "LC_", "LANG")


def _read_at_start(env: dict[str, str]) -> frozenset:
    return frozenset((k, v) for k, v in env.items() if k.startswith(_READ_AT_START) and k != "OMP_NUM_THREADS")


class _Server:
    """A process that forks runs whose environment reads, at start-up, as `env` does; started on
    first use, stopped when the tests end."""

    def __init__(self, env: dict[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="forkserver-"))
        self.address = str(self.folder / "socket")
        # Its standard input is how it learns that this process has gone: it exits on end of file.
        self.process = subprocess.Popen([sys.executable, __file__, self.address], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        self.ready = self.process.stdout.readline().strip() == "ready"
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)

    def serving(self) -> bool:
        return self.ready and self.process.poll() is None


# One server for each environment asked for, as a library the tests import may add a variable
# to theirs (transformers sets TORCHINDUCTOR_CACHE_DIR): a few at most.
_servers: dict[frozenset, _Server] = {}
_starting = threading.Lock()
_AT_MOST = 4


def _server_for(args: list[str], env: dict[str, str]) -> _Server | None:
    """The server whose child runs `args` under `env` as a fresh interpreter would, if any."""
    if os.environ.get("EXPLAINER_TEST_FORK") == "0" or env.get("PYTHONPATH") != str(ROOT):
        return None
    if len(args) < 2 or args[0] != sys.executable or (args[1].startswith("-") and args[1] not in ("-m", "-c")):
        return None
    key = _read_at_start(env)
    with _starting:
        if key not in _servers and len(_servers) < _AT_MOST:
            _servers[key] = _Server(env)
        server = _servers.get(key)
    return server if server is not None and server.serving() else None


def forks(args: list[str], env: dict[str, str]) -> bool:
    """Whether `run(args, env=env)` is a child of a server (otherwise a plain subprocess)."""
    return _server_for([str(a) for a in args], env) is not None


def run(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str] | None = None,
        timeout: float | None = None, capture_output: bool = True, text: bool = True) -> subprocess.CompletedProcess:
    """`subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)`."""
    assert capture_output and text, "the tests only read a run's output as text"
    args = [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    server = _server_for(args, env)
    if server is None:
        return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="forked-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        request = {"args": args[1:], "cwd": os.path.abspath(cwd or os.getcwd()), "env": env,
                   "stdout": str(out), "stderr": str(err)}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(server.address)
            connection.settimeout(timeout)
            connection.sendall(json.dumps(request).encode() + b"\n")
            answers = connection.makefile()
            pid = int(answers.readline())
            try:
                returncode = int(answers.readline())
            except (TimeoutError, socket.timeout):
                os.kill(pid, 9)
                raise subprocess.TimeoutExpired(args, timeout) from None
        return subprocess.CompletedProcess(args, returncode, out.read_text(), err.read_text())


# The server's side: everything below runs in the forked processes, never in the tests' own.

def _serve(address: str) -> None:
    import signal

    # numpy's OpenBLAS starts its threads when numpy is imported; a fork would copy none of them.
    # Started with one, the children's numpy multiplies on one thread (torch's own threads are
    # the child's OMP_NUM_THREADS, set when it starts).
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (imported by the first optimizer made)

    import explainer.cli  # noqa: F401
    import explainer.runtime  # noqa: F401

    del os.environ["OPENBLAS_NUM_THREADS"]
    # Forking a process with threads copies none of them, and whatever they held stays held.
    if len(os.listdir("/proc/self/task")) != 1:
        print("threads", flush=True)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the waiters
    # The runs are forked from a thread of their own, which becomes the child's main thread: its
    # stack holds threading's frames and these, compiled as frozen code as runpy's are, so that
    # no frame below the run is one the explainer could take for the user's (the main thread's
    # stack holds this file's).
    for function in (_accept, _wait_on_one, _become, _alias_main_when_torch_is_imported, _run_as_main):
        function.__code__ = _frozen(function.__code__)
    # Not a daemon, as a main thread is not: the threads a run starts are not daemons either.
    serving = threading.Thread(target=_accept, args=(listener,), name="MainThread")
    print("ready", flush=True)
    serving.start()
    serving.join()


_FROZEN = "<frozen forkserver>"


def _frozen(code):
    return code.replace(co_filename=_FROZEN, co_consts=tuple(_frozen(c) if isinstance(c, type(code)) else c
                                                             for c in code.co_consts))


def _accept(listener: socket.socket) -> None:
    import selectors
    import signal

    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ)
    events.register(sys.stdin, selectors.EVENT_READ)
    while True:
        for key, _ in events.select():
            if key.fileobj is sys.stdin:
                return  # the tests have ended
            connection, _ = listener.accept()
            if os.fork() == 0:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                listener.close()
                _wait_on_one(connection)
            connection.close()


def _wait_on_one(connection: socket.socket) -> None:
    """Fork the run asked for, say its pid, wait for it and say how it ended."""
    request = json.loads(connection.makefile().readline())
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        connection.close()
        _become(request)
    connection.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _become(request: dict) -> None:
    """Turn this child into `python *request['args']`, run it, and exit as Python would."""
    import atexit as exits
    import random
    import runpy

    import numpy
    import torch

    code = 1
    try:
        with open(os.devnull) as nothing:
            os.dup2(nothing.fileno(), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "OMP_NUM_THREADS" in os.environ:
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        # A fresh interpreter seeds these from the system; forked, every child would draw what
        # the server would have drawn.
        random.seed()
        numpy.random.seed()
        torch.seed()
        _alias_main_when_torch_is_imported()
        args = request["args"]
        try:
            if args[0] == "-m":
                sys.argv, sys.path[0] = ["-m", *args[2:]], os.getcwd()
                runpy._run_module_as_main(args[1], alter_argv=True)
            elif args[0] == "-c":
                sys.argv, sys.path[0] = ["-c", *args[2:]], ""
                _run_as_main(args[1], "<string>")
            else:
                sys.argv, sys.path[0] = list(args), os.path.dirname(os.path.realpath(args[0]))
                _run_as_main(Path(args[0]).read_bytes(), os.path.abspath(args[0]))
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException as error:  # noqa: BLE001 - reported as the interpreter reports it
            # From the first frame of the run on, as the interpreter would show it: none of these.
            while error.__traceback__ and error.__traceback__.tb_frame.f_code.co_filename == _FROZEN:
                error.__traceback__ = error.__traceback__.tb_next
            sys.excepthook(type(error), error, error.__traceback__)
        for thread in threading.enumerate():  # as the interpreter does before it exits
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        exits._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream has nothing left to write
                pass
        os._exit(code)


def _alias_main_when_torch_is_imported() -> None:
    """multiprocessing, which torch imports, keeps the `__main__` of the moment it is first
    imported as `__mp_main__` (in a fresh `python -m explainer run SCRIPT`, the script's module,
    which the explainer still finds there once the script has ended). The server imported it
    already: the child drops that alias and makes it again where the run's own code, not the
    explainer's, first imports torch."""
    import builtins

    sys.modules.pop("__mp_main__", None)
    original = builtins.__import__

    def importing(name, globals=None, *rest, **named):
        if name.split(".")[0] in ("torch", "multiprocessing") \
                and not (globals or {}).get("__name__", "").startswith("explainer"):
            builtins.__import__ = original
            if "__main__" in sys.modules:
                sys.modules["__mp_main__"] = sys.modules["__main__"]
        return original(name, globals, *rest, **named)

    builtins.__import__ = importing


def _run_as_main(source: str | bytes, filename: str) -> None:
    """Run `source` as the interpreter runs a script (`filename` absolute, as Python 3.9 on makes
    `__file__`) or `-c`: in a new `__main__`."""
    import types
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=__builtins__, __cached__=None)
    if filename != "<string>":
        main.__file__, main.__loader__ = filename, SourceFileLoader("__main__", filename)
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


if __name__ == "__main__":
    _serve(sys.argv[1])
