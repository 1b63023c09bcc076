"""The backward window of one call of a piece (`recording.backward_window`), on real autograd on CPU: when its
callbacks run against the nodes autograd runs, that every hook goes when it closes, that gradients pass unchanged,
and that a backward which never comes, comes in part, or comes twice leaves nothing behind.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from thunderfx_debug.recording.backward_window import BackwardWindow, backward_nodes


class Logged(torch.autograd.Function):
    """y = 2x, whose backward writes `name` into `log` when it runs."""

    @staticmethod
    def forward(ctx, x, log, name):
        ctx.log, ctx.name = log, name
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(ctx.name)
        return grad * 2, None, None


def logging_window(log: list, inputs, outputs, **callbacks) -> BackwardWindow | None:
    """A window whose callbacks write what ran into `log` (`callbacks` replace them)."""
    named = {"on_start": lambda: log.append("start"), "on_end": lambda: log.append("end"),
             "on_close": lambda: log.append("close")}
    return BackwardWindow.around(inputs, outputs, **{**named, **callbacks})


def test_a_window_starts_before_the_pieces_first_node_and_ends_after_its_last_not_after_other_consumers():
    # Like a tied embedding weight: x's gradient is complete only after a later consumer's backward, which is not
    # the piece's; the window ends with the piece's own nodes.
    log = []
    x = torch.ones(3, requires_grad=True)
    other = Logged.apply(x, log, "other consumer")
    hidden = Logged.apply(x, log, "piece, feeds x")
    out = Logged.apply(hidden, log, "piece, first")
    window = logging_window(log, [x], [out])
    (out.sum() * 10 + other.sum()).backward()
    assert log == ["start", "piece, first", "piece, feeds x", "end", "close", "other consumer"]
    assert (window.started, window.ended, window.closed, window.ends_left) == (True, True, True, 0)


def test_each_node_that_feeds_an_input_is_told_what_it_passes_on_and_the_end_follows_the_last():
    log = []
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    a2, b2 = Logged.apply(a, log, "feeds a"), Logged.apply(b, log, "feeds b")
    out = torch.cat([a2, b2])  # first node: cat's; last: the two Logged nodes
    passed = {}
    window = logging_window(log, [a, b], [out], on_last_node=lambda i, grads: passed.update({i: grads[0].clone()}))
    out.backward(torch.arange(5.0))
    assert log[-2:] == ["end", "close"] and log.count("end") == 1
    assert sorted(passed) == [0, 1]
    assert sorted(g.tolist() for g in passed.values()) == [[0.0, 2.0], [4.0, 6.0, 8.0]]  # 2 * the incoming
    assert window.closed and a.grad.tolist() == [0.0, 2.0] and b.grad.tolist() == [4.0, 6.0, 8.0]


def test_gradients_pass_unchanged_through_a_windows_hooks():
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 4))

    def step(watched: bool):
        weight.grad = None
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = (x @ weight).tanh()
        if watched:
            window = BackwardWindow.around([x, weight], [out], on_start=lambda: None,
                                           on_last_node=lambda i, grads: None, on_end=lambda: None)
            assert window is not None
        out.pow(2).sum().backward()
        return x.grad.clone(), weight.grad.clone()

    plain, watched = step(False), step(True)
    assert all(torch.equal(p, w) for p, w in zip(plain, watched))


def test_a_call_with_no_input_that_takes_a_gradient_has_no_window():
    x = torch.ones(3, requires_grad=True)
    assert BackwardWindow.around([torch.ones(3)], [Logged.apply(x, [], "piece")]) is None


def test_a_closed_window_runs_none_of_its_callbacks_and_closes_once():
    log = []
    x = torch.ones(3, requires_grad=True)
    out = Logged.apply(x, log, "piece")
    window = logging_window(log, [x], [out])
    window.close()
    window.close()
    window.remove_on_close(out.grad_fn.register_prehook(lambda grads: log.append("a client's hook")))
    out.sum().backward()
    assert log == ["close", "piece"] and x.grad.tolist() == [2.0] * 3


def test_a_client_that_holds_its_window_is_freed_once_the_window_closed_without_waiting_for_the_collector():
    class Client:
        def __init__(self, x, out):
            self.window = BackwardWindow.around([x], [out], on_start=self.started, on_close=self.closed)

        def started(self):
            pass

        def closed(self):
            pass

    x = torch.ones(3, requires_grad=True)
    out = Logged.apply(x, [], "piece")
    client = Client(x, out)
    held = weakref.ref(client)
    gc.disable()
    try:
        out.sum().backward()
        del client
        assert held() is None
    finally:
        gc.enable()


def test_a_second_backward_of_the_same_graph_is_not_seen():
    log = []
    x = torch.ones(3, requires_grad=True)
    out = Logged.apply(x, log, "piece")
    logging_window(log, [x], [out])
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    assert log == ["start", "piece", "end", "close", "piece"]


def test_a_backward_to_some_inputs_only_starts_the_window_and_leaves_it_open_until_closed():
    log = []
    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    out = Logged.apply(a, log, "feeds a") + Logged.apply(b, log, "feeds b")
    window = logging_window(log, [a, b], [out])
    torch.autograd.grad(out.sum(), [a])  # b's node does not run
    assert log == ["start", "feeds a"] and window.ends_left == 1 and not window.closed
    window.close()  # the piece's next call
    assert log == ["start", "feeds a", "close"]


def test_a_window_whose_backward_never_comes_dies_with_the_autograd_graph():
    log = []
    x = torch.ones(3, requires_grad=True)
    out = Logged.apply(x, log, "piece")
    held = weakref.ref(logging_window(log, [x], [out]))
    gc.collect()
    assert held() is not None  # the hooks hold it
    del out
    gc.collect()
    assert held() is None and log == []


def test_with_on_backward_end_the_window_stays_open_for_its_clients_hooks_until_the_backward_ends():
    log = []
    x = torch.ones(3, requires_grad=True)
    fed = x * 1  # the piece's input is not a leaf: a node outside the piece runs after it
    out = Logged.apply(fed, log, "piece")
    window = logging_window(log, [fed], [out], on_backward_end=lambda: log.append("backward end"))
    window.remove_on_close(fed.grad_fn.register_prehook(lambda grads: log.append("input's node")))
    out.sum().backward(retain_graph=True)
    assert log == ["start", "piece", "end", "input's node", "backward end", "close"]
    out.sum().backward()  # every hook went at the close, the client's too
    assert log == ["start", "piece", "end", "input's node", "backward end", "close", "piece"]


def test_a_backward_that_ends_before_the_pieces_last_node_still_closes_a_window_kept_for_it():
    log = []
    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    out = Logged.apply(a, log, "feeds a") + Logged.apply(b, log, "feeds b")
    window = logging_window(log, [a, b], [out], on_backward_end=lambda: log.append(f"backward end, {window.ended}"))
    torch.autograd.grad(out.sum(), [a])
    assert log == ["start", "feeds a", "backward end, False", "close"] and window.ends_left == 1


def test_a_callback_that_raises_still_leaves_no_hook_behind():
    log = []
    x = torch.ones(3, requires_grad=True)
    out = Logged.apply(x, log, "piece")

    def failing_end():
        raise RuntimeError("end failed")

    window = logging_window(log, [x], [out], on_end=failing_end)
    with pytest.raises(RuntimeError, match="end failed"):
        out.sum().backward(retain_graph=True)
    assert window.closed and log == ["start", "piece", "close"]
    out.sum().backward()
    assert log == ["start", "piece", "close", "piece"]


def test_a_window_that_could_not_hook_every_node_leaves_none_hooked():
    class Unhookable:
        def register_hook(self, hook):
            raise RuntimeError("no hooks here")

    log = []
    x = torch.ones(3, requires_grad=True)
    out = Logged.apply(x, log, "piece")
    with pytest.raises(RuntimeError, match="no hooks here"):
        BackwardWindow([out.grad_fn], [out.grad_fn, Unhookable()], on_start=lambda: log.append("start"))
    out.sum().backward()
    assert log == ["piece"]


def test_outputs_of_one_node_start_the_window_once():
    log = []
    x = torch.ones(4, requires_grad=True)
    first, second = Logged.apply(x, log, "piece").split(2)  # two outputs, one node: split's
    y = torch.ones(2, requires_grad=True)
    third = Logged.apply(y, log, "other piece node")
    window = logging_window(log, [x, y], [first, second, third])
    (first.sum() + second.sum() + third.sum()).backward()
    assert log.count("start") == 1 and log[0] == "start" and log[-2:] == ["end", "close"]
    assert window.closed


def test_a_pieces_backward_ends_at_the_nodes_that_feed_its_inputs_whether_parameters_or_activations():
    weight, other = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    x = torch.randn(3, requires_grad=True) * 2  # an activation: not a leaf
    scaled = x * weight  # its node feeds both inputs: x's node and weight's accumulator
    shifted = scaled + other
    out = shifted.exp()
    assert backward_nodes([weight, x, 3], [out, x]) == ([out.grad_fn], [scaled.grad_fn])  # x passed through: not ours
    assert backward_nodes([weight], [out]) == ([out.grad_fn], [scaled.grad_fn])  # parameters alone
    assert backward_nodes([other], [out]) == ([out.grad_fn], [shifted.grad_fn])  # weight's accumulator is walked past
    assert backward_nodes([torch.randn(3)], [out]) == ([], [])  # no input takes a gradient: no window
    assert backward_nodes([weight], [out], limit=1) == ([], [])  # inputs not reached within the limit
