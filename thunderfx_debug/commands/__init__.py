"""`thunderfx-debug` and what its commands run: `cli` (the command line; `python -m thunderfx_debug` calls it),
`demo` (a short training of `models`' GPT under the backend), `bench` with `bench_worker` and `bench_report` (the
dump's scripts timed against inductor, in long-lived workers, and bench.md), and `verify` (every repro script of a
dump run as its user would, and what each said). The top layer: it may import any layer below, and nothing of the
package imports it but `__main__`."""
