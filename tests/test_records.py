"""The records' one JSON codec (`records.codec`): every record reads back what it wrote, the checked-in dumps keep
their JSON form when read and written again, and damage names the field that is wrong. Loading builds only the
types the records' hints name."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from thunderfx_debug.settings.config import Config
from thunderfx_debug.records import (
    DEVIATION, Check, ClockKind, CollectiveCall, CollectiveLog, CompileCost, CostPart, CostStage, CostWhen,
    DisturbedCall, Disturbance, DumpError, FusionRecord, GraphRecord, InputKind, InputMeta, Minimized, OpGroup, Phase,
    SampleTotals, SplitKind, SplitReason, SplitRecord, Timing, TimingWindow, Triage,
)
from thunderfx_debug.records.codec import JsonRecord, json_field

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _timing(clock: str = "cuda") -> Timing:
    return Timing(samples_ms=(1.5, 2.0, 4.0), calls=(6, 11, 16), clock=ClockKind(clock),
                  all_samples=SampleTotals(count=9, total_ms=20.0, min_ms=0.5, max_ms=4.0), uniform=(0, 2),
                  windows=(TimingWindow(6, 11, 2, 1.75, 1.95, 2.0), TimingWindow(16, 16, 1, 4.0, 4.0, 4.0)))


def _graph() -> GraphRecord:
    """A graph with every kind of field set to something other than its default."""
    check = Check(calls=3, mismatches=1, compared=12, first_mismatch_call=51, worst_output="forward output 2",
                  worst_call=51, worst_abs_error=math.inf, worst_rel_error=0.05, worst_ratio=math.inf, rtol=0.016,
                  atol=1e-5, allowed=0.0125, reference="float64 eager", skipped=("random ops",),
                  mismatched_values=("forward output 2",), failures=1, failed=("raised",), verified_gradients=2,
                  writes_unowned_memory=True)
    triage = Triage(clock=ClockKind.CUDA, thunder_ms=3.0, inductor_ms=1.5, ratio=2.0, ratio_low=1.8, ratio_high=2.2,
                    deviation=1.5, deviates=True, calls_per_step=2.0, rounds=14, inputs="real", compile_s=4.5,
                    timing_s=1.25)
    minimized = Minimized(ops_before=40, ops_after=3, inputs_before=9, inputs_after=2, outputs_before=4,
                          outputs_after=1, trials=17, seconds=12.5, script="graph0/x_minimal_repro_thunder.py",
                          verdict="RESULT MISMATCH", final="RESULT MISMATCH", kept=("mul", "add"), budget_spent=True,
                          note="n")
    tensor = InputMeta(kind=InputKind.TENSOR, shape=(4, 3), stride=(0, 1), storage_offset=2, dtype="torch.int64",
                       device="cpu", requires_grad=True, min_value=-100, max_value=63, storage_size=14,
                       nonnegative_min=0, sentinel=-100, sentinel_fraction=0.25, true_fraction=None, index_bound=64,
                       parameter=True, alias_of=0)
    values = (InputMeta(kind=InputKind.FLOAT, value=-2.5), InputMeta(kind="complex", value=[1.0, -2.0]),
              InputMeta(kind=InputKind.TENSOR, dtype="torch.float32", min_value=-math.inf, max_value=0.5),
              InputMeta(kind=InputKind.OTHER, value={"py/object": "os.system"}))
    fusion = FusionRecord(name="nvFusion0", executor="nvfuser", phase=Phase.BACKWARD, ops=("mul",), inputs=("t0",),
                          outputs=("t1",), input_meta=(tensor,), timing=_timing(), files={"repro": "a.py"},
                          check=check, triage=triage, minimized=minimized)
    cost = CompileCost(forward_s=1.5, backward_s=None, started_s=0.25, ended_s=3.0,
                       parts=(CostPart(CostWhen.FORWARD, CostStage.FIRST_EXECUTION, 0.75),))
    split = SplitRecord(
        name="thunder_0", kind=SplitKind.THUNDER, ops=("linear",),
        reasons=(SplitReason("MISSING_OP_SUPPORT", "torch.sinc", "NotImplementedError: sinc", "sinc", "sinc"),),
        fusions=(fusion,), input_meta=(tensor, *values), timing=_timing(), backward_timing=_timing("host"),
        outside_fusions_timing={"outside_forward": _timing()}, error="boom", files={"fwd_trace": "t.py"},
        host_timing=Timing(samples_ms=(2.0,), calls=(6,), clock=ClockKind.HOST), thunder_overhead_timing=_timing(),
        op_groups=(OpGroup("linear", "torch", Phase.FORWARD, 2, _timing()),), compile_cost=cost, check=check,
        triage=triage, minimized=minimized)
    return GraphRecord(name="graph0", index=0, compile_id="0/1", break_reason="print", break_user_stack=("a.py:3",),
                       recompile_reason="size", node_count=12, input_meta=(tensor,), splits=(split,),
                       unattributed_reasons=(SplitReason("X", "y"),), calls=40, timing=_timing(), error="e",
                       fallback=True, compile_time_s=2.5, files={"repro_eager": "r.py"}, compile_cost=cost,
                       period_timing=_timing("host"), disturbed=(DisturbedCall(11, Disturbance.PREEMPTED),))


def _through_json(data):
    return json.loads(json.dumps(data, allow_nan=False))  # strict JSON: a float that is not finite is written as text


def test_every_record_reads_back_what_it_wrote():
    graph = _graph()
    again = GraphRecord.from_json(_through_json(graph.to_json()), "graph.json")
    assert again == graph
    assert again.splits[0].fusions[0].check.worst_ratio == math.inf
    assert again.input_meta[0].min_value == -100 and isinstance(again.input_meta[0].min_value, int)
    log = CollectiveLog("_dump_nccl_trace_json", 2000, (CollectiveCall("nccl:all_reduce", "0", 1, 10**18, 7, 0.5),
                                                        CollectiveCall("nccl:broadcast", "0", 2, 10**18 + 1)))
    assert CollectiveLog.from_json(_through_json(log.to_json()), "collectives") == log


def test_the_json_form_keeps_the_dump_schema():
    data = _graph().to_json()
    assert data["schema_version"] == 2 and list(data)[:3] == ["schema_version", "name", "index"]
    split = data["splits"][0]
    assert "fwd_trace" not in split and "bwd_trace" not in split  # in their own files, named in `files`
    assert split["kind"] == "thunder" and split["reasons"][0]["type"] == "MISSING_OP_SUPPORT"
    assert split["check"]["worst_abs_error"] == "inf" and split["triage"]["ms_per_step"] == 3.0
    timing = split["timing"]
    assert {k: timing[k] for k in ("count", "total_ms", "min_ms", "max_ms")} == {
        "count": 9, "total_ms": 20.0, "min_ms": 0.5, "max_ms": 4.0}
    assert timing["windows"] == {"first_call": [6, 16], "last_call": [11, 16], "count": [2, 1],
                                 "median_ms": [1.75, 4.0], "p90_ms": [1.95, 4.0], "max_ms": [2.0, 4.0]}
    assert "all_samples" not in timing
    bare = SplitRecord(name="inductor_1", kind=SplitKind.INDUCTOR).to_json()
    assert "triage" not in bare and "minimized" not in bare and bare["check"] is None
    complete = Timing(samples_ms=(1.0,), calls=(3,)).to_json()
    assert "windows" not in complete and "uniform" not in complete and complete["count"] == 1
    tensor = InputMeta(kind=InputKind.TENSOR).to_json()
    assert "parameter" not in tensor and "alias_of" not in tensor


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*/rank*/graph*/graph.json")), ids=lambda p: str(p.parent))
def test_a_checked_in_dump_is_written_again_as_it_was(path):
    """Read and written again, a fixture's graph.json is the same JSON; keys it predates come as their defaults."""
    data = json.loads(path.read_text())
    written = _through_json(GraphRecord.from_json(data, str(path)).to_json())

    def compare(old, new, where):
        if isinstance(old, dict):
            assert isinstance(new, dict), where
            for key in old.keys() - new.keys():
                assert key in ("schema_version", "ms_per_step") or "samples" in where, f"{where}.{key} dropped"
            for key, value in new.items():
                if key in old and key != "schema_version":  # a version 1 dump is written as version 2
                    compare(old[key], value, f"{where}.{key}")
        elif isinstance(old, list):
            assert isinstance(new, list) and len(old) == len(new), where
            for i, (a, b) in enumerate(zip(old, new)):
                compare(a, b, f"{where}[{i}]")
        elif isinstance(old, float):  # statistics are computed again from the samples: rounding may differ
            assert new == pytest.approx(old, rel=1e-12), where
        else:
            assert old == new, where

    compare(data, written, "graph.json")
    if path.parts[-4] != "previous_format":
        assert _through_json(GraphRecord.from_json(written, "again").to_json()) == written


