"""What a flush runs in processes of its own: the flush-time triage (`triage`, each Thunder split and fusion region
timed against inductor) and the minimizer's piece runs re-run pieces of the run, each in a worker process
(`worker_pool`) with a CUDA context of its own, never in the training process: a crash, a device-side assert, an
illegal memory access, a hang or an out-of-memory there is a verdict about that piece (`jobs` is what a child is
given, `graph_codec` the split's FX graph as it is, `triage_child` what the triage's child runs)."""
