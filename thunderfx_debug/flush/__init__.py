"""What a flush runs in processes of its own: the flush-time triage (`triage`, each Thunder split and fusion region
timed against inductor) re-runs pieces of the run, never in the training process: a crash, a device-side assert, an
illegal memory access, a hang or an out-of-memory there is a verdict about that piece (`jobs` is what a child is
given, `graph_codec` the split's FX graph as it is, `triage_child` what the triage's child runs). The package's two
ways to run a piece in a process of its own are here, the minimizer's (`minimize`, the layer above) too:
`children`, forks of a process that has not initialised CUDA (they start at once, with every executor the parent
has), and `worker_pool`, fresh interpreters, long-lived workers with CUDA contexts of their own (the only way once
CUDA is initialised; `verify` and `bench` run their scripts in them too)."""
