"""The run directory: lazy reads, atomic writes, options for big models, corrupt runs."""

import json

import numpy as np
import pytest

import bisectr
from bisectr.errors import RunDirError
from bisectr.capture.trace import host_dtype
from conftest import MODELS

OPS_FILE = MODELS / "torch_ops.py"


def test_load_reopens_traces_with_memory_mapped_values(tmp_path):
    run = bisectr.trace(OPS_FILE, out=tmp_path / "run")
    loaded = bisectr.load(tmp_path / "run")
    assert [o.to_json() for o in loaded.candidate.ops] == [o.to_json() for o in run.candidate.ops]
    tid = loaded.candidate.outputs["output"]
    values = loaded.candidate.value(tid)
    assert _memory_mapped(values)
    np.testing.assert_array_equal(values, run.candidate.value(tid))
    assert loaded.model_file == OPS_FILE.resolve()
    assert loaded.output_error() == run.output_error()


def _memory_mapped(values: np.ndarray) -> bool:
    """Is `values` a view into a memory-mapped file (not a copy)?"""
    while values is not None and not isinstance(values, np.memmap):
        values = values.base
    return values is not None


def test_a_run_holds_no_parameter_values_and_reads_them_from_the_live_model(tmp_path):
    """Parameters and buffers are not copied into tensors.bin (their statistics and fingerprints are in
    trace.json); a live run reads them from the model, a reopened one says where they are."""
    run = bisectr.trace(MODELS / "hf_gpt2.py", candidate="candidate_untransposed", out=tmp_path / "run")
    for trace in (run.reference, run.candidate):
        leaves = [info for info in trace.tensors.values() if (info.leaf or "").startswith(("param:", "buffer:"))]
        assert len(leaves) >= 40 and not any(info.stored for info in leaves)
        assert all(
            trace.has_value(info.tid) and info.stats.absmax > 0 for info in leaves if info.leaf.endswith(".weight")
        )
        stored = sum(
            info.size * np.dtype(host_dtype(info.dtype)).itemsize for info in trace.tensors.values() if info.stored
        )
        assert (
            stored <= (tmp_path / "run" / trace.side / "tensors.bin").stat().st_size <= stored + 64 * len(trace.tensors)
        )
    result = run.bisect()
    assert (
        result.culprit.kind == "leaf"
        and result.culprit.leaf.endswith("h.2.attn.c_proj.weight")
        and result.confirmation.confirmed
    )
    run.save()
    reopened = bisectr.load(tmp_path / "run")
    weight = reopened.candidate.leaves[f"param:{result.culprit.leaf}"]
    assert not reopened.candidate.has_value(weight) and reopened.result.culprit == result.culprit
    with pytest.raises(KeyError, match="are in the model, which this run no longer has"):
        reopened.candidate.value(weight)
    assert {p.status for p in reopened.alignment.leaves.pairs} == {"equal", "different"}


def test_a_saved_run_is_searched_again_as_a_new_live_run_and_stays_as_it_was_until_that_is_saved(tmp_path):
    """A loaded run runs nothing: `bisect` says how to search it again; `traced_again` makes a new live run
    of the model file into the same directory, which replaces the saved one only once saved."""
    model_file = MODELS / "hf_gpt2.py"
    bisectr.trace(model_file, candidate="candidate_untransposed", out=tmp_path / "run").save()
    saved = bisectr.load(tmp_path / "run")
    with pytest.raises(RunDirError, match=r"a saved run runs nothing by itself.*run\.traced_again\(model_file\)"):
        saved.bisect()
    again = saved.traced_again(model_file)
    assert again is not saved and again.is_live and not saved.is_live and saved.result is None
    assert again.traced.candidate_fn == "candidate_untransposed" and again.run_id != saved.run_id
    result = again.bisect()
    assert result.culprit.leaf.endswith("h.2.attn.c_proj.weight") and bisectr.load(tmp_path / "run").result is None
    again.save()
    reopened = bisectr.load(tmp_path / "run")
    assert reopened.run_id == again.run_id and reopened.result.culprit == result.culprit


def test_a_zero_dimensional_tensor_is_stored_with_its_shape(tmp_path):
    """HF's causal mask reads `torch.zeros(())`: stored and read back (live and reopened) as a 0-d array."""
    run = bisectr.trace(MODELS / "hf_gpt2.py", out=tmp_path / "run")
    scalars = [info.tid for info in run.reference.tensors.values() if info.shape == () and info.stored]
    assert scalars
    for trace in (run.reference, bisectr.load(tmp_path / "run").reference):
        assert all(trace.value(tid).shape == () for tid in scalars)


def test_stats_only_keeps_statistics_and_the_outputs(tmp_path):
    run = bisectr.trace(OPS_FILE, out=tmp_path / "run", store_values=False)
    stored = [t for t in run.candidate.tensors.values() if t.stored]
    assert [t.tid for t in stored] == [run.candidate.outputs["output"]]
    with_values = bisectr.trace(OPS_FILE, out=tmp_path / "values").candidate
    for tid, info in run.candidate.tensors.items():  # the same statistics as from the values themselves
        values = with_values.value(tid).astype(np.float64)
        assert info.stats.absmax == pytest.approx(np.abs(values).max(), rel=1e-6)
        assert info.stats.mean == pytest.approx(values.mean(), rel=1e-5, abs=1e-7)
    assert (tmp_path / "run" / "candidate" / "tensors.bin").stat().st_size < 1024


def test_keep_modules_stores_only_those_op_outputs(tmp_path):
    run = bisectr.trace(OPS_FILE, out=tmp_path / "run", keep_modules=("norm",))
    kept = {
        run.candidate.ops[t.producer].module
        for t in run.candidate.tensors.values()
        if t.stored and t.producer is not None and t.tid not in run.candidate.outputs.values()
    }
    assert kept == {"norm"}


def test_an_existing_run_is_replaced_whole(tmp_path):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    (tmp_path / "run" / "result.json").write_text("{}")
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_refuses_to_overwrite_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(RunDirError, match="not a bisectr run directory"):
        bisectr.trace(OPS_FILE, out=tmp_path / "precious")
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


def _run_id(run_dir):
    return json.loads((run_dir / "manifest.json").read_text())["run_id"]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
        (lambda d: (d / "manifest.json").write_text("{not json"), "unreadable manifest"),
        (
            lambda d: (d / "candidate" / "trace.json").write_text(json.dumps({"run_id": _run_id(d), "ops": 3})),
            "corrupt trace",
        ),
        (lambda d: (d / "reference" / "tensors.bin").write_bytes(b"short"), "truncated or missing"),
        (
            lambda d: (d / "manifest.json").write_text(json.dumps({"format": "bisectr-run", "version": 99})),
            "version 99",
        ),
    ],
)
def test_corrupt_runs_are_reported_by_file(tmp_path, damage, message):
    bisectr.trace(OPS_FILE, out=tmp_path / "run")
    damage(tmp_path / "run")
    with pytest.raises(RunDirError, match=message):
        bisectr.load(tmp_path / "run")
