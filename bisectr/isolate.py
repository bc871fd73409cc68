"""Isolated sides (`--isolate`): each side's model lives in its own worker process.

Frameworks and their libraries do not always share a process: PaddleFormers switches
`transformers`' torch support off when imported first, its `paddlecodec` dependency breaks
`transformers` imports in the whole environment, and CUDA runtimes can clash. `IsolatedSide`
implements `SideRunner` by asking a worker (`bisectr.isolate.serve`, started with any interpreter
that has bisectr and the side's framework) to build the side with `build_side` and a `LocalSide`,
then to record, re-run and replay it, and to describe recorded calls (for repro scripts). Requests
and replies are pickled over the worker's stdin and stdout and carry only Python builtins, bisectr's
own data classes and numpy arrays (sent as dtype, shape and bytes, so the two interpreters need not
share numpy versions), never framework objects; the worker writes the side's `tensors.bin` itself.
A worker exits when its stdin closes, so it never outlives the process that started it.
"""
from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
import threading
import traceback
import warnings
import weakref
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from . import errors
from .adapters import CannotUpcast
from .errors import BisectrError, UserModelError
from .modelfile import build_side, load_module
from .recording import Call, Gradients, RecordOptions, RerunResult, Slot
from .sides import Float64Run, LocalSide, Watch
from .store import TensorWriter
from .trace import Trace

_PROTOCOL = 5
_STOP_TIMEOUT_S = 5.0

# Run by the worker interpreter before anything else: replies go to a private copy of stdout,
# and fd 1 is pointed at stderr so that the user's prints cannot corrupt them. Needs only the
# standard library, so that an interpreter without bisectr says so instead of crashing.
_BOOTSTRAP = """\
import os, pickle, signal, sys
replies = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    from bisectr.isolate import serve
except Exception as exc:
    pickle.dump(("unusable", f"{type(exc).__name__}: {exc}"), replies, protocol=4)
    replies.flush()
    sys.exit(1)
serve(sys.stdin.buffer, replies)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # skips the frameworks' slow teardown: a worker has nothing left to save
"""


# ---------------------------------------------------------------- the wire


def _array(dtype: str, shape: tuple[int, ...], data: bytes | bytearray) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            array = np.ascontiguousarray(obj)  # at least 1-d: the shape comes from `obj`
            return _array, (array.dtype.str, obj.shape, pickle.PickleBuffer(array))
        return NotImplemented


def _send(stream: BinaryIO, message: tuple) -> None:
    _Pickler(stream, protocol=_PROTOCOL).dump(message)
    stream.flush()


def _receive(stream: BinaryIO) -> tuple:
    return pickle.Unpickler(stream).load()


# ---------------------------------------------------------------- recorded calls, as plain data


