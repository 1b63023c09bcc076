"""bench.md, the report of `thunderfx-debug bench` (markdown): the pieces whose time under ThunderFX deviates from
inductor's (by the flush-time triage's rule), ranked by the time lost per step, with the repro scripts worth handing
to the compiler team; and, where the dump was triaged at flush, each piece's ratio beside the triage's, with why the
two can differ and the pieces where they do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from thunderfx_debug.commands.bench import Ranked, explain
from thunderfx_debug.records import Triage, deviation_outcome
from thunderfx_debug.render.digest import PieceLevel
from thunderfx_debug.render.text import ms, plural


def _md(text: object) -> str:
    """Text safe in a markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _row(i: int, r: Ranked) -> str:
    c = r.comparison
    return (f"| {i} | {_md(c.path)} | {c.level.value} | {_md(c.ours_executor)} | {ms(r.ours_ms)} | {ms(r.theirs_ms)} | "
            f"{r.ratio:.2f}x | {ms(r.loss_ms)} | {c.calls_per_step:g} | {r.clock} |")


HEADER = ("| # | piece | level | ThunderFX runs it with | ThunderFX ms | inductor ms | ratio | lost ms per step "
          "| calls per step | clock |\n|---|---|---|---|---|---|---|---|---|---|")


#: Why bench's ratio and the flush-time triage's can differ, said where the dump has both.
WHY_THEY_DIFFER = (
    "bench times each repro script on its own: on the inputs the script builds (rebuilt from the run's metadata, or "
    "the tensors saved with THUNDERFX_DEBUG_INPUTS=real), its forward and its (forward + backward) - forward timed "
    "apart by torch.utils.benchmark, one median per side, and on CPU the wall time of a standalone call. The triage "
    "timed the piece at the flush in a process of its own, on copies of the run's own tensors, forward and backward "
    "together as in training with the gradients the run's backward passed, both sides interleaved round by round, "
    "with a 95% interval. Inputs unlike the run's (a mask, a range of ids), what a standalone call pays around the "
    "piece, and a machine busy with other work make the two differ; where they disagree, the triage's is the one "
    "measured as the run ran.")


def _outcome(ratio: float, low: float, high: float, deviation: float) -> str:
    """"slower", "faster", "within" or "undecided", by the triage's rule."""
    outcome = deviation_outcome(low, high, deviation)
    if outcome == "deviates":
        return "slower" if ratio > 1 else "faster"
    return outcome


def beside_the_triage(ranked: Sequence[Ranked], triaged: Mapping[str, Triage], deviation: float) -> list[str]:
    """bench.md's section that sets each measured piece's ratio beside the flush-time triage's (`triaged`: piece path
    -> its triage), and names the pieces where they disagree (one deviates where the other does not, or the other
    way)."""
    rows, disagree = [], []
    for r in ranked:
        t = triaged.get(r.comparison.path)
        if r.error is not None or r.ratio is None or t is None or t.ratio is None or t.error is not None:
            continue
        ours = _outcome(r.ratio, r.ratio, r.ratio, deviation)
        theirs = _outcome(t.ratio, t.ratio_low or t.ratio, t.ratio_high or t.ratio, deviation)
        differ = ours != theirs and theirs != "undecided"
        rows.append(f"| {_md(r.comparison.path)} | {r.ratio:.2f}x ({ours}) | {t.ratio:.2f}x [{t.ratio_low:.2f}, "
                    f"{t.ratio_high:.2f}] ({theirs}) | {'DISAGREE' if differ else 'agree'} |")
        if differ:
            disagree.append(r.comparison.path)
    if not rows:
        return []
    said = (f"They disagree on {plural(len(disagree), 'piece')}: {', '.join(_md(p) for p in disagree)}."
            if disagree else "They agree on every piece both measured.")
    return ["", "## Beside the flush-time triage", "", WHY_THEY_DIFFER + " " + said, "",
            "| piece | bench ratio | the triage's ratio [95%] | |", "|---|---|---|---|", *rows]


