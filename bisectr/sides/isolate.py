"""Isolated sides (`--isolate`): each side's model lives in its own worker process.

Frameworks and their libraries do not always share a process: PaddleFormers switches
`transformers`' torch support off when imported first, its `paddlecodec` dependency breaks
`transformers` imports in the whole environment, and CUDA runtimes can clash. `IsolatedSide`
implements `SideRunner` by asking a worker (`bisectr.sides.isolate.serve`, started with any interpreter
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
import weakref
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .. import errors
from ..adapters import CannotUpcast, silence_import_warnings
from ..errors import BisectrError, UserModelError
from ..capture.modelfile import build_side, load_module
from ..capture.calls import Call, Slot
from ..capture.recording import RecordOptions
from .runner import (
    Backward,
    Float64Gradients,
    Float64Outputs,
    LeafValue,
    LocalSide,
    RecordAgain,
    RecordedCall,
    Replay,
    ReplayVJP,
    Request,
    Rerun,
    StepValues,
    TrainStep,
    Watch,
)
from ..capture.store import TensorWriter
from ..capture.trace import Trace

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
    from bisectr.sides.isolate import serve
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


def send_message(stream: BinaryIO, message: tuple) -> None:
    _Pickler(stream, protocol=_PROTOCOL).dump(message)
    stream.flush()


def receive_message(stream: BinaryIO) -> tuple:
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
    raise BisectrError(
        "this recorded call's function lives in its side's worker process; replay it with a sides.Replay request"
    )


# ---------------------------------------------------------------- the worker


class Worker:
    """Holds one side in the worker process and answers the parent's requests."""

    def __init__(self):
        self.runner: LocalSide | None = None

    on_ranks = False  # one rank of a side on several processes

    def build(self, model_file: str, role: str, function: str) -> None:
        path = Path(model_file)
        self.runner = LocalSide(build_side(load_module(path), path, role, function), self.on_ranks)

    def record(self, directory: str | None, options: RecordOptions) -> tuple[dict, dict]:
        """The trace as JSON data, and where the worker wrote each tensor in `directory`/tensors.bin."""
        writer = TensorWriter(Path(directory)) if directory is not None else None
        try:
            trace = self.runner.record(writer, options)
        finally:
            if writer is not None:
                writer.close()
        return trace.to_json(), writer.index if writer is not None else {}

    def run(self, request: Request) -> Any:
        """The local side's answer; a recorded call comes back with its arguments made portable and
        its function left here."""
        answer = self.runner.run(request)
        if isinstance(answer, Call):
            return Call(_runs_in_the_worker, _portable(answer.args), _portable(answer.kwargs), answer.device)
        return answer


