"""The run directory's integrity: checksums, strictly read storage tables, the writer's lock,
leftovers of writers that died, and failed writes (disk full) that leave nothing behind."""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import bisectr
import bisectr.capture.store as store
from bisectr.errors import RunDirError, RunWriteError
from bisectr.capture.locks import RunLock
from bisectr.capture.store import RunWriter, save_result
from conftest import MODELS, mounted_tmpfs

OPS_FILE = MODELS / "torch_ops.py"

# Several MB of stored values: 8 parameters of 512x512 float32 (1 MB each) and their activations.
BIG_MODEL = """
def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).eval(), (torch.randn(1024, 512),)


def reference():
    return _model()


def candidate():
    return _model()
"""


def _storage(run_dir: Path, side: str = "candidate") -> dict:
    return json.loads((run_dir / side / "trace.json").read_text())["storage"]


def _biggest_intermediate(run_dir: Path) -> int:
    """The tid of the candidate's largest stored tensor that is not an output (nothing reads it on load)."""
    trace = json.loads((run_dir / "candidate" / "trace.json").read_text())
    outputs = set(trace["outputs"].values())
    sizes = {int(tid): np.prod(shape) for tid, (_, _, shape, _) in trace["storage"].items() if int(tid) not in outputs}
    return max(sizes, key=sizes.get)


def _dead_pid() -> int:
    for pid in (2**22 + 123, 2**22 + 4567, 2**31 - 2):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    pytest.skip("found no pid that is free")


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _top_files(run_dir: Path) -> dict[str, bytes]:
    """The files at the top of a run directory (manifest, result, ...) and what they hold."""
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


# ---------------------------------------------------------------- checksums


def test_a_flipped_byte_is_reported_when_its_tensor_is_read(tmp_path):
    run_dir = tmp_path / "run"
    bisectr.trace(OPS_FILE, out=run_dir)
    tid = _biggest_intermediate(run_dir)
    offset = _storage(run_dir)[str(tid)][0]
    blob = run_dir / "candidate" / "tensors.bin"
    data = bytearray(blob.read_bytes())
    data[offset + 5] ^= 0x10
    blob.write_bytes(bytes(data))

    loaded = bisectr.load(run_dir)
    for _ in range(2):  # a damaged tensor is never taken as verified
        with pytest.raises(RunDirError) as raised:
            loaded.candidate.value(tid)
        assert str(raised.value) == f"{blob}: tensor {tid}: checksum mismatch (the file was modified or damaged)"
    other = loaded.candidate.outputs["output"]
    assert np.isfinite(loaded.candidate.value(other)).all()


def test_each_tensor_is_checked_once(tmp_path, monkeypatch):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    loaded = bisectr.load(tmp_path / "run")
    checked = []
    checksum = store._checksum

    def counted_checksum(data):
        checked.append(data)
        return checksum(data)

    monkeypatch.setattr(store, "_checksum", counted_checksum)
    tid = _biggest_intermediate(tmp_path / "run")
    first = loaded.candidate.value(tid)
    again = loaded.candidate.value(tid)
    assert len(checked) == 1
    np.testing.assert_array_equal(first, again)


def test_every_dtype_and_shape_reads_back_checked(tmp_path):
    arrays = [
        np.zeros((0, 3), np.float32),
        np.arange(6, dtype=np.float16).reshape(2, 3),
        (np.arange(4) + 1j).astype(np.complex64),
        np.array([True, False]),
        np.arange(10, dtype=">i4")[::2],
    ]
    writer = store.TensorWriter(tmp_path)
    for tid, values in enumerate(arrays):
        writer.write(tid, values)
    writer.close()
    reader = store.StoredValues(writer.path, writer.index)
    for tid, values in enumerate(arrays):
        read = reader(tid)
        assert read.dtype == values.dtype and read.shape == values.shape
        np.testing.assert_array_equal(read, values)


# ---------------------------------------------------------------- what load accepts


