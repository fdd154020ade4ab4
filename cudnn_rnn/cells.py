"""What a cell is, said once: gates per cell, states per cell, the activation names the kernels
implement and Keras's aliases for them, and how a cell departs from the standard one that cuDNN
and torch.nn implement. The counts and the standard cell come from the C++ side (csrc/core,
csrc/cudnn_host) so that Python never restates them; layers, the Keras loader, tests and
benchmarks import them from here.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ._C import activation_names, cell_gates
from ._C import standard_departures as _standard_departures

# Gates per cell, in Keras column order (LSTM i, f, c, o; GRU z, r, h; SimpleRNN one block).
GATES = dict(cell_gates())
CELLS = tuple(GATES)
# States a layer returns and takes per direction (LSTM h and c; the others h).
STATES = {cell: 2 if cell == "lstm" else 1 for cell in CELLS}

# The Keras activation names the kernels implement, in the order of the C++ Activation enum.
ACTIVATIONS = tuple(activation_names())
# Keras names that are spelled differently in Keras's own registry (None means linear).
ACTIVATION_ALIASES = {None: "linear", "swish": "silu", "hard_swish": "hard_silu"}


def canonical_activation(name, argument: str = "activation") -> str:
    """The kernel name of a Keras activation name (aliases resolved); ValueError if unknown."""
    name = ACTIVATION_ALIASES.get(name, name)
    if not isinstance(name, str) or name not in ACTIVATIONS:
        # the value first: a loader's message quoting the start of this one names it
        raise ValueError(f"{argument} {name!r} is not one the recurrent cells compute; it must be one of "
                         f"{sorted(ACTIVATIONS)} or None")
    return name


def standard_departures(cell: str, activation: str, recurrent_activation: Optional[str],
                        reset_after: bool) -> List[Tuple[str, str]]:
    """(setting, what the standard cell has) for each way a cell departs from the one cuDNN and
    torch.nn implement; empty for a standard cell. Asked of csrc/cudnn_host/backend_choice.cpp,
    the same rules that send a call to cuDNN or not."""
    return [tuple(d) for d in _standard_departures(cell, activation, recurrent_activation or "sigmoid",
                                                     bool(reset_after))]
