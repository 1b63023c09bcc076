"""The training path: the recorder's in-memory states, the runners that Dynamo calls, samplers and clocks, and the
capture of each piece's first call (inputs' metadata, and real values when asked), and the facts of the run that go
into the manifest (`manifest`: versions, settings, environment). Nothing here writes files; `snapshot()` is where
records are read back."""
