"""A Hugging Face T5 with its default dropout under ReportingBackend, every script verified (`zoo_verify`): its
relative-position buckets taken from the run (no script REFUSED), its decoder-input shift traced as Dynamo recorded it
(no CRASH before inductor ran), random pieces OK or NOT COMPARABLE."""

from __future__ import annotations

import pytest

from zoo_verify import verified

pytest.importorskip("transformers")


def test_every_script_of_t5_with_dropout_verifies(tmp_path, one_thread):
    rows = verified(tmp_path, "t5-dropout")
    assert rows and all(r["verdict"] in ("OK", "NOT_COMPARABLE") for r in rows), \
        [(r["path"], r["line"] or r["note"]) for r in rows if r["verdict"] not in ("OK", "NOT_COMPARABLE")]
