"""The flush-time triage (records' `triage`, see `thunderfx_debug.triage.at_flush`) rendered: triage.md, the summary's
lines and the HTML section. Pieces are ranked by the time Thunder loses per step against inductor; for each split, how much of
its gap its fusion regions explain; and the totals: the splits' gains and losses summed, which is what the whole
ThunderFX step should differ from an inductor step of the same model by (inductor splits and the code between splits
are the same in both), beside the run's own step: its wall time (host clock) and the time in its compiled graphs per
step (the clock of the run's samples), each named as what it is."""

from __future__ import annotations

import dataclasses
import html as _html

from thunderfx_debug.records import DEVIATION, RankRecord, SplitKind, Triage, origin_lines
from thunderfx_debug.records.keys import PieceKey
from thunderfx_debug.render import accounting, digest, memory
from thunderfx_debug.render.headline import MIN_SAMPLES, too_few_samples
from thunderfx_debug.render.text import flagged, ms, plural

#: Pieces listed in the summary.
SUMMARY_TOP = 5


@dataclasses.dataclass(frozen=True)
class TriagedPiece:
    path: str  # "graph0/thunder_0" or "graph0/thunder_0/nvFusion0 forward"
    level: str  # "split" or "fusion"
    executor: str  # what Thunder ran it with
    split: str  # "graph0/thunder_0"
    triage: Triage
    scripts: tuple[str, ...]
    sources: tuple[str, ...] = ()  # the lines of the model's code its ops came from
    reads_saved_from: tuple[str, ...] = ()  # a backward region's: the forward's lines that made what it reads


def triaged_pieces(report: RankRecord) -> list[TriagedPiece]:
    """Every triaged piece, those where Thunder loses most per step first, unjudged ones last."""
    pieces = []
    for graph in report.graphs:
        for split in graph.splits:
            if split.kind is not SplitKind.THUNDER:
                continue
            where = PieceKey.of(graph.name, split.name)
            if split.triage is not None:
                pieces.append(TriagedPiece(where, "split", "thunder", where, split.triage,
                                           tuple(v for k, v in sorted(split.files.items()) if k.startswith("repro")),
                                           split.sources))
            for fusion in split.fusions:
                if fusion.triage is not None:
                    pieces.append(TriagedPiece(f"{where}/{fusion.name} {fusion.phase.value}", "fusion",
                                               fusion.executor, where, fusion.triage,
                                               tuple(v for k, v in sorted(fusion.files.items())
                                                     if k.startswith("repro")), fusion.sources,
                                               fusion.reads_saved_from))
    return sorted(pieces, key=lambda p: (p.triage.error is not None, -p.triage.ms_per_step, p.path))


@dataclasses.dataclass(frozen=True)
class Totals:
    """Per step: the splits' losses (> 0) and gains (< 0) against inductor, their sum, and the run's own figures to
    set them beside: `wall_ms` its step's wall time (host clock; None where no period was timed) and `compiled_ms`
    the time in its compiled graphs per step (on `clock`; None where no graph was timed). Each `*_flag` is "too few
    samples (n)" where that figure rests on too few of the run's samples (see `headline`). The sums rest on the
    triage's rounds, or on the run's own times where each has enough samples (`Triage.lost_from_the_run`)."""

    splits: int
    not_judged: int  # thunder splits with a triage record but no verdict: their time is in none of the sums
    lost_ms: float
    gained_ms: float
    compiled_ms: float | None
    clock: str
    wall_ms: float | None = None
    wall_flag: str | None = None
    compiled_flag: str | None = None

    @property
    def net_ms(self) -> float:
        return self.lost_ms + self.gained_ms


def totals(report: RankRecord) -> Totals:
    splits = [p.triage for p in triaged_pieces(report) if p.level == "split"]
    judged = [t for t in splits if t.error is None]
    account = accounting.step_account(report)
    return Totals(len(judged), len(splits) - len(judged), sum(t.ms_per_step for t in judged if t.ms_per_step > 0),
                  sum(t.ms_per_step for t in judged if t.ms_per_step < 0), digest.compiled_ms_per_step(report),
                  getattr(digest.clock(report), "value", "host"), account.wall_ms if account else None,
                  account.wall_flag if account else None, digest.compiled_samples_flag(report))