def _set_entry(run_dir: Path, change) -> None:
    path = run_dir / "candidate" / "trace.json"
    data = json.loads(path.read_text())
    tid = str(data["outputs"]["output"])
    data["storage"][tid] = change(data["storage"][tid], (run_dir / "candidate" / "tensors.bin").stat().st_size)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda e, size: [e[0], e[1], [-1, *e[2][1:]], e[3]], "shape"),
        (lambda e, size: [e[0], e[1], [2.5], e[3]], "shape"),
        (lambda e, size: [e[0], "O", e[2], e[3]], "not a plain numeric or bool dtype"),
        (lambda e, size: [e[0], "<U4", e[2], e[3]], "not a plain numeric or bool dtype"),
        (lambda e, size: [e[0], "no such dtype", e[2], e[3]], "numpy does not know the dtype"),
        (lambda e, size: [e[0], 7, e[2], e[3]], "dtype is not a string"),
        (lambda e, size: [-64, e[1], e[2], e[3]], "offset"),
        (lambda e, size: [True, e[1], e[2], e[3]], "offset"),
        (lambda e, size: e[:3], "expected \\[offset, dtype, shape, crc32\\]"),
        (lambda e, size: [*e[:3], "1234"], "checksum"),
        (lambda e, size: [*e[:3], 2**40], "checksum"),
        (lambda e, size: {"offset": e[0]}, "expected"),
    ],
)
def test_a_malformed_storage_entry_is_refused_naming_trace_json(tmp_path, change, problem):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    _set_entry(tmp_path / "run", change)
    with pytest.raises(RunDirError, match=f"candidate/trace.json: corrupt storage entry .*{problem}"):
        bisectr.load(tmp_path / "run")


def test_an_entry_past_the_end_of_tensors_bin_is_refused(tmp_path):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    _set_entry(tmp_path / "run", lambda e, size: [size + 64, *e[1:]])
    with pytest.raises(
        RunDirError, match=r"tensors.bin: truncated or missing \(\d+ bytes; .*candidate/trace.json places tensor"
    ):
        bisectr.load(tmp_path / "run")


@pytest.mark.parametrize(
    "damage",
    [
        lambda trace: trace["storage"].pop(str(trace["outputs"]["output"])),  # a stored tensor without an entry
        lambda trace: trace.update(storage=[]),
        lambda trace: trace["ops"][0].update(inputs=[10**6]),  # a tensor the trace does not hold
        lambda trace: trace["ops"][0].update(index=5),
        lambda trace: trace["ops"].append({"index": 0}),  # fields missing
        lambda trace: trace["tensors"][0].update(shape=[None]),
        lambda trace: trace["tensors"][0].update(tid=[1]),  # unhashable
        lambda trace: trace["tensors"][0].update(producer=10**6),
        lambda trace: trace["tensors"][0].update(stats={"min": "low"}),
        lambda trace: trace.update(outputs={"output": "x"}),
        lambda trace: trace.update(tensors=7),
    ],
)
def test_a_damaged_trace_is_refused_naming_the_file(tmp_path, damage):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    path = tmp_path / "run" / "candidate" / "trace.json"
    trace = json.loads(path.read_text())
    damage(trace)
    path.write_text(json.dumps(trace))
    with pytest.raises(RunDirError, match=f"^{path}: corrupt"):
        bisectr.load(tmp_path / "run")


@pytest.mark.parametrize("text", ["[]", '"bisectr-run"', "3", "null"])
def test_a_manifest_that_is_not_an_object_is_refused(tmp_path, text):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    (tmp_path / "run" / "manifest.json").write_text(text)
    with pytest.raises(RunDirError, match="manifest.json: not a bisectr run manifest"):
        bisectr.load(tmp_path / "run")


