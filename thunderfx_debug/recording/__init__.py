"""The training path: the recorder's in-memory states, the runners that Dynamo calls, samplers and clocks, and the
capture of each piece's first call (inputs' metadata, and real values when asked). Nothing here writes files; `snapshot()` is where records are read back."""
