"""The backend's settings and its fail-safe, at the bottom beside the records: `config` parses and validates every
setting (a keyword argument or its THUNDERFX_DEBUG_* environment variable) once, before training starts, and
`safety` is the guard every layer reports its own failures through (logged once, never reaching the training,
raised in strict mode). Neither imports anything above `records/`."""