def _error_reply(exc: BaseException) -> tuple:
    if isinstance(exc, CannotUpcast):
        return "cannot_upcast", str(exc)
    if isinstance(exc, BisectrError):
        # The user's model could not import something: the interpreter lacks a package.
        lacks_import = isinstance(exc, UserModelError) and isinstance(exc.__context__, ImportError)
        return "error", type(exc).__name__, str(exc), getattr(exc, "user_traceback", ""), lacks_import
    return (
        "failed",
        f"{type(exc).__name__}: {exc}",
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


def serve(requests: BinaryIO, replies: BinaryIO, worker: Worker | None = None) -> None:
    """The worker's loop: one reply per request, until the parent closes `requests`."""
    silence_import_warnings()  # as the CLI does
    worker = worker or Worker()
    while True:
        try:
            kind, *args = receive_message(requests)
        except EOFError:
            return
        try:
            reply = ("ok", getattr(worker, kind)(*args))
        except Exception as exc:
            reply = _error_reply(exc)
        try:
            send_message(replies, reply)
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

    The worker keeps the trace it recorded and answers each request (`sides.Request`) against it.
    An error in a request is raised here as the same bisectr error (any other as a RuntimeError)
    and leaves the worker serving, as an in-process side would be.
    """

    def __init__(self, model_file: str | os.PathLike, role: str, function: str, python: str | None = None):
        self.role = role
        self.python = python or sys.executable
        try:
            self.process = subprocess.Popen(
                [self.python, "-c", _BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        except OSError as exc:
            raise BisectrError(
                f"cannot start the {role} side's interpreter {self.python}: {exc.strerror or exc}"
            ) from None
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

    def run(self, request: Request) -> Any:
        return self._request(doing(request), "run", request)

    def close(self) -> None:
        self._finalizer()

    def abandon(self) -> None:
        """Stop the worker now, busy or not."""
        self.process.kill()
        self.close()

    def _request(self, doing: str, kind: str, *args: Any) -> Any:
        with self._lock:
            self._send((kind, *args))
            return self._receive(doing)

    def _send(self, message: tuple) -> None:
        try:
            send_message(self.process.stdin, message)
        except (BrokenPipeError, ValueError):  # ValueError: the pipe was closed
            raise self._died(f"sending it a {message[0]} request") from None

    def _receive(self, doing: str) -> Any:
        try:
            reply = receive_message(self.process.stdout)
        except (EOFError, ValueError, pickle.UnpicklingError):
            raise self._died(doing) from None
        status, *body = reply
        if status == "ok":
            return body[0]
        raise self._reply_error(status, body)

    def _reply_error(self, status: str, body: list) -> Exception:
        return reply_error(status, body, self.role, self.python, "worker")

    def _died(self, doing: str) -> BisectrError:
        self.close()
        return BisectrError(
            f"the {self.role} side's worker ({self.python}) exited with status "
            f"{self.process.returncode} while {doing}; its messages are above"
        )


def reply_error(status: str, body: list, role: str, python: str, worker: str) -> Exception:
    """The exception a worker's error reply stands for (`worker`: which process, for the message)."""
    if status == "cannot_upcast":
        return CannotUpcast(body[0])
    if status == "unusable":
        return BisectrError(
            f"the {role} side's interpreter {python} cannot run bisectr's {worker} "
            f"({body[0]}); install bisectr in that environment, or choose another "
            f"interpreter with --{role}-python"
        )
    if status == "failed":
        summary, worker_traceback = body
        return RuntimeError(f"{summary} (in the {role} side's {worker} {python}; its traceback:\n{worker_traceback})")
    name, message, user_traceback, lacks_import = body
    if lacks_import:
        message += (
            f" (in the {role} side's interpreter {python}, which cannot import what the side "
            f"needs; choose another with --{role}-python)"
        )
    cls = getattr(errors, name, BisectrError)
    if not (isinstance(cls, type) and issubclass(cls, BisectrError)):
        cls = BisectrError
    return cls(message, user_traceback) if issubclass(cls, UserModelError) else cls(message)


def doing(request: Request) -> str:
    """What the worker is doing while it answers `request`, for the message should it die."""
    match request:
        case Rerun():
            return "re-running"
        case Replay(indices) if len(indices) == 1:
            return f"replaying op {indices[0]}"
        case Replay(indices) | ReplayVJP(indices):
            return (
                f"replaying {'the backward of ' if isinstance(request, ReplayVJP) else ''}"
                f"ops {indices[0]}..{indices[-1]}"
            )
        case Backward():
            return "running the backward pass"
        case Float64Outputs():
            return "running in float64"
        case Float64Gradients():
            return "running the backward pass in float64"
        case RecordedCall(index):
            return f"describing op {index}"
        case LeafValue(tid):
            return f"reading tensor {tid} from the model"
        case RecordAgain():
            return "recording again"
        case TrainStep(width, number):
            return f"training step {number}" + (" in float64" if width == 64 else "")
        case StepValues(width, measure, parameter):
            return f"reading {parameter}'s {measure}" + (" in float64" if width == 64 else "")
    return type(request).__name__