class StandIn:
    """An argument of a recorded call that is not plain data (a dtype, a place), as its repr and
    type name: the parent may not have the framework needed to unpickle the object itself."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __reduce__(self) -> tuple:
        return _stand_in, (type(self).__name__, self.text)


@functools.cache
def _stand_in_type(name: str) -> type:
    return type(name, (StandIn,), {})


def _stand_in(name: str, text: str) -> StandIn:
    return _stand_in_type(name)(text)


_PLAIN = {type(None), bool, int, float, complex, str, bytes, slice, type(Ellipsis), Slot}


def _portable(value: Any) -> Any:
    """`value` (a recorded call's arguments) with every object that is not plain data as a `StandIn`."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, (tuple, list)):
        items = [_portable(item) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {key: _portable(item) for key, item in value.items()}
    return _stand_in(type(value).__name__, repr(value))


def _runs_in_the_worker(*args: Any, **kwargs: Any) -> Any:
    raise BisectrError("this recorded call's function lives in its side's worker process; replay it with Sides.replay")


# ---------------------------------------------------------------- the worker


class _Worker:
    """Holds one side in the worker process and answers the parent's requests."""

    def __init__(self):
        self.runner: LocalSide | None = None
        self.trace: Trace | None = None

    def build(self, model_file: str, role: str, function: str) -> None:
        path = Path(model_file)
        self.runner = LocalSide(build_side(load_module(path), path, role, function))

    def record(self, directory: str | None, options: RecordOptions) -> tuple[dict, dict]:
        """The trace as JSON data, and where the worker wrote each tensor in `directory`/tensors.bin."""
        writer = TensorWriter(Path(directory)) if directory is not None else None
        try:
            self.trace = self.runner.record(writer, options)
        finally:
            if writer is not None:
                writer.close()
        return self.trace.to_json(), writer.index if writer is not None else {}

    def rerun(self, patches: dict[int, np.ndarray], capture: set[int]) -> tuple[dict, dict]:
        result = self.runner.rerun(self.trace, patches, capture)
        return result.outputs, result.captured

    def replay(self, index: int, values: dict[int, np.ndarray], float64: bool) -> list[np.ndarray]:
        return self.runner.replay(self.trace, index, values, float64)

    def backward(self, seeds: dict[str, np.ndarray], gradient_patches: dict[int, np.ndarray],
                 activations: dict[int, np.ndarray]) -> Gradients:
        return self.runner.backward(self.trace, seeds, gradient_patches, activations)

    def float64_gradients(self, seeds: dict[str, np.ndarray], leaf_values: dict[str, np.ndarray]) -> tuple[Float64Run | None, str]:
        try:
            return self.runner.float64_gradients(seeds, leaf_values), ""
        except CannotUpcast as exc:
            return None, str(exc)

    def replay_vjp(self, indices: list[int], values: dict[int, np.ndarray], upstream: dict[int, np.ndarray | None],
                   float64: bool) -> dict[int, np.ndarray | None]:
        return self.runner.replay_vjp(self.trace, indices, values, upstream, float64)

    def call(self, index: int) -> tuple[tuple, dict] | None:
        call = self.runner.call(index)
        return None if call is None else (_portable(call.args), _portable(call.kwargs))

    def float64_outputs(self, leaf_values: dict[str, np.ndarray]) -> tuple[Float64Run | None, str]:
        try:
            return self.runner.float64_outputs(leaf_values), ""
        except CannotUpcast as exc:
            return None, str(exc)


def _error_reply(exc: BaseException) -> tuple:
    if isinstance(exc, BisectrError):
        # The user's model could not import something: the interpreter lacks a package.
        lacks_import = isinstance(exc, UserModelError) and isinstance(exc.__context__, ImportError)
        return "error", type(exc).__name__, str(exc), getattr(exc, "user_traceback", ""), lacks_import
    return "failed", f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The worker's loop: one reply per request, until the parent closes `requests`."""
    warnings.filterwarnings("ignore", message="No ccache found")  # printed by paddle on import, as the CLI does
    worker = _Worker()
    while True:
        try:
            kind, *args = _receive(requests)
        except EOFError:
            return
        try:
            reply = ("ok", getattr(worker, kind)(*args))
        except Exception as exc:
            reply = _error_reply(exc)
        try:
            _send(replies, reply)
        except BrokenPipeError:  # the parent stopped listening (it failed elsewhere): leave quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), replies.fileno())
            return


# ---------------------------------------------------------------- the parent's side


def _stop(process: subprocess.Popen) -> None:
    """Close the worker's stdin (it then exits by itself); kill it if it does not."""
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        process.wait(_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class IsolatedSide:
    """A side whose model lives in a worker process started with interpreter `python`.

    The worker keeps the trace it recorded and re-runs and replays against it: the `trace`
    arguments of `rerun` and `replay` are the same recording, read back from the store. An error
    in a request is raised here as the same bisectr error (any other as a RuntimeError) and leaves
    the worker serving, as an in-process side would be.
    """

    def __init__(self, model_file: str | os.PathLike, role: str, function: str, python: str | None = None):
        self.role = role
        self.python = python or sys.executable
        try:
            self.process = subprocess.Popen([self.python, "-c", _BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise BisectrError(f"cannot start the {role} side's interpreter {self.python}: {exc.strerror or exc}") from None
        self._finalizer = weakref.finalize(self, _stop, self.process)
        self._lock = threading.Lock()  # one request at a time (the TUI replays from threads)
        self._send(("build", str(model_file), role, function))

    def wait_built(self) -> None:
        """Wait until the worker has built the side (the build request is sent on start)."""
        self._receive("building the side")

    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        """As `LocalSide.record`; the worker records in another process, so `watch` is not called."""
        directory = None
        if writer is not None:
            writer.close()  # the worker writes this side's tensors.bin; the run adopts its index
            directory = str(writer.path.parent)
        data, index = self._request("recording", "record", directory, options)
        if writer is not None:
            writer.index.update(index)
        return Trace.from_json(data)

    def rerun(self, trace: Trace, patches: dict[int, np.ndarray], capture: set[int] | frozenset = frozenset()) -> RerunResult:
        outputs, captured = self._request("re-running", "rerun", patches, set(capture))
        return RerunResult(outputs, captured)

    def replay(self, trace: Trace, index: int, values: dict[int, np.ndarray], float64: bool = False) -> list[np.ndarray]:
        return self._request(f"replaying op {index}", "replay", index, values, float64)

    def backward(self, trace: Trace, seeds: dict[str, np.ndarray], gradient_patches: dict[int, np.ndarray],
                 activations: dict[int, np.ndarray]) -> Gradients:
        return self._request("running the backward pass", "backward", seeds, gradient_patches, activations)

    def float64_gradients(self, seeds: dict[str, np.ndarray], leaf_values: dict[str, np.ndarray]) -> Float64Run:
        grads, reason = self._request("running the backward pass in float64", "float64_gradients", seeds, leaf_values)
        if grads is None:
            raise CannotUpcast(reason)
        return grads

    def replay_vjp(self, trace: Trace, indices: list[int], values: dict[int, np.ndarray], upstream: dict[int, np.ndarray | None],
                   float64: bool = False) -> dict[int, np.ndarray | None]:
        return self._request(f"replaying the backward of ops {indices[0]}..{indices[-1]}", "replay_vjp", indices, values, upstream, float64)

    def call(self, index: int) -> Call | None:
        """The recorded call's arguments, framework objects as `StandIn`s; its function stays in the worker."""
        found = self._request(f"describing op {index}", "call", index)
        return None if found is None else Call(_runs_in_the_worker, *found)

    def float64_outputs(self, leaf_values: dict[str, np.ndarray]) -> Float64Run:
        outputs, reason = self._request("running in float64", "float64_outputs", leaf_values)
        if outputs is None:
            raise CannotUpcast(reason)
        return outputs

    def close(self) -> None:
        self._finalizer()

    def _request(self, doing: str, kind: str, *args: Any) -> Any:
        with self._lock:
            self._send((kind, *args))
            return self._receive(doing)

    def _send(self, message: tuple) -> None:
        try:
            _send(self.process.stdin, message)
        except (BrokenPipeError, ValueError):  # ValueError: the pipe was closed
            raise self._died(f"sending it a {message[0]} request") from None

    def _receive(self, doing: str) -> Any:
        try:
            reply = _receive(self.process.stdout)
        except (EOFError, ValueError, pickle.UnpicklingError):
            raise self._died(doing) from None
        status, *body = reply
        if status == "ok":
            return body[0]
        raise self._reply_error(status, body)

    def _reply_error(self, status: str, body: list) -> Exception:
        if status == "unusable":
            return BisectrError(f"the {self.role} side's interpreter {self.python} cannot run bisectr's worker "
                                f"({body[0]}); install bisectr in that environment, or choose another "
                                f"interpreter with --{self.role}-python")
        if status == "failed":
            summary, worker_traceback = body
            return RuntimeError(f"{summary} (in the {self.role} side's worker {self.python}; its traceback:\n{worker_traceback})")
        name, message, user_traceback, lacks_import = body
        if lacks_import:
            message += (f" (in the {self.role} side's interpreter {self.python}, which cannot import what the side "
                        f"needs; choose another with --{self.role}-python)")
        cls = getattr(errors, name, BisectrError)
        if not (isinstance(cls, type) and issubclass(cls, BisectrError)):
            cls = BisectrError
        return cls(message, user_traceback) if issubclass(cls, UserModelError) else cls(message)

    def _died(self, doing: str) -> BisectrError:
        self.close()
        return BisectrError(f"the {self.role} side's worker ({self.python}) exited with status "
                            f"{self.process.returncode} while {doing}; its messages are above")


def start_isolated(model_file: str | os.PathLike, functions: dict[str, str],
                   pythons: dict[str, str | None]) -> dict[str, IsolatedSide]:
    """One worker per role (role -> function building it, role -> interpreter), built in parallel.
    On any failure every worker started is stopped, and the first role's error is raised."""
    sides: dict[str, IsolatedSide] = {}
    try:
        for role, function in functions.items():
            sides[role] = IsolatedSide(model_file, role, function, pythons.get(role))
        for side in sides.values():
            side.wait_built()
    except BaseException:
        for side in sides.values():
            side.process.kill()  # it may be busy building: no need to wait for it
            side.close()
        raise
    return sides
