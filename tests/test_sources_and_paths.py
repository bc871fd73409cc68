"""Source lines and module paths a new user meets first (issue #18, item 3): an op no user code called
(the model is one framework layer) gets the framework's own line, marked `library_source`; a side
that is a plain function calling a model gets the model's module paths, layer indices included."""

import json
import linecache
import subprocess
import sys

import pytest

from bisectr.adapters.base import ModulePaths
from bisectr.capture.modelfile import load_sides
from bisectr.capture.recording import RecordOptions
from bisectr.sides.runner import record_side
from bisectr.capture.trace import Trace
from conftest import MODELS

ENCODER = MODELS / "transformer_encoder.py"
WRAPPED = MODELS / "function_sides.py"


def record(model_file, function):
    side = load_sides(model_file, reference=function, candidate=function)[0]
    trace, _ = record_side(side, None, RecordOptions(store_values=False))
    return side, trace


def line_text(source):
    path, _, line = source.rpartition(":")
    return linecache.getline(path, int(line)).strip()


@pytest.fixture(scope="module")
def encoders():
    """(adapter, trace) of torch's and paddle's nn.TransformerEncoder, each given directly."""
    return {
        framework: record(ENCODER, function)
        for framework, function in (("torch", "reference"), ("paddle", "candidate"))
    }


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_ops_of_a_framework_layer_get_the_frameworks_own_calling_line(encoders, framework):
    side, trace = encoders[framework]
    framework_dirs = side.adapter.internal_paths()
    assert trace.ops
    for op in trace.ops:
        assert op.library_source, (op.index, op.framework_op, op.source)
        path, _, line = op.source.rpartition(":")
        assert path.startswith(framework_dirs) and line.isdigit(), (op.index, op.source)
        assert line_text(op.source), (op.index, op.source)  # a real line of the framework's file
    by_module = {}
    for op in trace.ops:
        by_module.setdefault((op.op, op.module), []).append(op)
    # the line that calls the op, not the dispatch or the public function passing it on
    for (canonical, module), ops in by_module.items():
        text = line_text(ops[0].source)
        if canonical == "linear":
            assert "F.linear(" in text and ops[0].source.rpartition(":")[0].endswith(
                f"{framework}/nn/" + ("modules/linear.py" if framework == "torch" else "layer/common.py")
            ), ops[0].source
        elif canonical == "relu":
            assert "self.activation(" in text and "transformer.py" in ops[0].source, ops[0].source
        elif canonical == "layer_norm":
            assert "layer_norm(" in text, ops[0].source
    assert "overrides.py" not in " ".join(op.source for op in trace.ops)


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_library_source_survives_json_and_the_trace_check(encoders, framework):
    _, trace = encoders[framework]
    again = Trace.from_json(json.loads(json.dumps(trace.to_json())))
    again.check()
    assert [(o.source, o.library_source) for o in again.ops] == [(o.source, o.library_source) for o in trace.ops]
    older = trace.to_json()  # a trace written before the field existed reads as user lines
    for op in older["ops"]:
        del op["library_source"]
    assert not any(op.library_source for op in Trace.from_json(older).ops)
    bad = trace.to_json()
    bad["ops"][0]["library_source"] = "yes"
    with pytest.raises(ValueError, match="op 0"):
        Trace.from_json(bad).check()


@pytest.mark.parametrize("model_file, function", [("torch_ops.py", "reference"), ("paddle_span.py", "candidate")])
def test_a_users_model_keeps_the_users_lines(model_file, function):
    _, trace = record(MODELS / model_file, function)
    assert trace.ops
    for op in trace.ops:
        assert not op.library_source and op.source.startswith(f"{MODELS / model_file}:"), (op.index, op.source)


@pytest.mark.parametrize("direct, wrapped", [("reference", "reference"), ("candidate", "candidate")])
def test_a_function_wrapping_a_model_gets_the_models_module_paths(encoders, direct, wrapped):
    framework = "torch" if direct == "reference" else "paddle"
    _, given = encoders[framework]
    _, called = record(WRAPPED, wrapped)
    modules = [op.module for op in called.ops]
    assert modules == [op.module for op in given.ops]
    assert "layers.1.linear1" in modules and "layers.0.self_attn" in modules
    assert [op.framework_op for op in called.ops] == [op.framework_op for op in given.ops]
    leaves = sorted(called.leaves)
    assert leaves == sorted(given.leaves) and any(".linear1.weight" in name for name in leaves)


def test_a_second_model_called_by_the_function_is_prefixed_by_its_class():
    _, trace = record(WRAPPED, "reference_two_models")
    modules = [op.module for op in trace.ops]
    assert "layers.1.linear2" in modules and modules[-1] == "Linear"
    assert all(m.startswith("layers.") or m == "Linear" for m in modules), set(modules)
    assert {"param:Linear.weight", "param:Linear.bias"} <= set(trace.leaves) and not any(
        name.startswith("const:") for name in trace.leaves if "weight" in name
    )


def test_module_paths_adopt_roots_by_identity():
    torch = pytest.importorskip("torch")
    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    other = torch.nn.Sequential(torch.nn.Linear(2, 2))
    paths = ModulePaths(lambda root: root.named_modules())
    assert paths.path(inner[1]) == ""  # the first module seen is the root: unprefixed
    assert paths.path(inner) == "Sequential"  # its parent was not known: a second root
    assert paths.path(other[0]) == "Linear" and paths.path(other) == "Sequential"
    seeded = ModulePaths(lambda root: root.named_modules(), inner)
    assert (seeded.path(inner), seeded.path(inner[0]), seeded.path(other[0])) == ("", "0", "Linear")


def test_bisect_names_the_library_line_of_a_culprit_in_library_code():
    """`candidate_gelu_layer` swaps paddle's layer 1 FFN activation: the culprit is an op that paddle's
    own `TransformerEncoderLayer.forward` calls, on both sides library code."""
    done = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(ENCODER), "--candidate", "candidate_gelu_layer", "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    culprit = result["culprit"]["candidate"]
    assert culprit["module"] == "layers.1" and culprit["op"] == "_C_ops.gelu"
    assert culprit["source"].rpartition(":")[0].endswith("paddle/nn/layer/transformer.py")
    assert "self.activation(" in line_text(culprit["source"])
    assert result["culprit"]["reference"]["source"]
    text = subprocess.run(
        [sys.executable, "-m", "bisectr", "bisect", str(ENCODER), "--candidate", "candidate_gelu_layer"],
        capture_output=True,
        text=True,
    ).stdout
    path, _, line = culprit["source"].rpartition(":")
    assert f"paddle/nn/layer/transformer.py:{line}:  src = self.linear2(" in text
