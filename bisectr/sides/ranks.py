"""Ranked sides (`--candidate-nproc N`): one side's model runs on N processes started by torchrun.

A tensor-parallel candidate computes on several processes, each holding a shard of the weights
and exchanging partial results in collectives. `RankedSide` implements `SideRunner` by starting
the side under `torch.distributed.run` (torchrun, the launcher users already run) with N
processes; each rank connects back to this process over a local socket and serves the same
requests an isolated side's worker serves (`bisectr.sides.isolate`). Every request goes to every
rank and every rank answers it, so each collective in the model runs on all of them (lockstep).

Each rank records the ops it runs. A DTensor is read whole (`full_tensor()`, a collective every rank
runs at the same op) and a patch is made into a DTensor placed as the recorded one was (each rank
takes its shard: `Adapter.layout`), so the trace holds global values that compare with the
one-device reference, and a reference value swapped in reaches every rank. What a rank holds as a
plain tensor (after `to_local()`) is its own part: the first rank's is recorded. The ranks must run
the same ops: where their traces differ, the first op that does is named. A rank that fails is
named with its traceback, and a rank that stops answering is given up on after a timeout
(`BISECTR_RANK_TIMEOUT`, seconds; also each rank's process-group timeout), never waited for forever.

On several machines (`Rendezvous`: torchrun's `--nnodes`, `--node-rank`, `--master-addr`, `--master-port`),
node 0 is where bisectr searches: it starts torchrun for its own ranks and listens for every node's ranks on
the master's port + 1. Every other node runs the same command with its own `--node-rank` (`serve_node`): it
starts torchrun for its ranks, which connect to node 0, and waits for them. Ranks that have not all connected
within `BISECTR_JOIN_TIMEOUT` seconds (default 120) are given up on, naming the nodes that never joined.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..errors import BisectrError
from .isolate import Worker, doing, receive_message, reply_error, send_message, serve
from ..capture.recording import RecordOptions
from .runner import EachRank, Request, Watch
from ..capture.store import TensorWriter
from ..capture.trace import RANKS_DIFFER, Trace

RANK_TIMEOUT_S = float(os.environ.get("BISECTR_RANK_TIMEOUT", "60"))
# torchrun's start, every node's joining and each rank's interpreter
_CONNECT_TIMEOUT_S = float(os.environ.get("BISECTR_JOIN_TIMEOUT", "120"))
_STOP_TIMEOUT_S = 5.0
# Once a rank has failed, how long the others have to answer: those that fail the same way answer at
# once; the rest wait in a collective the failed rank never joins.
_AFTER_FAILURE_S = 5.0

# Run by each rank's interpreter (torchrun --no-python): connect back, then serve requests. Needs only
# the standard library until bisectr is imported, so that an interpreter without it says so.
_RANK_BOOTSTRAP = """\
import os, pickle, signal, socket, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
deadline = time.monotonic() + float(sys.argv[3])
while True:  # node 0's bisectr may not listen yet
    try:
        connection = socket.create_connection((sys.argv[1], int(sys.argv[2])))
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
requests, replies = connection.makefile("rb"), connection.makefile("wb")
pickle.dump(("hello", int(os.environ["RANK"])), replies, protocol=4)
replies.flush()
try:
    from bisectr.sides.ranks import serve_rank
except Exception as exc:
    pickle.dump(("unusable", f"{type(exc).__name__}: {exc}"), replies, protocol=4)
    replies.flush()
    sys.exit(1)
serve_rank(requests, replies)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


# ---------------------------------------------------------------- a rank


class RankWorker(Worker):
    """One rank's worker: joins the process group before the model is built; records into a
    scratch directory unless it is the first rank (every rank reads the same tensors, so that
    each runs the same collectives)."""

    on_ranks = True

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def build(self, model_file: str, role: str, function: str) -> None:
        _join_process_group()
        super().build(model_file, role, function)

    def record(self, directory: str | None, options: RecordOptions) -> tuple[dict, dict]:
        if self.rank == 0 or directory is None:
            return super().record(directory, options)
        scratch = tempfile.mkdtemp(prefix=f"bisectr-rank{self.rank}-")
        try:
            return super().record(scratch, options)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _join_process_group() -> None:
    """Start the default process group (gloo, and NCCL for CUDA tensors) with the rank timeout; a
    model file that starts it itself then finds it started."""
    from datetime import timedelta

    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise BisectrError(
            f"a side on several processes runs on torch.distributed, and this interpreter cannot import it ({exc})"
        ) from None

    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=RANK_TIMEOUT_S))
    start = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            start(*args, **kwargs)

    dist.init_process_group = init_process_group


def serve_rank(requests: BinaryIO, replies: BinaryIO) -> None:
    """A rank's loop (see `isolate.serve`)."""
    serve(requests, replies, RankWorker(int(os.environ["RANK"])))


