"""Where each piece comes from in the model's code (records' `sources`, `thunder/provenance.py`): checked on real
Thunder runs against the model's files read here, independently of the tool: a tiny Hugging Face Llama's RMSNorm
regions name the line of the installed transformers' `modeling_llama.py` that calls `torch.rsqrt`, its matmuls
name the projections' lines, and its two layers' regions group by their lines; the summary, the HTML page and the
repro scripts show them; nothing of it runs on the training path."""

from __future__ import annotations

import dataclasses
import html.parser
import inspect
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import harness_path  # noqa: F401  (benchmarks/ on sys.path)
import harness
from conftest import cpu_executors_apart_at_matmuls, dump_fixtures
from thunderfx_debug import ReportingBackend, load_report
from thunderfx_debug.records import (
    BETWEEN_OPS, READS_SAVED, DumpError, FusionRecord, GraphRecord, OpGroup, SourceExcerpt, SourceLine, Triage,
    short_sources,
)
from thunderfx_debug.render import provenance
from thunderfx_debug.render.html import render_html
from thunderfx_debug.render.summary import render_summary
from thunderfx_debug.thunder import provenance as thunder_provenance
from thunderfx_debug.thunder.traces import final_traces
from wrong_executors import wrong_sin_executor

LAYERS = 2