def outside_regions(report: RankRecord) -> list[tuple[str, float, float]]:
    """(split, its ms lost per step, its regions' ms lost per step) for the splits whose regions were triaged."""
    rows = []
    pieces = triaged_pieces(report)
    for split in [p for p in pieces if p.level == "split" and p.triage.error is None]:
        regions = [p for p in pieces if p.level == "fusion" and p.split == split.path and p.triage.error is None]
        if regions:
            rows.append((split.path, split.triage.ms_per_step, sum(p.triage.ms_per_step for p in regions)))
    return rows


def _ratio(t: Triage) -> str:
    return f"{t.ratio:.2f}x [{t.ratio_low:.2f}, {t.ratio_high:.2f}]" if t.ratio is not None else "-"


def _count_outcome(pieces, outcome: str) -> int:
    return sum(p.triage.outcome == outcome for p in pieces)


def _run(t: Triage) -> str:
    if t.run_ms is None:
        return "-"
    return ms(t.run_ms) + (" (unlike)" if t.unlike_the_run else f" [{too_few_samples(t.run_samples)}]"
                           if t.run_too_thin else "")


def times(ratio: float) -> str:
    """A ratio as "1.48x", or with two significant digits where it is small ("0.011x", never "0.00x").

    Example:
        >>> times(1.4812), times(0.0106), times(0.5)
        ('1.48x', '0.011x', '0.50x')
    """
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def caveats(p: TriagedPiece) -> list[str]:
    """What to keep in mind reading a piece's figures: its time in its own process unlike the run's, or the run's
    own time of it too thin to be set beside it (the time lost then comes from the triage's own times)."""
    t = p.triage
    if t.unlike_the_run:
        return [f"{p.path}: {ms(t.thunder_ms)} ms in its own process against the run's {ms(t.run_ms)} ms "
                f"({times(t.against_the_run)}, {plural(t.run_samples, 'sample')} of the run): its figures may not "
                "hold for the run (a machine shared with other work, inputs unlike the run's)"]
    if t.run_too_thin:
        return [f"{p.path}: the run's own time of it rests on {plural(t.run_samples, 'sample')} (fewer than "
                f"{MIN_SAMPLES}, the first and those disturbed by a compile left out): too few to be set beside its "
                "time here; its time lost per step comes from the triage's own times"]
    return []


def _verdict(t: Triage) -> str:
    if t.outcome == "deviates":
        return t.why.replace("_", " ")
    if t.outcome == "undecided":
        return f"undecided: its interval reaches past {t.deviation:g}x (more rounds would decide)"
    return t.outcome


def totals_line(report: RankRecord) -> str:
    t = totals(report)
    run = []
    if t.wall_ms is not None:
        run.append(f"the run's step: {flagged(ms(t.wall_ms, unit=True), t.wall_flag)} wall time (host clock)")
    if t.compiled_ms is not None:
        run.append(f"the time in its compiled graphs per step: {flagged(ms(t.compiled_ms, unit=True), t.compiled_flag)}"
                   f" ({t.clock} clock)")
    step = "; " + ", ".join(run) if run else ""
    unjudged = f" ({t.not_judged} more not judged, in none of these sums)" if t.not_judged else ""
    return (f"totals over {plural(t.splits, 'thunder split')}{unjudged}: Thunder loses {ms(t.lost_ms)} ms and gains "
            f"{ms(-t.gained_ms)} ms per step against inductor, net {ms(t.net_ms, unit=True)}: "
            f"what a ThunderFX step should take longer than an inductor step of the same model{step}")


