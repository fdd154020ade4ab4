"""Dynamic sequence lengths for torch.export and the ONNX exporter (cudnn-rnn convert,
cudnn_rnn.onnx.export): exports retried with the length ranges torch can prove.

torch.export checks every guard its trace makes over a dynamic length against the range given.
A range torch can name (a minimum: the length a valid convolution needs) comes back as its
"Suggested fixes", applied once. A guard no range expresses (a pooled length must not be 1: torch
specialises size-1 dimensions) is met by raising the minimum until the guard holds over the range.
"""
from __future__ import annotations

from typing import Callable, Iterator


def error_chain(error: BaseException) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _text(error: BaseException) -> str:
    return "\n".join(str(e) for e in error_chain(error))


def with_refined_shapes(export: Callable, shapes):
    """export(shapes); where the model ties lengths together or needs a minimum, torch.export says
    so and suggests the ranges, which are applied once."""
    try:
        return export(shapes)
    except Exception as e:  # noqa: BLE001 - torch raises UserError, or the ONNX exporter wraps it
        text = _text(e)
        if "Suggested fixes" not in text:
            raise
        from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

        lines = text[text.index("Suggested fixes:") + len("Suggested fixes:"):].strip().splitlines()
        fixes = []
        for line in lines:  # the "name = expr" lines that follow, nothing after them
            if " = " not in line:
                break
            fixes.append(line.strip())
        if any(name.strip().startswith("time_") and value.strip().isdigit()
               for name, value in (fix.split(" = ", 1) for fix in fixes)):
            raise  # a sequence length made a constant: the export would take that length only
        return export(refine_dynamic_shapes_from_suggested_fixes("Suggested fixes:\n" + "\n".join(fixes), shapes))


def export_from_length(export: Callable, shapes_from: Callable, shortest: int, longest_minimum: int):
    """export(shapes_from(minimum), minimum) for the first minimum length, from ``shortest`` on and
    doubling up to ``longest_minimum``, whose range holds every guard of the trace. Returns the
    export's result and the minimum it took."""
    minimum = max(2, shortest)  # torch.export specialises lengths 0 and 1
    while True:
        try:
            return with_refined_shapes(lambda shapes: export(shapes, minimum), shapes_from(minimum)), minimum
        except Exception as e:  # noqa: BLE001
            if 2 * minimum > longest_minimum or "Constraints violated" not in _text(e):
                raise
            minimum *= 2


def length_failure(error: BaseException):
    """Why torch.export found no range of lengths to export over (the violated guard, or the
    constant it made a length), or None for any other failure."""
    text = _text(error)
    if "Constraints violated" not in text:
        return None
    lines = [line.strip() for line in text.splitlines()]
    fixes = []
    if "Suggested fixes:" in lines:
        for line in lines[lines.index("Suggested fixes:") + 1:]:
            if " = " not in line:
                break
            fixes.append(line)
    guards = [line[2:] for line in lines if line.startswith("- Not all values")]
    said = f"it suggests {'; '.join(fixes)}" if fixes else (guards[0][:300] if guards else "")
    return ("torch.export cannot prove the model's shapes over every length" + (f" ({said})" if said else "") +
            ": a layer's shapes may hold at particular lengths only (a split of the time axis into equal parts, a "
            "reshape to a fixed length)")