def lines_calling(path: str, text: str) -> list[int]:
    """The numbers of the lines of a file that hold `text` (read here, not by the tool)."""
    return [i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A 2-layer tiny Llama trained 2 steps on CPU, its regions ending at every matmul (one per layer and norm),
    every call timed at fusion level (so that its matmuls are op groups), every repro script written."""
    shape = dataclasses.replace(harness.SIZES["tiny"], layers=LAYERS)
    cls, config = harness.config_for("llama", shape)
    config.use_cache = False
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(config).train()
    dump_dir = tmp_path_factory.mktemp("llama")
    backend = ReportingBackend(dump_dir=dump_dir, timing="fusion", timing_every=1, timing_warmup=0, repro="all",
                               strict=True, executors=cpu_executors_apart_at_matmuls())
    harness.train(model, harness.batch_for("llama", shape, "cpu"), backend, steps=2)
    rank_dir = backend.flush()
    yield backend, rank_dir, load_report(rank_dir)
    backend.close()


@pytest.fixture(scope="module")
def modeling_llama() -> str:
    from transformers.models.llama import modeling_llama

    return modeling_llama.__file__


def _regions(report, phase="forward"):
    return [(f"{g.name}/{s.name}/{f.name}", f) for g in report.graphs for s in g.splits for f in s.fusions
            if f.phase.value == phase]


def test_each_rmsnorm_region_of_a_tiny_llama_names_the_line_that_calls_rsqrt(llama, modeling_llama):
    _, _, report = llama
    [rsqrt_line] = lines_calling(modeling_llama, "torch.rsqrt(")
    expected = str(SourceLine(modeling_llama, rsqrt_line, "forward"))
    norms = [(path, f) for path, f in _regions(report) if "rsqrt" in f.ops]
    assert len(norms) == 2 * LAYERS + 1  # two per layer and the final norm
    assert all(expected in f.sources for _, f in norms), [(path, f.sources) for path, f in norms]
    # The region of the first layer's input norm holds that norm alone: every line it names is RMSNorm's forward.
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    body, first = inspect.getsourcelines(LlamaRMSNorm.forward)
    lines = [SourceLine.parse(s) for s in norms[0][1].sources]
    assert all(line.file == modeling_llama and first <= line.line < first + len(body) for line in lines), lines


def test_every_rsqrt_the_traces_fused_leads_back_to_that_line(llama, modeling_llama):
    """Bound symbol by bound symbol, not only per region: each `rsqrt` inside a forward region maps to the line."""
    backend, _, _ = llama
    [rsqrt_line] = lines_calling(modeling_llama, "torch.rsqrt(")
    found = []
    for graph in backend.recorder.graphs:
        for split in graph.splits:
            if split.split.kind.value != "thunder":
                continue
            lines = thunder_provenance.split_line_map(split.split.compiled)
            forward, _ = final_traces(split.split.compiled)
            for bsym in forward.bound_symbols:
                if bsym.sym.is_fusion:
                    found += [lines.bsym_source(sub) for sub in bsym.subsymbols if sub.sym.name == "rsqrt"]
    assert found and set(found) == {SourceLine(modeling_llama, rsqrt_line, "forward")}


def test_the_matmuls_outside_the_regions_name_the_projections_lines(llama, modeling_llama):
    _, _, report = llama
    groups = [g for gr in report.graphs for s in gr.splits for g in s.op_groups
              if g.symbol == "linear" and g.phase.value == "forward"]
    assert groups
    named = {SourceLine.parse(text).line for g in groups for text in g.sources}
    for call in ("self.o_proj(", "self.down_proj("):
        assert set(lines_calling(modeling_llama, call)) <= named, (call, named)


def test_the_layers_regions_are_grouped_by_their_lines_and_ops(llama):
    _, _, report = llama
    groups = provenance.repeated_regions(report)
    mlp = [g for g in groups if g.phase == "forward" and "silu" in g.ops]
    assert [g.count for g in mlp] == [LAYERS]  # one region per layer, the same lines: one group
    assert all(len({p.rsplit("/", 1)[0] for p in g.paths}) == 1 for g in mlp)
    # No group mixes ops: each member's record has the group's ops and sources.
    records = {path: f for path, f in _regions(report, "forward") + _regions(report, "backward")}
    for group in groups:
        assert all((records[p].ops, records[p].sources) == (group.ops, group.sources) for p in group.paths)
    summary = render_summary(report)
    assert f"the same lines and ops in {LAYERS} regions (forward, " in summary
    # the per-split listing tells the repeated regions in one line after the first
    assert re.search(r"the same lines and ops in 1 more region[^:]*: TorchCompile\d+", summary)


class _Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: list[str] = []
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "a" and (attrs.get("href") or "").startswith("#"):
            self.hrefs.append(attrs["href"][1:])


def test_the_page_shows_each_regions_lines_with_their_code_from_the_dump(llama, modeling_llama):
    _, rank_dir, _ = llama
    [rsqrt_line] = lines_calling(modeling_llama, "torch.rsqrt(")
    code = Path(modeling_llama).read_text().splitlines()[rsqrt_line - 1]
    report = load_report(rank_dir)
    text = str(SourceLine(modeling_llama, rsqrt_line, "forward"))
    [excerpt] = {g.source_excerpts[text] for g in report.graphs if text in g.source_excerpts}
    assert excerpt.lines[rsqrt_line - excerpt.first_line] == code  # read at flush, as the file has it
    # The page shows what the dump holds (it opens where the model's files are not): a changed excerpt shows.
    def marked(source, excerpt):
        if not source.startswith(f"{modeling_llama}:"):
            return excerpt
        return dataclasses.replace(excerpt, lines=tuple("# as the dump holds it" if n == rsqrt_line else line
                                                        for n, line in enumerate(excerpt.lines, excerpt.first_line)))

    report = dataclasses.replace(report, graphs=tuple(
        dataclasses.replace(g, source_excerpts={k: marked(k, e) for k, e in g.source_excerpts.items()})
        for g in report.graphs))
    page = render_html({0: report}, {0: "rank0/"})
    parsed = _Ids()
    parsed.feed(page)
    assert len(parsed.ids) == len(set(parsed.ids)) and set(parsed.hrefs) <= set(parsed.ids)
    anchor = provenance.SourceIndex(report).anchors[text]
    highlighted = re.search(rf'<span class="src" id="{anchor}">\s*{rsqrt_line}  ([^<]*)</span>', page)
    assert highlighted is not None and html.unescape(highlighted[1]) == "# as the dump holds it"
    assert page.count(f'href="#{anchor}"') >= 2 * LAYERS + 1  # every norm region links to the line


def test_every_repro_script_names_where_in_the_model_its_piece_is(llama, modeling_llama):
    _, rank_dir, report = llama
    [rsqrt_line] = lines_calling(modeling_llama, "torch.rsqrt(")
    pieces = [(s.files, s.sources) for g in report.graphs for s in g.splits]
    pieces += [(f.files, f.sources) for g in report.graphs for s in g.splits for f in s.fusions]
    scripts = [(rank_dir / path, sources) for files, sources in pieces for label, path in files.items()
               if label.startswith("repro")]
    assert len(scripts) > 2 * len(pieces) // 3
    for script, sources in scripts:
        text = script.read_text()
        compile(text, str(script), "exec")  # the header's lines are comments: the script stays a script
        header = text.split("# ====", 1)[0]
        assert all(f"#     {source}\n" in header for source in sources[:12]), script.name
    norm_scripts = [p for p, sources in scripts if f"{modeling_llama}:{rsqrt_line} forward" in sources]
    assert norm_scripts and all("# where in the model" in p.read_text() for p in norm_scripts)


def _backward_pieces(report):
    """(path, record) of every backward region and op group (but the time between ops) of a report."""
    found = [(path, f) for path, f in _regions(report, "backward")]
    found += [(f"{g.name}/{s.name} {o.label}", o) for g in report.graphs for s in g.splits for o in s.op_groups
              if o.phase.value == "backward" and o.symbol != BETWEEN_OPS]
    return found


def _norm_lines(modeling_llama) -> set[int]:
    """The lines of LlamaRMSNorm.forward, read here."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    body, first = inspect.getsourcelines(LlamaRMSNorm.forward)
    assert inspect.getsourcefile(LlamaRMSNorm) == modeling_llama
    return set(range(first, first + len(body)))


def test_backward_pieces_without_lines_of_their_own_name_where_the_values_they_read_were_saved(llama, modeling_llama):
    """Thunder 0.2.6 gives grad rules no location: the backward regions that reshape a norm's saved output for the
    projections' weight gradients, and the backward matmuls, name no line of their own. What they read was saved by
    RMSNorm's forward, whose lines are read here from the installed transformers."""
    _, _, report = llama
    norm = _norm_lines(modeling_llama)
    [rsqrt_line] = lines_calling(modeling_llama, "torch.rsqrt(")

    def reads_norm(piece) -> bool:
        lines = [SourceLine.parse(text) for text in piece.reads_saved_from]
        return any(line.file == modeling_llama and line.line in norm for line in lines)

    backward = _backward_pieces(report)
    bare = [(path, p) for path, p in backward if not p.sources]
    assert bare
    bare_regions = [p for path, p in bare if isinstance(p, FusionRecord)]
    # an input norm and a post-attention norm per layer: their outputs feed the projections' weight gradients
    assert sum(map(reads_norm, bare_regions)) >= 2 * LAYERS, [(path, p.reads_saved_from) for path, p in bare]
    [matmuls] = [p for path, p in bare if isinstance(p, OpGroup) and p.symbol == "matmul"]
    assert reads_norm(matmuls), matmuls.reads_saved_from
    # the norms' own backward regions read the rsqrt the forward saved
    rsqrt = str(SourceLine(modeling_llama, rsqrt_line, "forward"))
    assert any(rsqrt in p.reads_saved_from for _, p in backward if "rsqrt" not in p.ops), backward
    # every line a backward piece reads from is a line of its split's forward code
    for graph in report.graphs:
        for split in graph.splits:
            for piece in (*split.fusions, *split.op_groups):
                assert set(piece.reads_saved_from) <= set(split.sources), (split.name, piece)


def test_the_embeddings_backward_names_the_line_that_embeds_the_token_ids(llama, modeling_llama):
    """The token ids are an input of the split, saved for the backward as they came (no forward op made them): the
    embedding's backward names the forward line that read them, `self.embed_tokens(input_ids)`, read here."""
    _, _, report = llama
    [embed_line] = lines_calling(modeling_llama, "self.embed_tokens(input_ids)")
    embedding = [p for _, p in _backward_pieces(report) if "embedding_backward" in getattr(p, "ops", ())
                 or getattr(p, "symbol", "") == "embedding_backward"]
    assert embedding, _backward_pieces(report)
    assert all(str(SourceLine(modeling_llama, embed_line, "forward")) in p.reads_saved_from for p in embedding), \
        [p.reads_saved_from for p in embedding]


def test_forward_pieces_name_no_saved_values(llama):
    _, rank_dir, report = llama
    forward = _regions(report) + [(o.label, o) for g in report.graphs for s in g.splits for o in s.op_groups
                                  if o.phase.value == "forward"]
    assert forward and all(p.reads_saved_from == () for _, p in forward)
    for graph in report.graphs:
        data = json.loads((rank_dir / graph.name / "graph.json").read_text())
        for split in data["splits"]:
            for piece in (*split["fusions"], *split["op_groups"]):
                if "reads_saved_from" in piece:  # written where there are some, like `sources`
                    assert piece["phase"] == "backward" and piece["reads_saved_from"], piece


def test_the_lines_of_saved_values_round_trip_and_show_in_the_summary_page_and_scripts(llama, modeling_llama):
    _, rank_dir, report = llama
    graph = next(g for g in report.graphs if any(f.reads_saved_from for _, f in g.fusions()))
    data = json.loads((rank_dir / graph.name / "graph.json").read_text())
    written = [f["reads_saved_from"] for s in data["splits"] for f in s["fusions"] if "reads_saved_from" in f]
    assert written == [list(f.reads_saved_from) for _, f in graph.fusions() if f.reads_saved_from]
    again = GraphRecord.from_json(graph.to_json(), "graph.json")  # its traces are files of their own: not compared
    assert [(s.fusions, s.op_groups) for s in again.splits] == [(s.fusions, s.op_groups) for s in graph.splits]
    split, region = next((s, f) for s, f in graph.fusions() if f.reads_saved_from and not f.sources)

    # the summary: under the region's line, the saved values' lines, never as "from"
    lines = render_summary(report).splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"  {split.name}: ")))
    row = next(i for i in range(start, len(lines)) if lines[i].startswith(f"      {region.name} (backward, "))
    assert lines[row + 1] == f"        {READS_SAVED} {short_sources(region.reads_saved_from)}"

    # the page: the region's row links the lines to their code, kept in the dump
    page = render_html({0: report})
    index = provenance.SourceIndex(report)
    first = region.reads_saved_from[0]
    assert first in graph.source_excerpts
    assert f'{READS_SAVED} <a href="#{index.anchors[first]}">' in page
    assert " backward (reads a value saved here)" in page  # the code's lines say which pieces read them

    # its scripts' headers list them apart from the lines of its own ops; forward regions' scripts have none
    scripts = [rank_dir / path for label, path in region.files.items() if label.startswith("repro")]
    assert scripts
    for script in scripts:
        header = script.read_text().split("# ====", 1)[0]
        saved = header.split(f"# {READS_SAVED} ", 1)[1]
        assert all(f"#     {line}\n" in saved for line in region.reads_saved_from[:12]), script.name
        assert "# where in the model" not in header  # it has no lines of its own
    forward_scripts = [rank_dir / path for _, f in _regions(report) for label, path in f.files.items()
                       if label.startswith("repro")]
    assert forward_scripts and not any(f"# {READS_SAVED}" in p.read_text() for p in forward_scripts)


