"""The flush-time triage (THUNDERFX_DEBUG_TRIAGE): each Thunder split, and each of its fusion regions, timed against
the same piece compiled by inductor, in processes of their own, never in the training process: a crash, a
device-side assert, an illegal memory access, a hang or an out-of-memory there is a verdict about that piece.
`at_flush` is the training process's side (what it hands each child, which children it starts, what it reads back),
`child` what a child runs, `ahead` the children that compile a split during training, ahead of the flush, `judging`
the rounds and the verdict; `jobs` is what a child is given, `graph_codec` the split's FX graph as it is,
`piece_inputs` the inputs of a recorded call made again. Its children are `children`'s: forks where this process has
not initialised CUDA, else fresh interpreters."""