# ---------------------------------------------------------------- the lock


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    """Another process holding the run's lock until its stdin closes."""
    code = (
        "import sys\nfrom bisectr.capture.locks import RunLock\n"
        "with RunLock(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    bisectr.trace(OPS_FILE, out=run_dir)
    before = (run_dir / "manifest.json").read_text()
    holder = _hold_lock(run_dir)
    try:
        with pytest.raises(
            RunDirError,
            match=rf"^{run_dir}: another bisectr process \(pid {holder.pid}: .*-c .*\) is "
            "writing this run; wait for it or choose another -o$",
        ):
            bisectr.trace(OPS_FILE, out=run_dir)
        with pytest.raises(RunDirError, match=f"pid {holder.pid}"):
            save_result(run_dir, "some run id", {})
    finally:
        holder.stdin.close()
        holder.wait()
    assert (run_dir / "manifest.json").read_text() == before
    assert _listing(tmp_path) == ["run"]  # the holder removed its lock file
    bisectr.trace(OPS_FILE, out=run_dir)


def test_a_killed_holder_leaves_a_lock_file_that_blocks_nobody(tmp_path):
    holder = _hold_lock(tmp_path / "run")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert _listing(tmp_path) == [".run.lock"]
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    assert _listing(tmp_path) == ["run"]


def test_a_longer_hold_keeps_others_out_between_writes(tmp_path):
    run_dir = tmp_path / "run"
    with RunLock(run_dir):
        run = bisectr.trace(OPS_FILE, out=run_dir)  # joins this process's hold
        code = "import sys; from bisectr.capture.locks import RunLock; RunLock(sys.argv[1]).acquire()"
        refused = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True)
        assert refused.returncode != 0 and f"another bisectr process (pid {os.getpid()}:" in refused.stderr
        save_result(run_dir, run.run_id, {})
    assert _listing(tmp_path) == ["run"]


def test_one_process_writes_a_run_through_one_writer_at_a_time(tmp_path):
    first = RunWriter(tmp_path / "run")
    with pytest.raises(RunDirError, match="this process is already writing this run"):
        RunWriter(tmp_path / "run")
    first.abort()
    RunWriter(tmp_path / "run").abort()
    assert _listing(tmp_path) == []


# ---------------------------------------------------------------- leftovers of writers that died


def test_leftovers_of_dead_writers_are_removed_by_the_next_writer(tmp_path):
    run_dir = tmp_path / "run"
    bisectr.trace(OPS_FILE, out=run_dir)
    dead, live = _dead_pid(), os.getppid()
    for name in (f".run.partial-{dead}", f".run.old-{dead}", f".run.partial-{live}", f".other.partial-{dead}"):
        (tmp_path / name / "candidate").mkdir(parents=True)
        (tmp_path / name / "candidate" / "tensors.bin").write_bytes(b"\0" * 100)
    (run_dir / f".result.json.{dead}").write_text("")
    (run_dir / f".result.json.{live}").write_text("")

    RunWriter(run_dir).abort()

    assert _listing(tmp_path) == [".other.partial-" + str(dead), f".run.partial-{live}", "run"]
    assert f".result.json.{dead}" not in _listing(run_dir) and f".result.json.{live}" in _listing(run_dir)
    bisectr.trace(OPS_FILE, out=run_dir)  # replaces the run: its temporaries go with it
    assert _listing(tmp_path) == [".other.partial-" + str(dead), f".run.partial-{live}", "run"]


def test_a_previous_run_moved_aside_by_a_dead_writer_is_put_back(tmp_path):
    run_dir = tmp_path / "run"
    bisectr.trace(OPS_FILE, out=run_dir)
    manifest = (run_dir / "manifest.json").read_text()
    dead = _dead_pid()
    run_dir.rename(tmp_path / f".run.old-{dead}")  # died between its two renames
    (tmp_path / f".run.partial-{dead}").mkdir()

    RunWriter(run_dir).abort()

    assert _listing(tmp_path) == ["run"]
    assert (run_dir / "manifest.json").read_text() == manifest
    bisectr.load(run_dir)


# ---------------------------------------------------------------- failed writes


class _FillingFile:
    """A file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, file, room: int):
        self._file, self._room = file, room

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= size
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)


def _disk_fills_after(monkeypatch, room: int) -> None:
    monkeypatch.setattr(store, "open", lambda *args, **kwargs: _FillingFile(open(*args, **kwargs), room), raising=False)


def _assert_unchanged(run_dir: Path, manifest: str, raised: pytest.ExceptionInfo) -> None:
    """The failed write said why and that nothing was saved; the run it would have replaced is whole,
    and nothing else is left beside it."""
    assert "No space left on device" in str(raised.value)
    assert str(raised.value).endswith(f"nothing was saved; {run_dir} is unchanged")
    assert _listing(run_dir.parent) == [run_dir.name]
    assert (run_dir / "manifest.json").read_text() == manifest
    loaded = bisectr.load(run_dir)
    assert all(loaded.candidate.value(tid) is not None for tid, info in loaded.candidate.tensors.items() if info.stored)


def test_a_full_disk_while_recording_saves_nothing(tmp_path, monkeypatch):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    manifest = (tmp_path / "run" / "manifest.json").read_text()
    _disk_fills_after(monkeypatch, 2000)
    with pytest.raises(RunWriteError) as raised:
        bisectr.trace(OPS_FILE, out=tmp_path / "run")
    assert "tensors.bin: cannot write (No space left on device)" in str(raised.value)
    _assert_unchanged(tmp_path / "run", manifest, raised)


# Catches every exception of its forward, bisectr's own included.
SWALLOWING_MODEL = """
def _model():
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            try:
                return self.proj(x).relu()
            except Exception:
                return x

    return Net().eval(), (torch.randn(4, 64),)


