"""The search of `bisectr.search.core`, driven by a fake pass: no model, no framework.

A `FakePass` says what a model would: the outputs' error left by a cut (the difference enters at one
op), the evidence of each op, what the reference re-run with a group's own difference gives, and what
the candidate re-run without it gives. Each test checks one rule of the search: the cut search's
bracket and its re-run bound, the guess asked first, the group of one difference in every layer, a
suspect that does not reach the outputs, one whose removal contradicts its pairing, and a group
whose occurrences confirm only alone.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from bisectr.capture.trace import OpNode
from bisectr.measure.analysis import OpEvidence
from bisectr.measure.metrics import ErrorMetrics
from bisectr.measure.result import Float64Check
from bisectr.search.core import RERUN_SLACK, ErrorToExplain, SearchPass, first_past, search_pass

FULL = 0.3  # the outputs' error (relative)
ROUNDING = 1e-7  # what the float64 check predicts rounding makes of it


def op_node(index: int, module: str, source: str) -> OpNode:
    return OpNode(index, "Tensor.add", "add", module, source)


def evidence(index: int, verdict: str = "different") -> OpEvidence:
    metrics = ErrorMetrics(0.1, 0.01, 0.1, 0.99)
    return OpEvidence(index, index, "add", "float32", metrics, 0.1 if verdict == "different" else 1e-7, None, verdict)


class FakePass(SearchPass):
    """A model of `count` ops, layer `layer_of(i)` each, whose difference enters at op `enters` and
    again at each op of `recurs` (the same line of the same layer class)."""

    def __init__(
        self,
        count: int,
        enters: int,
        recurs: tuple[int, ...] = (),
        guess: int | None = None,
        reaches: dict[int, float] | None = None,
        without: dict[tuple[int, ...], float] | None = None,
    ):
        ops = [
            op_node(i, f"layers.{i // 8}.mlp" if i in (enters, *recurs) else f"layers.{i // 8}", f"model.py:{i % 8}")
            for i in range(count)
        ]
        record = SimpleNamespace(
            candidate=SimpleNamespace(ops=ops, dtype="float32"), alignment=SimpleNamespace(tensors={})
        )
        super().__init__(SimpleNamespace(run=record, say=lambda message: None))
        self.enters, self.recurs, self.guess = enters, recurs, guess
        self.reaches = reaches or {}
        self.without = without or {}
        self.cuts_asked: list[int] = []

    def cuts(self) -> list[int]:
        return list(range(len(self.run.candidate.ops)))

    def error_at_cut(self, cut: int) -> tuple[float, float]:
        self.candidate_reruns += 1
        self.cuts_asked.append(cut)
        return (FULL, 0.0) if cut < self.enters else (0.0, FULL)

    def likely_entry(self, cuts: list[int]) -> int | None:
        return self.guess

    def suspects(self, cuts: list[int], entry: int | None):
        """Op 5 (a difference upstream that the evidence also judges semantic) first, then the entry."""
        yield from (self.evidence_of(i) for i in sorted({entry, *self.recurs, 5}) if i is not None)

    def evidence_of(self, index: int) -> OpEvidence | None:
        return evidence(index, "different" if index in (self.enters, *self.recurs, 5) else "noise")

    def reach(self, group: list[OpEvidence]) -> float:
        self.reference_reruns += 1
        return self.reaches.get(group[0].candidate, FULL)

    def error_without(self, group: list[OpEvidence]) -> float:
        self.candidate_reruns += 1
        return self.without.get(tuple(e.candidate for e in group), FULL)


def search(fake: FakePass, status: str = "disagree"):
    check = Float64Check(status, "", FULL, FULL, ROUNDING / 2, ROUNDING / 2)
    return search_pass(fake, ErrorToExplain.judged(FULL, check), check, nonfinite=False)


def budget(count: int) -> int:
    return math.ceil(math.log2(count)) + RERUN_SLACK


@pytest.mark.parametrize("enters", [0, 1, 17, 63, 64, 199])
def test_the_cut_search_brackets_the_entry_within_the_rerun_bound(enters):
    fake = FakePass(200, enters, without={(enters,): 1e-7})
    outcome = search(fake)
    assert outcome.entry == enters and outcome.verdict == "divergent"
    assert fake.candidate_reruns <= budget(200)
    assert [c.op for c in outcome.trail] == sorted(fake.cuts_asked)  # every cut asked is in the trail


def test_a_right_guess_is_settled_with_two_cuts():
    fake = FakePass(200, 117, guess=117, without={(117,): 1e-7})
    assert search(fake).entry == 117
    assert sorted(fake.cuts_asked) == [116, 117, 199]  # the last cut first: is the difference anywhere at all


def test_one_difference_in_every_layer_is_one_group_confirmed_together():
    fake = FakePass(64, 12, recurs=(28, 44), without={(12, 28, 44): 2e-7})
    finding = search(fake).finding
    assert [e.candidate for e in finding.group] == [12, 28, 44]
    assert finding.confirmed and finding.confirmation.output_error == 2e-7
    assert set(finding.alone) == {12, 28, 44}
    assert fake.reference_reruns == 5  # the reach of op 5 (tested first, contradicted), the group's, then each alone


def test_a_suspect_that_does_not_reach_the_outputs_is_not_blamed():
    fake = FakePass(64, 12, reaches={5: 1e-9}, without={(12,): 1e-7})
    finding = search(fake).finding
    assert [n.index for n in finding.not_blamed] == [5]
    assert finding.evidence.candidate == 12 and finding.confirmed


def test_a_suspect_whose_removal_makes_the_error_worse_contradicts_its_pairing():
    fake = FakePass(64, 12, without={(5,): 2 * FULL, (12,): 1e-7})
    finding = search(fake).finding
    assert [(n.index, n.contradicted) for n in finding.not_blamed] == [(5, 2 * FULL)]
    assert finding.evidence.candidate == 12 and finding.confirmed


def test_a_group_that_confirms_only_without_a_false_occurrence_is_the_suspect_alone():
    fake = FakePass(64, 12, recurs=(28,), without={(12, 28): 0.2, (12,): 1e-7})
    finding = search(fake).finding
    assert [e.candidate for e in finding.group] == [12] and finding.confirmed


def test_an_unconfirmed_difference_is_divergent_and_bracketed():
    outcome = search(FakePass(64, 12, without={(5,): 0.2, (12,): 0.1}))
    assert outcome.verdict == "divergent" and outcome.bracketed and not outcome.finding.confirmed
    assert outcome.finding.evidence.candidate == 5  # the first that reaches, unconfirmed


def test_a_run_that_rounding_explains_tests_no_suspect():
    fake = FakePass(64, 12)
    outcome = search(fake, status="agree")
    assert outcome.verdict == "noise" and outcome.finding.evidence is None and fake.reference_reruns == 0


@pytest.mark.parametrize("count, first", [(1, 0), (10, 0), (10, 9), (10, 4), (10, None), (1000, 613)])
def test_first_past_asks_log2_positions(count, first):
    asked = []

    def past(position):
        asked.append(position)
        return first is not None and position >= first

    assert first_past(count, past, exhaustive=False) == first
    assert len(set(asked)) <= math.ceil(math.log2(max(count, 2))) + 1
