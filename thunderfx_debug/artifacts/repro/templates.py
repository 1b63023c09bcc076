"""The text of the repro scripts, in one place. Every script has the same shape: a docstring that says what it
reproduces and how, a `# versions:` line, the piece's code (an FX module class, a fusion region's function, or
nvFuser's fusion definition), `make_inputs()`, `eager()`, `build()`, and a call of `runtime.main`."""

from __future__ import annotations

SCRIPT = '''\
"""{title}

{description}
Written by thunderfx_debug at the end of a training run. Runs on its own:
    python {file_name}                              # {check}
    python {file_name} --benchmark [--json PATH]    # and times it (forward{backward_note})
Inputs: {inputs_note}
"""
# versions: {versions}
import sys

import thunderfx_debug  # noqa: F401  (first: installs the workarounds that `import thunder` needs with this torch)
import torch
from thunderfx_debug.artifacts.repro import runtime
{imports}


{definitions}


{inputs_code}


def eager():
{eager_body}


def build():
{build_body}


if __name__ == "__main__":
    sys.exit(
        runtime.main(
            script=__file__,
            piece={piece!r},
            executor={executor!r},
            build=build,
            eager=eager,
            make_inputs=make_inputs,
            expected_outputs={expected},
            backward={backward},
        )
    )
'''

META_INPUTS = '''\
def make_inputs():
    # Random values with the shapes, strides, dtypes, devices and value ranges the run recorded.
{body}'''

REAL_INPUTS = '''\
# The tensors the run saw on the first call of this piece, and what that call returned (saved at the end of the run).
SAVED_INPUTS, SAVED_OUTPUTS = runtime.load_inputs({path!r}, __file__)


def make_inputs():
    return SAVED_INPUTS'''

CHECK_AGAINST_EAGER = "checks it against eager PyTorch (forward outputs and gradients); exit 1 beyond the tolerance"
CHECK_AGAINST_RUN = (
    "checks its forward outputs against what the run produced, and gradients against eager; exit 1 beyond the tolerance"
)
CHECK_EAGER_META = "runs it eagerly (forward and backward)"
CHECK_EAGER_REAL = "runs it eagerly and checks its outputs against what the run produced; exit 1 beyond the tolerance"