def reference():
    return _model()


def candidate():
    return _model()
"""


def test_a_write_failure_the_model_swallows_still_fails_the_run(tmp_path, monkeypatch):
    model = tmp_path / "swallows.py"
    model.write_text(textwrap.dedent(SWALLOWING_MODEL))
    run_dir = tmp_path / "runs" / "run"
    bisectr.trace(model, out=run_dir)
    manifest = (run_dir / "manifest.json").read_text()
    _disk_fills_after(monkeypatch, 4 * 64 * 4 + 100)  # the input fits, the weight does not
    with pytest.raises(RunWriteError) as raised:
        bisectr.trace(model, out=run_dir)
    _assert_unchanged(run_dir, manifest, raised)


def test_a_failed_result_write_leaves_nothing(tmp_path, monkeypatch):
    run = bisectr.trace(OPS_FILE, out=tmp_path / "run")
    save_result(run.run_dir, run.run_id, {"verdict": "match"})
    before = _top_files(tmp_path / "run")
    write_text = Path.write_text

    def disk_full(path: Path, text: str, *args, **kwargs):
        write_text(path, "")  # opened and truncated, as a real write that fails is
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(
        RunWriteError,
        match=rf"\.result\.json\.{os.getpid()}: cannot write \(No space left on device\); "
        rf"nothing was saved; {tmp_path / 'run'} is unchanged",
    ):
        save_result(run.run_dir, run.run_id, {"verdict": "divergent"})
    monkeypatch.undo()
    assert _listing(tmp_path) == ["run"]
    assert _top_files(tmp_path / "run") == before


def test_an_unwritable_place_is_reported_and_left_clean(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked").chmod(0o500)
    try:
        with pytest.raises(RunWriteError, match="Permission denied"):
            bisectr.trace(OPS_FILE, out=tmp_path / "locked" / "run")
    finally:
        (tmp_path / "locked").chmod(0o700)
    assert _listing(tmp_path / "locked") == []


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MB tmpfs (root only)."""
    with mounted_tmpfs(tmp_path / "tiny", "2m") as mount_point:
        yield mount_point


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_real_full_disk_saves_nothing(tiny_disk, tmp_path, isolate):
    big_model = tmp_path / "big.py"
    big_model.write_text(textwrap.dedent(BIG_MODEL))
    bisectr.trace(OPS_FILE, out=tiny_disk / "run")
    manifest = (tiny_disk / "run" / "manifest.json").read_text()
    with pytest.raises(RunWriteError) as raised:
        bisectr.trace(big_model, out=tiny_disk / "run", isolate=isolate)
    assert "tensors.bin: cannot write (No space left on device)" in str(raised.value)
    _assert_unchanged(tiny_disk / "run", manifest, raised)


def test_a_real_full_disk_fails_a_result_write_cleanly(tiny_disk):
    run = bisectr.trace(OPS_FILE, out=tiny_disk / "run")
    save_result(run.run_dir, run.run_id, {"verdict": "match"})
    before = _top_files(tiny_disk / "run")
    with open(tiny_disk / "filler", "wb", buffering=0) as filler:
        with pytest.raises(OSError, match="No space left on device"):
            while True:
                filler.write(b"\0" * 4096)
    with pytest.raises(
        RunWriteError, match=r"/\.result\.json\.\d+: cannot write \(No space left on device\); nothing was saved"
    ):
        save_result(run.run_dir, run.run_id, {"verdict": "divergent", "padding": "x" * 100_000})
    assert _listing(tiny_disk) == ["filler", "run"]
    assert _top_files(tiny_disk / "run") == before
