"""From a wrong fusion region (or Thunder split) to the smallest script that still fails: `thunderfx-debug minimize
SCRIPT` (`offline`) and, with THUNDERFX_DEBUG_MINIMIZE=1, the same at flush for every piece the correctness
sentinel flagged, in the training process (`at_flush`).

What is shrunk, and why this and not PyTorch's FX minifier. A piece is shrunk as the code its repro script carries
(`statements`): a split's FX graph as Thunder's writer prints it (one statement per node, each under the comment
naming the model's source line it came from), a region's ops as Thunder's torch executor lowers its bound symbols
(the region's eager reference: one statement, or a few, per bound symbol). `torch._functorch.fx_minifier.minifier`
(what inductor's `minifier_launcher.py` runs) shrinks an `fx.GraphModule`, and its strategies are the ones used here
(`shrink`), but it is not used itself: a script holds code, not a graph, and tracing that code again with torch.fx
is not faithful to it (calls with no traced argument, such as autocast's enter and exit in a split, run at trace
time instead of being recorded; the torch executor's helpers branch on `isinstance` of their arguments, which a
tracer's proxies answer wrongly for integer tensors); each of its trials would be a compile in a child process
(seconds), while it restarts at the coarsest granularity after every success and has no time budget; and a cut
written back as code keeps the script's own lines and comments, so the minimal script reads as a part of the one the
user had. For a fusion region, the region's own statements are the bound symbols it is made of, which is what delta
debugging over the region's ops asks for; offline the script's function is all there is of them.

How a cut is judged. Dropped ops that kept ones read become inputs holding the values the full piece computed
(eager, once); the cut is written as a script by the writers every repro script comes from (same template, check,
verdict line and exit status) and run in a child process (`trials`): a crash, a signal or a device assert is a
verdict, not the end of the minimizer. A cut is kept only if it fails the way the full piece failed (`verdict`):
a MISMATCH of the same kind of value, a CRASH with the same exception. The full piece runs at least twice first; a
verdict that changes between identical runs is random, and is said to be so instead of shrunk.

How trials build the piece: a split as its script does (Thunder with the run's options and executors); a region of
Thunder's torch.compile executor as that executor compiles it (torch.compile of its torch ops, no Thunder); any
other region by handing its torch ops back to Thunder with the region's own executor. nvFuser's region scripts run
nvFuser's definition of the region, whose ops do not match the torch function's one for one; so its trials hand the
ops back to Thunder with nvFuser, and the minimal script is nvFuser's definition of the minimal region as Thunder
makes it, with no Thunder in it (`piece`), where that script still fails the same way.
"""
