"""Whether an exception is the one the run raised: how the recorder reads a failure of the run
(`thunder/failures.py`) and how a repro script of the failing piece decides that it reproduced it (the template's
`failure_verdict`), one rule for both.

An exception is read as it was raised: Dynamo's wrappers of it taken off (`BackendCompilerFailed` holds it as
`inner_exception`, `InternalTorchDynamoError` and `TorchRuntimeError` as their cause) and the advice Dynamo appends to
a message it passes through ("from user code: ...", "Set TORCHDYNAMO_VERBOSE=1 ...") cut. Two exceptions are the
same failure where their types have the same name, the first lines of their messages are the same but for numbers
(a trace's names, t12 or t3, and addresses change from one process to the next), and they were raised in the same
function of the same file.

    >>> error = ValueError("t12 is not a tensor\\n\\nSet TORCHDYNAMO_VERBOSE=1 for the internal stack trace")
    >>> own_message(error)
    't12 is not a tensor'
    >>> run = {"type": "ValueError", "message": "t3 is not a tensor", "raised_in": "ops.py check"}
    >>> same_failure(run, {"type": "ValueError", "message": "t12 is not a tensor", "raised_in": "ops.py check"})
    True
    >>> same_failure(run, {"type": "ValueError", "message": "t3 is not a tensor", "raised_in": "other.py check"})
    False
"""

import re

#: What Dynamo appends to an exception's message (`torch._dynamo.exc.augment_exc_message`), where the message's own
#: text ends.
DYNAMO_ADVICE = ("\nfrom user code:\n", "\nSet TORCHDYNAMO_VERBOSE=1 ", "\nLast frame execution written to ",
                 "\nMinifier script written to ")
#: Dynamo's wrappers of another exception, by class name, and where the wrapped one is.
WRAPPERS = {"BackendCompilerFailed": "inner_exception", "InternalTorchDynamoError": "__cause__",
            "TorchRuntimeError": "__cause__"}


def own_exception(error):
    """The exception inside Dynamo's wrappers of it (itself where it is not wrapped)."""
    seen = set()
    while type(error).__name__ in WRAPPERS and id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, WRAPPERS[type(error).__name__], None)
        if not isinstance(inner, BaseException):
            break
        error = inner
    return error


def own_message(error):
    """The exception's message without what Dynamo appended to it."""
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    cut = min((text.find(marker) for marker in DYNAMO_ADVICE if marker in text), default=len(text))
    return text[:cut].rstrip()


def type_name(error):
    """"AssertionError" for a builtin, else "module.Name"."""
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def raised_in(error):
    """"torch_autograd.py forward": the file name and function of the innermost frame of its traceback."""
    tb, found = error.__traceback__, ""
    while tb is not None:
        code = tb.tb_frame.f_code
        file = re.split(r"[/\\]", code.co_filename)[-1]
        found = f"{file} {code.co_name}"
        tb = tb.tb_next
    return found


def described(error):
    """What `same_failure` compares of an exception (Dynamo's wrappers taken off)."""
    error = own_exception(error)
    return {"type": type_name(error), "message": own_message(error), "raised_in": raised_in(error)}


def _head(message):
    first = message.strip().splitlines()[0] if message.strip() else ""
    return re.sub(r"\d+", "#", first)[:200]


def same_failure(run, here):
    """Whether `here` (`described`) is the failure `run` describes (the same keys, as the run recorded them)."""
    if run.get("type") != here.get("type") or _head(run.get("message", "")) != _head(here.get("message", "")):
        return False
    return not run.get("raised_in") or not here.get("raised_in") or run["raised_in"] == here["raised_in"]