# ---------------------------------------------------------------- where the ranks meet


@dataclass
class Rendezvous:
    """How a side's ranks spread over machines, as torchrun's options say it: `nnodes` machines, this one
    `node_rank`, node 0 at `master_addr`:`master_port` (torchrun's store; bisectr listens on the next port).
    One machine: torchrun's `--standalone`."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def parent(self) -> tuple[str, int]:
        """Where node 0's bisectr listens for the ranks."""
        return (self.master_addr, self.master_port + 1 if self.nnodes > 1 else 0)

    def torchrun_options(self, nproc: int) -> list[str]:
        if self.nnodes == 1:
            return ["--standalone", f"--nproc-per-node={nproc}"]
        return [
            f"--nnodes={self.nnodes}",
            f"--node-rank={self.node_rank}",
            f"--master-addr={self.master_addr}",
            f"--master-port={self.master_port}",
            f"--rdzv-conf=timeout={max(1, round(_CONNECT_TIMEOUT_S))}",  # a node 0 that never comes
            f"--nproc-per-node={nproc}",
        ]


def _torchrun(python: str, nproc: int, rendezvous: Rendezvous, parent: tuple[str, int]) -> list[str]:
    """The command starting this node's `nproc` ranks, each connecting to the parent at `parent`."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        *rendezvous.torchrun_options(nproc),
        "--no-python",
        python,
        "-c",
        _RANK_BOOTSTRAP,
        parent[0],
        str(parent[1]),
        str(_CONNECT_TIMEOUT_S),
    ]


# glibc raises its mmap threshold as large blocks are freed, up to 32 MB. A rank that keeps two trainers and reads
# parameters whole between their steps then leaves freed shards and gradients as holes in its heap, which grows
# by hundreds of MB per step. A fixed threshold returns each freed tensor's pages (the user's own setting wins).
RANK_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def _rank_environment() -> dict[str, str]:
    # One hash seed for every rank: a model that iterates a set of strings (Gemma-3's rotary tables, one per
    # layer type) then runs its ops in one order on all of them.
    seed = os.environ.get("PYTHONHASHSEED", "random")
    return {**RANK_ALLOCATOR, **os.environ, "PYTHONHASHSEED": "0" if seed == "random" else seed}


def serve_node(role: str, nproc: int, rendezvous: Rendezvous, python: str | None = None) -> None:
    """Node `rendezvous.node_rank` (not 0) of a side on several machines: start torchrun for this node's `nproc`
    ranks, which connect to node 0's bisectr and serve it, and wait until they are done."""
    python = python or sys.executable
    print(
        f"bisectr: node {rendezvous.node_rank} of {rendezvous.nnodes}: {nproc} rank(s) of the {role} side for "
        f"the bisectr on {rendezvous.master_addr} (node 0)",
        file=sys.stderr,
        flush=True,
    )
    try:
        status = subprocess.run(
            _torchrun(python, nproc, rendezvous, rendezvous.parent),
            stdin=subprocess.DEVNULL,
            stdout=2,
            env=_rank_environment(),
        ).returncode
    except OSError as exc:
        raise BisectrError(f"cannot start torchrun for node {rendezvous.node_rank} with {python}: {exc}") from None
    if status != 0:
        raise BisectrError(
            f"node {rendezvous.node_rank}'s ranks ended with torchrun's status {status}: node 0 never came to the "
            f"rendezvous at {rendezvous.master_addr}:{rendezvous.master_port} within {_CONNECT_TIMEOUT_S:.0f} s, "
            "or stopped it (its messages are above and on node 0)"
        )


# ---------------------------------------------------------------- the parent's side


