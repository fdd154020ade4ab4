"""Saving a converted model to one file that reloads without the Keras checkpoint.

The file is a torch.save of plain data (strings, lists, tensors): the Keras config and version,
the weights as read (by layer, Keras order) and the module's state_dict. load_converted reads it
as untrusted input: the zip container is checked first (stored members only, sizes inside the
file), torch.load runs with weights_only=True (executes nothing) and mmap=True (tensors are views
of the file, so a declared size allocates nothing), and every value is checked (types, dense
non-overlapping float tensors, the state_dict against the rebuilt model) before anything is
copied. Every failure is one ConversionError."""
from __future__ import annotations

import json
import os
import zipfile
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Union

import torch

from .files.containers import load_json, open_regular
from .errors import ConversionError

if TYPE_CHECKING:
    from .graph.model import KerasModel

FORMAT = "cudnn_rnn.keras/1"
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def save_converted(model: KerasModel, path: Union[str, os.PathLike]) -> None:
    """Writes a model load_keras returned as one file that reloads without the Keras checkpoint
    (load_converted): its config, the arrays it was built from, the states a tf.keras SavedModel
    kept for its stateful layers, and its state_dict (fine-tuned weights included), in
    torch.save's zip format, read back with weights_only=True."""
    weights = {name: [[[torch.as_tensor(a) for a in group] for group in take] for take in takes]
               for name, takes in model.keras_weights.items()}
    states = {name: [[p, torch.as_tensor(a)] for p, a in pairs] for name, pairs in getattr(model, "keras_states", {}).items()}
    torch.save({"format": FORMAT, "keras_config": json.dumps(model.keras_config),
                "keras_version": model.keras_version or "", "keras_backend": getattr(model, "keras_backend", None) or "",
                "keras_weights": weights, "keras_states": states,
                "state_dict": model.state_dict()}, path)


def _check_container(path) -> None:
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except Exception as e:  # noqa: BLE001 - BadZipFile and friends
        raise ConversionError(path, f"is not a readable converted model ({type(e).__name__}: {str(e)[:200]})") from None
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise ConversionError(path, "is not a readable converted model (a member is listed twice)")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1 or info.file_size != info.compress_size \
                or info.header_offset + info.compress_size > size:
            raise ConversionError(path, f"is not a readable converted model (member {info.filename[:80]!r} is "
                                        "compressed, encrypted or larger than the file; torch.save stores members)")


def _tensor(path, value, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.dtype not in _FLOATS:
        raise ConversionError(path, f"{what} is not a float tensor")
    if value.numel() and (not _dense(value) or
                          value.untyped_storage().nbytes() < (value.storage_offset() + value.numel()) * value.element_size()):
        raise ConversionError(path, f"{what} is a view that repeats or overruns its storage {tuple(value.shape)}; "
                                    "save_converted writes plain tensors")
    if value.dim() > 8:
        raise ConversionError(path, f"{what} has {value.dim()} dimensions")
    return value


def _dense(t: torch.Tensor) -> bool:
    """Every element has its own place in storage (no zero strides, no overlap, no gaps)."""
    expected = 1
    dims = sorted(((st, s) for s, st in zip(t.shape, t.stride()) if s != 1))
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _nested(path, value, depth: int, what: str):
    """keras_weights[name]: a list (calls) of lists (groups) of tensors."""
    if depth == 0:
        return _tensor(path, value, what).detach().to(torch.float32 if value.dtype != torch.float64 else value.dtype).numpy().copy()
    if not isinstance(value, list):
        raise ConversionError(path, f"{what} is not a list")
    return [_nested(path, v, depth - 1, what) for v in value]


def load_converted(path: Union[str, os.PathLike], dtype: Optional[torch.dtype] = None,
                   custom_layers: Optional[Mapping[str, Callable]] = None) -> KerasModel:
    """Loads a model ``cudnn-rnn convert`` (``save_converted``) wrote as ``.pt``: rebuilt from its
    stored Keras config and checked against its saved ``state_dict`` (read with
    ``weights_only=True``; nothing is unpickled).

    Args:
        path (str or os.PathLike): the ``.pt`` file.
        dtype (torch.dtype, optional): of the parameters. Default: ``None``, the saved model's
            (float64 where its parameters are float64, else float32).
        custom_layers (dict, optional): the builders :func:`load_keras` was given for the model's
            own layer classes. Default: ``None``.

    Returns:
        KerasModel: as :func:`load_keras` returns it.
    """
    from .load import rebuild

    path = str(path)
    _check_container(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - torch raises several types for a bad file
        raise ConversionError(path, f"is not a readable converted model ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConversionError(path, f"is not a cudnn_rnn converted model (expected format {FORMAT})")
    expected = {"format": str, "keras_config": str, "keras_version": str, "keras_weights": dict, "state_dict": dict}
    for key, kind in expected.items():
        if not isinstance(data.get(key), kind):
            raise ConversionError(path, f"is not a cudnn_rnn converted model ({key} is missing or not a {kind.__name__})")
    weights = {}
    for name, takes in data["keras_weights"].items():
        if not isinstance(name, str):
            raise ConversionError(path, "keras_weights has a key that is not a layer name")
        weights[name] = _nested(path, takes, 3, f"keras_weights[{name[:80]!r}]")
    state = {}
    for key, value in data["state_dict"].items():
        if not isinstance(key, str):
            raise ConversionError(path, "the state_dict has a key that is not a string")
        state[key] = _tensor(path, value, f"state_dict[{key[:80]!r}]")
    states = {}
    kept = data.get("keras_states", {})  # (absent in files written before states were kept)
    if not isinstance(kept, dict):
        raise ConversionError(path, "is not a cudnn_rnn converted model (keras_states is not a dict)")
    for name, pairs in kept.items():
        if not isinstance(name, str) or not isinstance(pairs, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in pairs):
            raise ConversionError(path, "keras_states is not a list of [path, tensor] pairs per layer name")
        states[name] = [(p, _nested(path, t, 0, f"keras_states[{name[:80]!r}]")) for p, t in pairs]
    config = load_json(path, data["keras_config"], "keras_config")
    if dtype is None:
        saved = {t.dtype for t in state.values() if t.is_floating_point()}
        dtype = torch.float64 if saved == {torch.float64} else torch.float32
    backend = data.get("keras_backend")  # (absent in files written before it was kept)
    model = rebuild(config, data["keras_version"] or None, weights, dtype, path, custom_layers,
                    backend if isinstance(backend, str) and backend else None, states)
    own = model.state_dict()
    if set(own) != set(state):
        extra, missing = sorted(set(state) - set(own)), sorted(set(own) - set(state))
        raise ConversionError(path, f"its state_dict does not match the model its config builds "
                                    f"(unexpected: {extra[:5]}, missing: {missing[:5]})")
    for key, value in state.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ConversionError(path, f"state_dict[{key[:80]!r}] has shape {tuple(value.shape)}; the model's is "
                                        f"{tuple(own[key].shape)}")
    model.load_state_dict(state)  # copies out of the mapped file; same shapes as the model that ran
    return model
