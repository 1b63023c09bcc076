"""What a flush runs in processes of its own: the flush-time triage (`triage`, each Thunder split and fusion region
timed against inductor) re-runs pieces of the run, never in the training process: a crash, a device-side assert, an
illegal memory access, a hang or an out-of-memory there is a verdict about that piece (`jobs` is what a child is
given, `graph_codec` the split's FX graph as it is, `triage_child` what the triage's child runs, `triage_ahead` the
children that compile a split during training, ahead of the flush). Its children are `children`'s: forks where this
process has not initialised CUDA, else fresh interpreters."""