class RankedSide:
    """A side whose model runs on `nproc` ranks per node that torchrun starts with interpreter `python`, on the
    nodes `rendezvous` says (this one node 0)."""

    def __init__(
        self,
        model_file: str | os.PathLike,
        role: str,
        function: str,
        nproc: int,
        python: str | None = None,
        rendezvous: Rendezvous | None = None,
    ):
        self.role, self.rendezvous = role, rendezvous or Rendezvous()
        self.nproc = nproc * self.rendezvous.nnodes  # every rank, on every node
        self.python = python or sys.executable
        self.connections: list[socket.socket] = []
        self.streams: list[tuple[BinaryIO, BinaryIO]] = []  # by rank: (requests, replies)
        try:
            server = socket.create_server(self.rendezvous.parent)
        except OSError as exc:
            raise BisectrError(
                f"cannot listen for the {role} side's ranks on {self.rendezvous.parent[0]}:{self.rendezvous.parent[1]} "
                f"({exc.strerror or exc}): node 0's bisectr listens on the master port + 1"
            ) from None
        command = _torchrun(self.python, nproc, self.rendezvous, server.getsockname()[:2])
        try:
            # The ranks' own output (the user's prints, torchrun's) goes to file descriptor 2 (also where
            # Python's sys.stderr is replaced, in a notebook): stdout is bisectr's.
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=2, start_new_session=True, env=_rank_environment()
            )
        except OSError as exc:
            server.close()
            raise BisectrError(
                f"cannot start torchrun for the {role} side with {self.python}: {exc.strerror or exc}"
            ) from None
        self._finalizer = weakref.finalize(self, _stop, self.process, self.connections)
        try:
            self._accept(server)
        finally:
            server.close()
        self._lock = threading.Lock()
        self._send_all(("build", str(model_file), role, function))

    def _accept(self, server: socket.socket) -> None:
        """Wait for every rank to connect and say which rank it is."""
        by_rank: dict[int, tuple[socket.socket, BinaryIO, BinaryIO]] = {}
        server.settimeout(0.2)
        deadline = time.monotonic() + _CONNECT_TIMEOUT_S
        while len(by_rank) < self.nproc:
            if self.process.poll() is not None:
                self.close()
                raise BisectrError(
                    f"torchrun for the {self.role} side ({self.python} -m torch.distributed.run) exited with "
                    f"status {self.process.returncode} before its ranks started; its messages are above"
                )
            if time.monotonic() > deadline:
                self.close()
                raise BisectrError(
                    f"the {self.role} side's ranks did not all start within {_CONNECT_TIMEOUT_S:.0f} s "
                    f"({len(by_rank)} of {self.nproc} did){self._missing_nodes(by_rank)} (BISECTR_JOIN_TIMEOUT "
                    "sets the timeout)"
                )
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            connection.settimeout(None)
            requests, replies = connection.makefile("wb"), connection.makefile("rb")
            _, rank = receive_message(replies)
            by_rank[rank] = (connection, requests, replies)
        for rank in range(self.nproc):
            connection, requests, replies = by_rank[rank]
            self.connections.append(connection)
            self.streams.append((requests, replies))

    def _missing_nodes(self, connected: dict) -> str:
        """Which nodes never joined, where the side spans several."""
        rendezvous = self.rendezvous
        if rendezvous.nnodes == 1:
            return ""
        per_node = self.nproc // rendezvous.nnodes
        missing = sorted({rank // per_node for rank in range(self.nproc) if rank not in connected} - {0})
        if not connected:  # torchrun starts no rank until every node has joined its rendezvous
            missing = list(range(1, rendezvous.nnodes))
        nodes = ", ".join(map(str, missing))
        return (
            f": node {nodes} of {rendezvous.nnodes} never joined (the rendezvous at {rendezvous.master_addr}:"
            f"{rendezvous.master_port}); every node runs the same command with its own --node-rank"
            if missing
            else ""
        )

    def wait_built(self) -> None:
        self._collect("building the side")

    def record(self, writer: TensorWriter | None, options: RecordOptions, watch: Watch | None = None) -> Trace:
        """As `LocalSide.record`, on every rank; the first rank writes the side's tensors.bin. The
        ranks must have run the same ops."""
        directory = None
        if writer is not None:
            writer.close()
            directory = str(writer.path.parent)
        with self._lock:
            self._send_all(("record", directory, options))
            answers = self._collect("recording")
        traces = [Trace.from_json(data) for data, _ in answers]
        _refuse_diverging_ranks(self.role, traces)
        _mark_differing_tensors(traces)
        if writer is not None:
            writer.index.update(answers[0][1])
        return traces[0]

    def run(self, request: Request) -> Any:
        """The first rank's answer (every rank's, by rank, to an `EachRank` request)."""
        each = isinstance(request, EachRank)
        asked = request.request if each else request
        with self._lock:
            self._send_all(("run", asked))
            answers = self._collect(doing(asked))
        return answers if each else answers[0]

    def close(self) -> None:
        self._finalizer()

    def abandon(self) -> None:
        """Stop the ranks now, busy or not."""
        _kill(self.process)
        self.close()

    def _send_all(self, message: tuple) -> None:
        for rank, (requests, _) in enumerate(self.streams):
            try:
                send_message(requests, message)
            except (BrokenPipeError, ConnectionError, ValueError):
                raise self._died(f"sending rank {rank} a {message[0]} request") from None

    def _collect(self, what: str) -> list[Any]:
        """Every rank's answer to the request just sent, by rank. Once one rank has answered, the others have
        the rank timeout, and once one has failed, a few seconds. A rank's error is raised naming the rank;
        where every rank answered, the ranks are still in lockstep and serve the next request (a float64 run
        every rank refuses), else they are stopped."""
        answers: queue.Queue = queue.Queue()
        for rank, (_, replies) in enumerate(self.streams):
            threading.Thread(target=_read_reply, args=(rank, replies, answers), daemon=True).start()
        got: dict[int, Any] = {}
        failed: dict[int, tuple] = {}
        deadline = None
        while len(got) + len(failed) < self.nproc:
            try:
                rank, reply = answers.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                late = sorted(set(range(self.nproc)) - set(got) - set(failed))
                self.close()
                if failed:
                    break
                raise BisectrError(
                    f"rank {', '.join(map(str, late))} of the {self.role} side did not answer within "
                    f"{RANK_TIMEOUT_S:g} s of rank {min(got)} while {what}: the ranks ran different ops or "
                    f"collectives (BISECTR_RANK_TIMEOUT sets the timeout)"
                ) from None
            if reply is None:
                raise self._died(what, rank)
            status, *body = reply
            if status == "ok":
                got[rank] = body[0]
            else:
                failed[rank] = (status, body)
            deadline = deadline or time.monotonic() + RANK_TIMEOUT_S
            if failed:
                deadline = min(deadline, time.monotonic() + _AFTER_FAILURE_S)
        if failed:
            rank = min(failed)
            status, body = failed[rank]
            said = 1 if status == "error" else 0  # where the reply holds its message
            body[said] = f"rank {rank} of the {self.role} side: {body[said]}"
            raise reply_error(status, body, self.role, self.python, f"rank {rank}") from None
        return [got[rank] for rank in range(self.nproc)]

    def _died(self, what: str, rank: int | None = None) -> BisectrError:
        self.close()
        who = f"rank {rank} of the {self.role} side" if rank is not None else f"torchrun for the {self.role} side"
        return BisectrError(
            f"{who} ({self.python}) exited while {what} (torchrun's status {self.process.returncode}); "
            "its messages are above"
        )


def _read_reply(rank: int, replies: BinaryIO, answers: queue.Queue) -> None:
    try:
        answers.put((rank, receive_message(replies)))
    except Exception:  # the rank exited, or its connection was closed after another failed
        answers.put((rank, None))


def _refuse_diverging_ranks(role: str, traces: list[Trace]) -> None:
    """Raise where a rank ran other ops than the first rank, or the same op on other tensors (ops run in
    another order): the first op that differs, on both."""
    first = traces[0]
    for rank, trace in enumerate(traces[1:], start=1):
        for index in range(max(len(first.ops), len(trace.ops))):
            mine = trace.ops[index] if index < len(trace.ops) else None
            theirs = first.ops[index] if index < len(first.ops) else None
            if (
                mine is None
                or theirs is None
                or (mine.framework_op, mine.module) != (theirs.framework_op, theirs.module)
            ):
                raise BisectrError(
                    f"the {role} side's ranks ran different ops: op {index} is "
                    f"{_described(mine)} on rank {rank} and {_described(theirs)} on rank 0"
                )
            if _sources(trace, mine) != _sources(first, theirs):
                raise BisectrError(
                    f"the {role} side's ranks ran their ops in different orders: op {index}, "
                    f"{_described(mine)}, reads the outputs of ops {_producers(trace, mine)} on rank {rank} "
                    f"and of ops {_producers(first, theirs)} on rank 0"
                )


def _mark_differing_tensors(traces: list[Trace]) -> None:
    """Mark the first rank's plain tensors whose values differ on another rank (by their statistics)."""
    first = traces[0]
    for tid, info in first.tensors.items():
        if info.placement is None and any(trace.tensors[tid].stats != info.stats for trace in traces[1:]):
            info.placement = RANKS_DIFFER


def _sources(trace: Trace, op: Any) -> list[int | str | None]:
    """Where each of `op`'s inputs comes from: the op that made it, or its leaf name. (Which of that op's
    outputs may depend on the rank: each takes its own chunk.)"""
    return [
        trace.tensors[tid].leaf if trace.tensors[tid].producer is None else trace.tensors[tid].producer
        for tid in op.inputs
    ]


def _producers(trace: Trace, op: Any) -> str:
    """The ops that made `op`'s inputs, in order, e.g. '68, 79' ('-' for a parameter or an input)."""
    return ", ".join(str(source) if isinstance(source, int) else "-" for source in _sources(trace, op))


def _described(op: Any) -> str:
    if op is None:
        return "none (its forward had ended)"
    return f"{op.framework_op} in {op.module or 'the model'} at {op.source}"


def _stop(process: subprocess.Popen, connections: list[socket.socket]) -> None:
    """Close the connections (each rank then exits by itself); kill torchrun and its ranks if they do not."""
    for connection in connections:
        try:
            connection.shutdown(socket.SHUT_RDWR)  # the readers' files keep the socket open past close()
            connection.close()
        except OSError:
            pass
    try:
        process.wait(_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    _kill(process)


def _kill(process: subprocess.Popen) -> None:
    """Kill torchrun and its ranks (its process group)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
