"""The training path: the recorder's in-memory states, the runners that Dynamo calls, samplers and clocks, and the
capture of real inputs. Nothing here writes files; `snapshot()` is where records are read back."""