def test_the_tlparse_artifacts_carry_the_lines_too(llama):
    from thunderfx_debug.artifacts.torch_trace import structure_artifacts, trace_artifacts

    _, _, report = llama
    for graph in report.graphs:
        [(_, structure)] = structure_artifacts(graph)
        assert [s["sources"] for s in structure["splits"]] == [list(s.sources) for s in graph.splits]
        fusions = [payload for name, payload in trace_artifacts(graph) if name.endswith("fusions")]
        assert [f["sources"] for payload in fusions for f in payload] == [
            list(f.sources) for s in graph.splits for f in s.fusions]
    assert any(s.sources for g in report.graphs for s in g.splits)


class SinModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x):
        h = torch.relu(x @ self.w)
        return torch.sin(h).sum()


def test_the_summary_names_the_lines_beside_a_mismatch(tmp_path):
    import thunder

    torch.manual_seed(0)
    backend = ReportingBackend(check="split", check_every=1, strict=True,
                               executors=[wrong_sin_executor(), *thunder.get_default_executors()])
    torch.compile(SinModel(), backend=backend)(torch.randn(4, 8)).backward()
    summary = str(backend.report())
    body, first = inspect.getsourcelines(SinModel.forward)
    sin_line = first + next(i for i, line in enumerate(body) if "torch.sin(" in line)
    mismatch = summary.splitlines().index(next(line for line in summary.splitlines() if "MISMATCH graph0/" in line))
    assert summary.splitlines()[mismatch + 1].startswith("    from ")
    assert f"test_provenance.py:{sin_line} forward" in summary.splitlines()[mismatch + 1]


