"""The triage report of `thunderfx-debug bench` (markdown): the pieces whose time under ThunderFX deviates from
inductor's (by the flush-time triage's rule), ranked by the time lost per step, with the repro scripts worth handing
to the compiler team."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from thunderfx_debug.commands.bench import Ranked, explain
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


def render_bench_report(ranked: Sequence[Ranked], deviation: float, title: str, script_prefix: str = "",
                  outside_in_run: Mapping[str, float] | None = None) -> str:
    """Markdown. `script_prefix` is prepended to the scripts' dump-relative paths (their location seen from the
    report file); `outside_in_run` is `bench.outside_in_run` of the dump (the run's time outside each split's
    regions, shown beside the gap found there)."""
    outside_in_run = outside_in_run or {}
    ok = [r for r in ranked if r.error is None and r.ratio is not None]
    losses = [r for r in ok if r.beyond and r.loss_ms > 0]
    gains = sorted((r for r in ok if r.beyond and r.loss_ms < 0), key=lambda r: r.loss_ms)
    failed = [r for r in ranked if r.error is not None]
    lines = [
        f"# ThunderFX triage: {_md(title)}",
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
    if failed:
        lines += ["", "## Not measured", ""]
        lines += [f"- {_md(r.comparison.path)}: {_md(r.error)}" for r in failed]
    return "\n".join(lines) + "\n"
