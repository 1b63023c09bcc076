"""Flush: records in, files out. `flush.ArtifactCache`, `report_builder.build_report` and `flush.report_files` turn
the recorder's snapshots into the `Report` and every file of a dump as (relative path, content) pairs: graph.json
per graph, the Thunder traces, repro scripts and saved inputs as configured, summary.txt, trace.json and
manifest.json (last). Nothing here touches the disk; `dump` writes the pairs."""