def test_the_summary_names_the_lines_beside_a_deviating_piece_of_the_triage(llama):
    _, _, report = llama
    graph = report.graphs[-1]
    split = next(s for s in graph.splits if s.fusions)
    region = next(f for f in split.fusions if f.sources)
    slow = Triage(thunder_ms=3.0, inductor_ms=1.0, ratio=3.0, ratio_low=2.5, ratio_high=3.5, deviates=True)
    fusions = tuple(dataclasses.replace(f, triage=slow) if f is region else f for f in split.fusions)
    splits = tuple(dataclasses.replace(s, fusions=fusions) if s is split else s for s in graph.splits)
    changed = dataclasses.replace(report, graphs=(*report.graphs[:-1], dataclasses.replace(graph, splits=splits)))
    lines = render_summary(changed).splitlines()
    row = next(i for i, line in enumerate(lines) if f"{graph.name}/{split.name}/{region.name} " in line
               and "lost per step" in line)
    assert lines[row + 1].strip() == f"from {short_sources(region.sources)}"


def test_no_source_is_read_on_the_training_path(monkeypatch):
    """Each split's lines are read when it is compiled; the traces' at a report or flush, never in a training step."""
    from thunderfx_debug.recording import recorder

    calls = []
    real = recorder.thunder_provenance.trace_sources
    monkeypatch.setattr(recorder.thunder_provenance, "trace_sources", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(0)
    model = SinModel()
    backend = ReportingBackend(executors=cpu_executors_apart_at_matmuls())
    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        compiled(torch.randn(4, 8)).backward()
    assert calls == []
    split = next(s for s in backend.report().graphs[0].splits if s.fusions)
    assert calls and split.fusions[0].sources and split.sources
    assert any(f.reads_saved_from for f in split.fusions_in("backward"))


def test_the_h200_benchmark_checks_a_tiny_llama_the_same_way_on_cpu(tmp_path):
    """benchmarks/provenance.py on CPU: its check of the rsqrt line and its figures, not the H200's."""
    import importlib.util

    path = Path(__file__).parent.parent / "benchmarks" / "provenance.py"
    spec = importlib.util.spec_from_file_location("benchmark_provenance", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    executors = ",".join(e.name for e in cpu_executors_apart_at_matmuls())  # regions per layer, matmuls apart
    assert module.main(["--steps", "2", "--dump", str(tmp_path / "dump"), "--json", str(tmp_path / "p.json"),
                        "--executors", executors]) == 0
    results = json.loads((tmp_path / "p.json").read_text())["results"]
    assert results["ok"] and results["rsqrt_regions"] and results["rsqrt_lines"]
    forward, backward = results["counts"]["forward"], results["counts"]["backward"]
    assert forward["regions_with_sources"] == forward["regions"] > 0
    assert forward["regions_reading_saved_values"] == forward["op_groups_reading_saved_values"] == 0
    for kind in ("regions", "op_groups"):  # each backward piece counted once: by its own lines, by saved values, or none
        assert (backward[f"{kind}_with_sources"] + backward[f"{kind}_named_by_saved_values_only"]
                + backward[f"{kind}_naming_no_line"]) == backward[kind] > 0
        assert backward[f"{kind}_named_by_saved_values_only"] > 0


def test_sources_round_trip_and_damage_names_the_field():
    graph = GraphRecord("graph0", 0, source_excerpts={"/m.py:3 f": SourceExcerpt(1, ("a = 1", "b = 2", "c = a + b"))})
    again = GraphRecord.from_json(graph.to_json(), "graph.json")  # its traces are files of their own: not compared
    assert [(s.fusions, s.op_groups) for s in again.splits] == [(s.fusions, s.op_groups) for s in graph.splits]
    data = graph.to_json()
    data["source_excerpts"]["/m.py:3 f"]["lines"] = "a = 1"
    with pytest.raises(DumpError, match=r"graph.json.source_excerpts./m.py:3 f.lines: expected list"):
        GraphRecord.from_json(data, "graph.json")


def test_dumps_written_before_sources_load_without_them():
    report = load_report(dump_fixtures() / "previous_format")
    pieces = [p for g in report.graphs for s in g.splits for p in (s, *s.fusions, *s.op_groups)]
    assert pieces and all(p.sources == () for p in pieces)
    assert all(p.reads_saved_from == () for g in report.graphs for s in g.splits for p in (*s.fusions, *s.op_groups))
    assert all(g.source_excerpts == {} for g in report.graphs)
    summary = render_summary(report).splitlines()
    assert not any(line.strip().startswith(("from ", READS_SAVED)) for line in summary)
    assert "Where the regions come from" not in render_html({0: report})
    # the fixtures the page's browser test renders have them (tests/test_html_browser.py)
    normal = load_report(dump_fixtures() / "normal")
    assert all(f.sources for g in normal.graphs for s in g.splits for f in s.fusions if f.phase.value == "forward")
    assert "Where the regions come from" in render_html({0: normal})


def test_a_package_file_on_an_import_root_of_sys_path_is_named_from_its_package_on(tmp_path, monkeypatch):
    # packages installed with `pip install --target` into a PYTHONPATH folder lie outside site-packages
    from thunderfx_debug.records.sources import short_path

    site = tmp_path / "site"
    (site / "lightning_thunder-0.2.6.dist-info").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(tmp_path / "checkout"))  # a source checkout on the path: no dist-info
    assert short_path(str(site / "thunder" / "executors" / "torch_autograd.py")) == "thunder/executors/torch_autograd.py"
    assert short_path(str(site / "train.py")) == "site/train.py"  # a script there: no package
    assert short_path(str(tmp_path / "checkout" / "mypackage" / "models" / "gpt.py")) == "models/gpt.py"
    assert short_path(str(tmp_path / "elsewhere" / "train" / "model.py")) == "train/model.py"