def render_triage_md(report: RankRecord, title: str = "") -> str:
    """triage.md of a dump whose pieces were triaged at flush."""
    pieces = triaged_pieces(report)
    judged = [p for p in pieces if p.triage.error is None]
    deviating = [p for p in judged if p.triage.deviates]
    clocks = sorted({p.triage.clock.value for p in judged})
    deviation = pieces[0].triage.deviation if pieces else DEVIATION
    failed = [p for p in pieces if p.triage.error is not None]
    died = sum(p.triage.died for p in failed)
    lines = [f"# ThunderFX against inductor, in processes of their own{': ' + title if title else ''}", "",
             f"{plural(len(judged), 'piece')} timed ({sum(p.level == 'split' for p in judged)} Thunder splits, "
             f"{sum(p.level == 'fusion' for p in judged)} fusion regions), {len(deviating)} deviate beyond "
             f"{deviation:g}x either way, {_count_outcome(judged, 'within')} lie within it, "
             f"{_count_outcome(judged, 'undecided')} are undecided (their interval reaches past it: more rounds would "
             f"decide), {len(failed)} could not be judged"
             + (f" ({died} of them took the process that timed them down)" if died else "") + ". Each piece ran in "
             "a process of its own, compiled again as the run compiled it, on the inputs of a recorded call, against "
             "the same piece compiled by inductor, the two interleaved round by round; ms per call on the "
             + (", ".join(clocks) or "host") + " clock (a split's forward and backward together), the ratio "
             "Thunder/inductor with its 95% interval; a piece deviates when the whole interval lies beyond the "
             "threshold. \"run ms\" is the run's own sampled time of the piece (where it has one on the same "
             "clock; the headline median of its sampled calls, the first and those disturbed by a compile left "
             "out); \"lost ms per step\" is the run's time x (1 - 1/ratio) x calls per step where that time rests on "
             f"at least {MIN_SAMPLES} of the run's samples, else (Thunder - inductor) x calls per step (negative: "
             f"Thunder gains); calls per step: {digest.steps(report).describe()}.", "",
             "| # | piece | level | Thunder runs it with | Thunder ms | run ms | inductor ms | ratio [95%] "
             "| lost ms per step | calls per step | verdict | inputs | scripts |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, p in enumerate(judged, 1):
        t = p.triage
        lines.append(f"| {i} | {p.path} | {p.level} | {p.executor} | {ms(t.thunder_ms)} | {_run(t)} | "
                     f"{ms(t.inductor_ms)} | {_ratio(t)} | {ms(t.ms_per_step)} | "
                     f"{t.calls_per_step:g} | "
                     f"{_verdict(t)} | {t.inputs} | " + (", ".join(f"`{s}`" for s in p.scripts) or "-") + " |")
    noted = [line for p in judged for line in caveats(p)]
    if noted:
        lines += ["", f"To keep in mind (a time in its own process beyond {deviation:g}x either way of the run's own "
                      "time of the piece, or a run's time too thin to use):", ""]
        lines += [f"- {line}" for line in noted]
    explained = outside_regions(report)
    if explained:
        lines += ["", "## How much of each split's gap lies outside its fusion regions", "",
                  "| split | split lost ms per step | its regions | outside its regions |", "|---|---|---|---|"]
        lines += [f"| {s} | {ms(split)} | {ms(regions)} | {ms(split - regions)} |" for s, split, regions in explained]
    lines += memory.triage_md_lines(report)
    lines += ["", "## Totals", "", totals_line(report) + "."]
    spent = [p.triage for p in pieces if p.triage.compile_s is not None]
    if spent:
        compile_s = sum(t.compile_s or 0.0 for t in spent)
        timing_s = sum(t.timing_s or 0.0 for t in spent)
        wall = report.flush_cost.triage_s if report.flush_cost is not None else None
        took = (f"The triage took {wall:.1f} s of wall time (as its log line and the summary's flush line say); "
                "its pieces, summed: " if wall else "The triage's pieces, summed: ")
        lines += ["", took + f"{compile_s:.1f} s compiling inductor's counterparts with both sides' first calls, "
                      f"{timing_s:.1f} s timing ({sum(t.rounds for t in spent)} rounds, each piece stopping once its "
                      "interval was decided); the rest of the wall time is starting processes, handing them their "
                      "inputs and Thunder compiling each split again, and pieces that compile side by side overlap."]
    if failed:
        lines += ["", "## Not judged", ""]
        for p in failed:
            first, _, rest = p.triage.error.partition("\n")
            lines.append(f"- {p.path}: {first}")
            if p.triage.died:
                lines.append("  Rerun it alone: " + (", ".join(f"`python {s}`" for s in p.scripts) or
                                                     "set THUNDERFX_DEBUG_REPRO=split for its scripts"))
            if rest.strip():
                lines += ["", "  ```", *(f"  {line}" for line in rest.rstrip().splitlines()), "  ```", ""]
    return "\n".join(lines) + "\n"


def summary_lines(report: RankRecord) -> list[str]:
    """The summary's triage section (empty where nothing was triaged)."""
    pieces = triaged_pieces(report)
    if not pieces:
        return []
    judged = [p for p in pieces if p.triage.error is None]
    failed = [p for p in pieces if p.triage.error is not None]
    lines = ["", f"triage against inductor ({plural(len(judged), 'piece')} timed in processes of their own, "
                 f"{sum(p.triage.deviates for p in judged)} deviate, "
                 f"{_count_outcome(judged, 'undecided')} undecided"
                 + (f", {len(failed)} not judged" if failed else "") + "; see triage.md):"]
    for i, p in enumerate(judged[:SUMMARY_TOP], 1):
        t = p.triage
        unlike = (f" (its time there {ms(t.thunder_ms)} ms, the run's {ms(t.run_ms)} ms: may not hold for the run)"
                  if t.unlike_the_run else f" (from the triage's own times: the run sampled it "
                  f"{plural(t.run_samples, 'time')} beyond the first, too few to use)" if t.run_too_thin else "")
        lost = ms(t.ms_per_step, unit=True)
        lines.append(f"  {i}. {p.path}: {_ratio(t)}, {lost} lost per step, {_verdict(t)}{unlike}")
        if t.deviates:
            lines += [f"     {text}" for text in origin_lines(p.sources, p.reads_saved_from)]
    lines += [f"  not judged: {p.path}: {p.triage.error.partition(chr(10))[0]}" for p in failed[:SUMMARY_TOP]]
    if len(failed) > SUMMARY_TOP:
        lines.append(f"  ... and {len(failed) - SUMMARY_TOP} more not judged (triage.md)")
    lines.append("  " + totals_line(report))
    return lines


def html_section(report: RankRecord) -> str:
    """The HTML page's triage section (empty where nothing was triaged)."""
    pieces = triaged_pieces(report)
    if not pieces:
        return ""
    esc = _html.escape
    failed = [p for p in pieces if p.triage.error is not None]
    if len(failed) == len(pieces):  # no table of figures where there are none
        return (f"<h3>Triage against inductor</h3><p>No piece could be judged ({plural(len(failed), 'piece')} "
                "tried):</p><ul>" + "".join(f"<li>{esc(p.path)}: {esc(p.triage.error.partition(chr(10))[0])}</li>"
                                              for p in failed) + "</ul>")
    judged = [p for p in pieces if p.triage.error is None]
    rows = "".join(
        f"<tr><td>{esc(p.path)}</td><td>{p.level}</td><td class=\"num\">{ms(p.triage.thunder_ms)}</td>"
        f"<td class=\"num\">{esc(_run(p.triage))}</td>"
        f"<td class=\"num\">{ms(p.triage.inductor_ms)}</td><td class=\"num\">{esc(_ratio(p.triage))}</td>"
        f"<td class=\"num\">{ms(p.triage.ms_per_step)}</td>"
        f"<td class=\"num\">{p.triage.calls_per_step:g}</td><td>{esc(_verdict(p.triage))}</td></tr>"
        for p in judged)
    rows += "".join(f"<tr><td>{esc(p.path)}</td><td>{p.level}</td><td colspan=\"7\">not judged: "
                    f"{esc(p.triage.error.partition(chr(10))[0])}</td></tr>" for p in failed)
    noted = [line for p in judged for line in caveats(p)]
    notes = ("<p>To keep in mind:</p><ul>" + "".join(f"<li>{esc(line)}</li>" for line in noted) + "</ul>"
             if noted else "")
    return ("<h3>Triage against inductor</h3><p>ms per call (a split's forward and backward together); run ms: the "
            "run's own time of the piece; lost ms per step: the run's time x (1 - 1/ratio) x calls per step where "
            f"the run's time rests on at least {MIN_SAMPLES} samples, else (Thunder - inductor) x calls per step; "
            f"calls per step: {esc(digest.steps(report).describe())}.</p>"
            "<table><tr><th>piece</th><th>level</th><th>Thunder ms</th><th>run ms</th>"
            "<th>inductor ms</th><th>ratio [95%]</th><th>lost ms per step</th><th>calls per step</th>"
            "<th>verdict</th></tr>" + rows + f"</table>{notes}<p>{esc(totals_line(report))}</p>")
