"""Flush: records in, files out. `dump_contents.ArtifactCache`, `report_builder.build_report` and
`dump_contents.report_files` turn the recorder's snapshots (and what the flush's processes found,
`report_builder.FlushFindings`) into the `Report` and every file of a dump as (relative path, content) pairs:
graph.json per graph, the Thunder traces, repro scripts and saved inputs as configured (`repro/`), summary.txt,
trace.json and manifest.json (last). Nothing here touches the disk; `dump` writes the pairs."""
