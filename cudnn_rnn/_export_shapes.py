"""Dynamic sequence lengths for torch.export and the ONNX exporter (cudnn-rnn convert,
cudnn_rnn.onnx.export): exports retried with the length ranges torch can prove.

torch.export checks every guard its trace makes over a dynamic length against the range given.
A range torch can name (a minimum: the length a valid convolution needs) comes back as its
"Suggested fixes", applied once. A guard no range expresses (a pooled length must not be 1: torch
specialises size-1 dimensions) is met by raising the minimum until the guard holds over the range.
"""
from __future__ import annotations

from typing import Callable, Iterator, List, Optional


def error_chain(error: BaseException) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _text(error: BaseException) -> str:
    return "\n".join(str(e) for e in error_chain(error))


def is_sequence(rank: int, floating: bool) -> bool:
    """Whether an input's second dimension is a length: an input of three or more dimensions, or
    of two holding ids or a mask (a two-dimensional floating input is a vector: an initial state,
    features)."""
    return rank >= 3 or (rank == 2 and not floating)


def _suggested_fixes(text: str) -> List[str]:
    """The "name = expr" lines that follow torch.export's "Suggested fixes:", nothing after them."""
    if "Suggested fixes:" not in text:
        return []
    fixes = []
    for line in text[text.index("Suggested fixes:") + len("Suggested fixes:"):].strip().splitlines():
        if " = " not in line:
            break
        fixes.append(line.strip())
    return fixes


def with_refined_shapes(export: Callable, shapes):
    """export(shapes); where the model ties lengths together or needs a minimum, torch.export says
    so and suggests the ranges, which are applied once."""
    try:
        return export(shapes)
    except Exception as e:  # noqa: BLE001 - torch raises UserError, or the ONNX exporter wraps it
        fixes = _suggested_fixes(_text(e))
        if not fixes:
            raise
        from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

        if any(name.strip().startswith("time_") and _restricts(value.strip())
               for name, value in (fix.split(" = ", 1) for fix in fixes)):
            raise  # a sequence length made a constant or a multiple: the export would take those lengths only
        return export(refine_dynamic_shapes_from_suggested_fixes("Suggested fixes:\n" + "\n".join(fixes), shapes))


def _restricts(value: str) -> bool:
    """Whether a suggested fix for a length keeps only some lengths: a constant ("2048") or an
    expression ("2*_time_0": the even ones), where a range ("Dim('time_0', min=4)") or another
    length ("time_1": two inputs of one length) keeps every length it allows."""
    return not value.startswith("Dim(") and (value.isdigit() or any(op in value for op in "*+-/%"))


def export_from_length(export: Callable, shapes_from: Callable, shortest: int, longest_minimum: int,
                       probe: Optional[Callable] = None):
    """export(shapes_from(minimum), minimum) for the fewest minimum length whose range holds every
    guard of the trace: from ``shortest`` on, doubling up to ``longest_minimum``, then halving the
    gap to the last one that failed. Returns the export's result and the minimum it took (the
    export run last is that one's: an exporter may write a file).

    ``probe`` (same arguments): a cheaper export whose refusal at every minimum ends the search
    (torch.export's, for the ONNX exporter, which runs it and falls back to exports that do not
    prove the shapes at each try). Where ``export`` fails at the first minimum, the probe searches
    the longer ones first; where it holds at none, its refusal is raised, else ``export`` searches
    on."""
    first = max(2, shortest)  # torch.export specialises lengths 0 and 1
    if probe is None or 2 * first > longest_minimum:
        return _fewest_minimum(export, shapes_from, first, longest_minimum)
    try:
        return _attempt(export, shapes_from, first), first
    except Exception as e:  # noqa: BLE001
        if not _refused(e):
            raise
    try:
        _fewest_minimum(probe, shapes_from, 2 * first, longest_minimum)
    except Exception as e:  # noqa: BLE001 - a probe failing otherwise than over the lengths says nothing
        if _refused(e):
            raise
    return _fewest_minimum(export, shapes_from, 2 * first, longest_minimum, failed=first)


def _refused(error: BaseException) -> bool:
    """A guard over the range: a longer minimum may hold it."""
    return "Constraints violated" in _text(error)


def _attempt(export: Callable, shapes_from: Callable, minimum: int):
    return with_refined_shapes(lambda shapes: export(shapes, minimum), shapes_from(minimum))


def _fewest_minimum(export: Callable, shapes_from: Callable, minimum: int, longest_minimum: int, failed=None):
    """The search of export_from_length from ``minimum`` on (``failed``: a shorter one that failed)."""
    while True:
        try:
            result = _attempt(export, shapes_from, minimum)
            break
        except Exception as e:  # noqa: BLE001
            if 2 * minimum > longest_minimum or not _refused(e):
                raise
            failed, minimum = minimum, 2 * minimum
    last_ok = True
    while failed is not None and minimum - failed > 1:
        middle = (failed + minimum) // 2
        try:
            result, minimum, last_ok = _attempt(export, shapes_from, middle), middle, True
        except Exception as e:  # noqa: BLE001
            if not _refused(e):
                raise
            failed, last_ok = middle, False
    if not last_ok:
        result = _attempt(export, shapes_from, minimum)
    return result, minimum


def length_failure(error: BaseException):
    """Why torch.export found no range of lengths to export over (the violated guard, or the
    constant it made a length), or None for any other failure."""
    text = _text(error)
    if "Constraints violated" not in text:
        return None
    fixes = _suggested_fixes(text)
    guards = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("- Not all values")]
    said = f"it suggests {'; '.join(fixes)}" if fixes else (guards[0][:300] if guards else "")
    return ("torch.export cannot prove the model's shapes over every length" + (f" ({said})" if said else "") +
            ": a layer's shapes may hold at particular lengths only (a split of the time axis into equal parts, a "
            "reshape to a fixed length)")