def render_bench_report(ranked: Sequence[Ranked], deviation: float, title: str, script_prefix: str = "",
                        outside_in_run: Mapping[str, float] | None = None,
                        triaged: Mapping[str, Triage] | None = None) -> str:
    """Markdown. `script_prefix` is prepended to the scripts' dump-relative paths (their location seen from the
    report file); `outside_in_run` is `bench.outside_in_run` of the dump (the run's time outside each split's
    regions, shown beside the gap found there); `triaged` the dump's flush-time triage by piece path
    (`triage_findings.triaged_pieces`), set beside bench's ratios."""
    outside_in_run = outside_in_run or {}
    ok = [r for r in ranked if r.error is None and r.ratio is not None]
    losses = [r for r in ok if r.beyond and r.loss_ms > 0]
    gains = sorted((r for r in ok if r.beyond and r.loss_ms < 0), key=lambda r: r.loss_ms)
    failed = [r for r in ranked if r.error is not None]
    lines = [
        f"# thunderfx-debug bench: {_md(title)}",
        "",
        f"{plural(len(ok), 'piece')} compared ("
        f"{plural(sum(r.comparison.level is PieceLevel.FUSION for r in ok), 'nvFusion region')} against inductor, "
        f"{plural(sum(r.comparison.level is PieceLevel.SPLIT for r in ok), 'Thunder split')} against inductor), "
        f"{len(failed)} could not be measured. A piece deviates where ThunderFX's time is beyond {deviation:g}x "
        "inductor's either way (THUNDERFX_DEBUG_DEVIATION, the rule of the flush-time triage); only those are listed. "
        "Each side's time is one script's median, so a ratio here has no interval: one near the threshold may be "
        "noise, which the triage's interleaved rounds (THUNDERFX_DEBUG_TRIAGE) decide. "
        "Times are ms per call from the repro scripts' `--benchmark`; "
        "\"lost ms per step\" is (ThunderFX - inductor) x calls per step, calls per step from the dump's records. "
        "Clock \"device\" is the GPU's time for the piece's kernels (calls queued behind a sleep kernel, timed with "
        "CUDA events); \"wall\" is what a standalone call costs, host included, which for a small region is mostly "
        "the per-call cost of torch.compile's wrappers that the region does not pay inside a compiled graph. "
        "Device time is compared wherever both scripts measured it.",
        "",
        "## Where ThunderFX loses time",
        "",
    ]
    if losses:
        lines += [HEADER, *(_row(i, r) for i, r in enumerate(losses, 1)), "", "### Repro scripts to hand over", ""]
        for i, r in enumerate(losses, 1):
            c = r.comparison
            lines.append(f"{i}. **{_md(c.path)}** ({r.ratio:.2f}x, {ms(r.loss_ms)} ms per step): "
                         f"`python {script_prefix}{c.ours_script} --benchmark` against "
                         f"`python {script_prefix}{c.theirs_script} --benchmark`")
    else:
        lines.append(f"No piece is slower under ThunderFX than {deviation:g}x its time under inductor.")
    if gains:
        lines += ["", "## Where ThunderFX gains time", "", HEADER, *(_row(i, r) for i, r in enumerate(gains, 1))]
    explained = [e for e in explain(ranked) if e.split_loss_ms is not None and e.regions_loss_ms]
    if explained:
        lines += ["", "## How much of each split's gap its fusion regions explain", "",
                  "\"outside its regions\" is the split's gap less its regions': time lost in the ops Thunder runs "
                  "outside nvFusion regions (matmuls, attention, other executors' regions) and between them. \"the run "
                  "spent outside them\" is the training run's own device time there per step (fusion-level timing), "
                  "for scale.", "",
                  "| split | split lost ms per step | its regions | its regions that deviate | explained "
                  "| outside its regions | the run spent outside them |",
                  "|---|---|---|---|---|---|---|"]
        for e in explained:
            share = f"{e.regions_beyond_loss_ms / e.split_loss_ms:.0%}" if e.split_loss_ms > 0 else "-"
            lines.append(f"| {_md(e.split)} | {ms(e.split_loss_ms)} | {ms(e.regions_loss_ms)} | "
                         f"{ms(e.regions_beyond_loss_ms)} | {share} | {ms(e.split_loss_ms - e.regions_loss_ms)} | "
                         f"{ms(outside_in_run.get(e.split))} |")
    checked = [r for r in ranked if r.notes]
    if checked:
        lines += ["", "## Scripts that measured but failed their own check", "",
                  "Their times are used above; a mismatch against eager is worth a report of its own.", ""]
        lines += [f"- {_md(r.comparison.path)}: " + "; ".join(_md(n) for n in r.notes) for r in checked]
    within = len(ok) - len(losses) - len(gains)
    lines += ["", f"{plural(within, 'piece is', 'pieces are')} within {deviation:g}x and not listed."]
    lines += beside_the_triage(ranked, triaged or {}, deviation)
    if failed:
        lines += ["", "## Not measured", ""]
        lines += [f"- {_md(r.comparison.path)}: {_md(r.error)}" for r in failed]
    return "\n".join(lines) + "\n"