DAMAGE = {
    "an int that is text": (("index",), "zero", r"graph\.json\.index: expected int, found str 'zero'"),
    "an int that is a bool": (("calls",), True, r"graph\.json\.calls: expected int, found bool True"),
    "a number that is text": (("compile_time_s",), "soon", r"compile_time_s: expected int or float, found str"),
    "an unknown enum value": (("splits", 0, "kind"), "tvm", r"splits\[0\]\.kind: 'tvm' is not one of 'thunder', "),
    "an enum that is a number": (("splits", 0, "kind"), 3, r"splits\[0\]\.kind: expected str, found int 3"),
    "a negative count": (("splits", 0, "check", "calls"), -1, r"splits\[0\]\.check\.calls: expected a count >= 0"),
    "a record that is a list": (("splits", 0, "timing"), [], r"splits\[0\]\.timing: expected dict, found list"),
    "a list that is text": (("splits",), "thunder_0", r"graph\.json\.splits: expected list, found str"),
    "a list of strings with a number": (("splits", 0, "ops"), ["mul", 3], r"splits\[0\]\.ops: expected a list of str"),
    "samples that are not numbers": (("timing", "samples_ms"), ["fast"], r"timing\.samples_ms: expected a list of num"),
    "a missing required field": (("splits", 0, "name"), ..., r"splits\[0\]: missing field 'name'"),
    "a timing without samples": (("timing", "samples_ms"), ..., r"graph\.json\.timing: missing field 'samples_ms'"),
    "columns of unequal length": (("timing", "windows", "count"), [1], r"timing\.windows: its columns first_call, "),
    "a file name that is not text": (("files", "repro_eager"), 7, r"files\.repro_eager: expected str, found int 7"),
    "uniform indices out of range": (("timing", "uniform"), [0, 9], r"timing\.uniform: expected distinct indices"),
    "fewer samples in all than kept": (("timing", "count"), 1, r"timing\.count: 1 samples in all, fewer than the 3"),
    "a minimized count below zero": (("splits", 0, "minimized", "trials"), -2, r"minimized\.trials: expected a count"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_names_the_field_that_is_wrong(kind):
    path, value, message = DAMAGE[kind]
    data = _through_json(_graph().to_json())
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    with pytest.raises(DumpError, match=message):
        GraphRecord.from_json(data, "graph.json")


def test_loading_builds_only_the_types_the_records_name():
    data = _through_json(_graph().to_json())
    data["splits"][0]["__class__"] = "os.system"  # unknown keys are ignored
    data["splits"][0]["reasons"][0]["type"] = "__import__('os').system('false')"  # text stays text
    graph = GraphRecord.from_json(data, "graph.json")
    assert type(graph.splits[0]) is SplitRecord
    assert graph.splits[0].reasons[0].type.startswith("__import__")
    assert graph.splits[0].input_meta[-1].value == {"py/object": "os.system"}  # a value of the run, as JSON has it


def test_a_record_with_a_field_type_the_codec_does_not_know_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Odd(JsonRecord):
        members: frozenset[int] = json_field(frozenset())

    with pytest.raises(TypeError, match="no JSON form for"):
        Odd.from_json({"members": [1]}, "odd")


def test_the_deviation_default_is_one_constant():
    assert Config().deviation == Triage().deviation == DEVIATION
    assert Triage.from_json({}, "triage").deviation == DEVIATION  # a record that does not say its own


def test_a_checks_line_is_rendered_in_render_not_by_the_record():
    from thunderfx_debug.render.correctness import describe_check

    assert not hasattr(Check, "describe")
    check = Check(calls=3, mismatches=1, compared=9, first_mismatch_call=51, worst_output="forward output 2",
                  worst_call=51, worst_abs_error=0.31, worst_rel_error=0.05, worst_ratio=24.8, rtol=0.05, atol=0.05,
                  allowed=0.0125, reference="float64 eager", skipped=("random ops",))
    assert describe_check(check) == (
        "3 checked calls, 1 mismatch (first at call 51); worst: forward output 2 at call 51, error 0.31 (relative "
        "0.05) against 0.0125 allowed (rtol 0.05, atol 0.05, against float64 eager): 24.8 of the tolerance; not "
        "compared: random ops")
    assert describe_check(Check(calls=1)) == "1 checked call, nothing compared"
