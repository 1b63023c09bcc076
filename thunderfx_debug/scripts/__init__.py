"""What every repro script carries, the bottom layer: the judging rule and its float64 yardstick (`judging_rule`),
the CUDA-event timer (`device_timer`), the RESULT line (`result_line`), whether an exception is the one the run raised
(`run_failure`), and the random numbers nvFuser and torch's CUDA generator draw, drawn again on any device
(`philox_draws`). The package imports these modules (the correctness sentinel, the sampler, the capture, the
flush-time triage), and the repro writer inlines their source text into each script it writes
(`artifacts/repro/writers.py`), because a script runs where thunderfx_debug cannot be imported: one text for both, no
copy to hold equal. So they import torch and the standard library only, never `from __future__`, and nothing of the
package, this folder included."""
