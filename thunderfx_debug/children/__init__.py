"""Child processes: every process the package starts, and the pipes and files it talks to them through. What re-runs
a piece (the flush-time triage, the minimizer, `verify`, `bench`) runs it here, so that a crash, a native abort, a
device-side assert, a hang or an out-of-memory is a verdict about that piece, never the end of the process that asked.

The one picture, for every kind of child (`protocol` holds what they share):
- a job goes in as a script with its arguments (run as `__main__` in the script's folder, as `python script.py ARGS`
  would), as `module:function(*args)`, or as a command line; into a long-lived child, as a message on its stdin;
- its output goes into the job's log file (stdout and stderr both; `standalone` reads them back through pipes), and
  it comes out as an exit status: 0 or the script's own, negative where a signal killed it, None where it ran past
  its time limit and was ended (`protocol.how_it_ended` says one in words). A long-lived child answers each job with
  a message on a pipe of its own, carrying the status; a child whose record must outlive it appends messages to a
  file (the triage's `results.jsonl`). One message format for all: a JSON object a line (`protocol`). What a repro
  script says, its RESULT line (`scripts.result_line`), is for its user, and every runner reads its verdict there;
- a child is ended one way: every fresh interpreter is started as a process group of its own and ended with it
  (`protocol.end_group`), so that inductor's compile workers and a script's own children go with it; a fork stays in
  its parent's group and is killed alone past its time limit or when the wait for it is interrupted.

The kinds, and where a fork or a fresh interpreter is chosen:
- `forks`: `forked` runs a target in a fork of this process. A fork starts at once, with the parent's modules loaded
  and every executor the parent registered (a custom one of the training script's too). But a process that
  initialised CUDA cannot fork a child that uses it: a forked child can neither use its parent's CUDA context nor
  make one of its own. `forks.can_fork` is the one place that decides; the triage and the minimizer ask it, and take
  a fresh interpreter where it says no.
- `fork_server`: a fresh interpreter that imports torch (and Thunder where there is no GPU) once, initialises no CUDA,
  and forks a child per request, and its client: `thunderfx-debug minimize`'s trials, which start at once, without
  the state of the process that asked.
- `pool`: fresh interpreters, long-lived workers that run scripts one after another (`run_jobs`), and one-shot
  processes with a log (`run_process`): the triage's children and the minimizer's piece at flush once CUDA is
  initialised, and the workers of `verify` and `bench`, in which the package cannot be imported (a repro script must
  stand alone).
- `standalone`: one script in a fresh interpreter where thunderfx_debug cannot be imported, its output and RESULT
  line read back (`run_script`): repro scripts run as their users will run them.
"""
