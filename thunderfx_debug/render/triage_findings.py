"""The flush-time triage (records' `triage`, see `thunderfx_debug.flush.triage`) rendered: triage.md, the summary's
lines and the HTML section. Pieces are ranked by the time Thunder loses per step against inductor; for each split, how much of
its gap its fusion regions explain; and the totals: the splits' gains and losses summed, which is what the whole
ThunderFX step should differ from an inductor step of the same model by (inductor splits and the code between splits
are the same in both), beside the run's own step: its wall time (host clock) and the time in its compiled graphs per
step (the clock of the run's samples), each named as what it is."""

from __future__ import annotations

import dataclasses
import html as _html

from thunderfx_debug.records import DEVIATION, RankRecord, SplitKind, Triage, origin_lines
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
            where = f"{graph.name}/{split.name}"
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
    samples (n)" where that figure rests on too few of the run's samples (see `headline`)."""

    splits: int
    not_judged: int  # thunder splits with a triage record but no verdict: their time is in none of the sums
    lost_ms: float
    gained_ms: float
    compiled_ms: float | None
    clock: str
    wall_ms: float | None = None
    net_flag: str | None = None
    wall_flag: str | None = None
    compiled_flag: str | None = None

    @property
    def net_ms(self) -> float:
        return self.lost_ms + self.gained_ms


def lost_flag(t: Triage) -> str | None:
    """"too few samples (n)" where the time `t` says is lost per step rests on the run's own time of the piece and
    that on too few samples (a short run, or one sampled rarely); None where it has enough, or rests on the triage's
    rounds alone (whose interval says how sure they are)."""
    return too_few_samples(t.run_samples) if t.lost_from_the_run else None


def totals(report: RankRecord) -> Totals:
    splits = [p.triage for p in triaged_pieces(report) if p.level == "split"]
    judged = [t for t in splits if t.error is None]
    thin = [t.run_samples for t in judged if lost_flag(t)]  # a sum is as thin as its thinnest part
    account = accounting.step_account(report)
    return Totals(len(judged), len(splits) - len(judged), sum(t.ms_per_step for t in judged if t.ms_per_step > 0),
                  sum(t.ms_per_step for t in judged if t.ms_per_step < 0), digest.compiled_ms_per_step(report),
                  getattr(digest.clock(report), "value", "host"), account.wall_ms if account else None,
                  too_few_samples(min(thin)) if thin else None, account.wall_flag if account else None,
                  digest.compiled_samples_flag(report))


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
    return ms(t.run_ms) + (" (unlike)" if t.unlike_the_run else "")


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
            f"{ms(-t.gained_ms)} ms per step against inductor, net {flagged(ms(t.net_ms, unit=True), t.net_flag)}: "
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
    unlike = [p for p in judged if p.triage.unlike_the_run]
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
             "clock); \"lost ms per step\" is the run's time x (1 - 1/ratio) x calls per step where the run has its "
             "time (marked \"too few samples\" where that time rests on fewer than "
             f"{MIN_SAMPLES} of the run's samples), else (Thunder - inductor) x calls per step (negative: Thunder "
             "gains).", "",
             "| # | piece | level | Thunder runs it with | Thunder ms | run ms | inductor ms | ratio [95%] "
             "| lost ms per step | calls per step | verdict | inputs | scripts |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, p in enumerate(judged, 1):
        t = p.triage
        lines.append(f"| {i} | {p.path} | {p.level} | {p.executor} | {ms(t.thunder_ms)} | {_run(t)} | "
                     f"{ms(t.inductor_ms)} | {_ratio(t)} | {flagged(ms(t.ms_per_step), lost_flag(t))} | "
                     f"{t.calls_per_step:g} | "
                     f"{_verdict(t)} | {t.inputs} | " + (", ".join(f"`{s}`" for s in p.scripts) or "-") + " |")
    if unlike:
        lines += ["", "Timed in its own process, these pieces took another time than the run's own samples of them, "
                      f"beyond {deviation:g}x either way: their figures may not hold for the run (a machine shared "
                      "with other work, inputs unlike the run's):", ""]
        lines += [f"- {p.path}: {ms(p.triage.thunder_ms)} ms against the run's {ms(p.triage.run_ms)} ms "
                  f"({p.triage.against_the_run:.2f}x, {plural(p.triage.run_samples, 'sample')} of the run)"
                  for p in unlike]
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
        lines += ["", f"The triage took {compile_s + timing_s:.1f} s: {compile_s:.1f} s compiling inductor's "
                      f"counterparts with both sides' first calls, {timing_s:.1f} s timing "
                      f"({sum(t.rounds for t in spent)} rounds, each piece stopping once its interval was decided)."]
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
                  if t.unlike_the_run else "")
        lost = flagged(ms(t.ms_per_step, unit=True), lost_flag(t))
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
    rows = "".join(
        f"<tr><td>{esc(p.path)}</td><td>{p.level}</td><td class=\"num\">{ms(p.triage.thunder_ms)}</td>"
        f"<td class=\"num\">{ms(p.triage.inductor_ms)}</td><td class=\"num\">{esc(_ratio(p.triage))}</td>"
        f"<td class=\"num\">{esc(flagged(ms(p.triage.ms_per_step), lost_flag(p.triage)))}</td>"
        f"<td>{esc(_verdict(p.triage))}</td></tr>"
        for p in pieces if p.triage.error is None)
    rows += "".join(f"<tr><td>{esc(p.path)}</td><td>{p.level}</td><td colspan=\"5\">not judged: "
                    f"{esc(p.triage.error.partition(chr(10))[0])}</td></tr>" for p in failed)
    return ("<h3>Triage against inductor</h3><table><tr><th>piece</th><th>level</th><th>Thunder ms</th>"
            "<th>inductor ms</th><th>ratio [95%]</th><th>lost ms per step</th><th>verdict</th></tr>" + rows
            + f"</table><p>{esc(totals_line(report))}</p>")
