"""Repro and benchmark scripts for graphs, splits and fusion regions, written at flush (see issue #3)."""

from __future__ import annotations


def scripts_for_graph(snapshot, backend) -> list:
    raise NotImplementedError("repro scripts are not implemented yet")
