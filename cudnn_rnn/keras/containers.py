"""Reading the Keras containers safely: the `.keras` zip, and HDF5 files (`.weights.h5`, legacy
`.h5`). Only h5py, json and the standard library; nothing is ever unpickled.

Hostile input is refused before anything large is allocated: zip members outside the archive
root, members that decompress beyond MAX_MEMBER_BYTES or by more than MAX_COMPRESSION_RATIO,
datasets whose declared size exceeds MAX_DATASET_ELEMENTS, non-numeric datasets.
"""
from __future__ import annotations

import io
import json
import posixpath
import zipfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from .errors import ConversionError

MAX_MEMBER_BYTES = 8 << 30          # a model.weights.h5 larger than 8 GiB is not a sane RNN model
MAX_CONFIG_BYTES = 64 << 20
MAX_COMPRESSION_RATIO = 200         # zip bombs compress by thousands
MAX_DATASET_ELEMENTS = 1 << 31


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - h5py is a dependency
        raise ImportError("reading Keras checkpoints needs h5py: pip install h5py") from e
    return h5py


@dataclass
class KerasFile:
    """What a Keras file holds: the model config (or None for weights-only files), the Keras
    version that wrote it, the weights as an open h5py.File, and which layout the weights use."""

    path: str
    config: Optional[Dict[str, Any]]
    keras_version: Optional[str]
    h5: Any                    # h5py.File
    layout: str                # "keras3" (layers/<name>/vars/i) or "legacy" (layer_names/weight_names)
    weights_root: Any          # the h5py.Group the layout starts at

    def close(self) -> None:
        self.h5.close()


def _check_member_name(path, name: str) -> None:
    norm = posixpath.normpath(name)
    if name.startswith("/") or norm.startswith("..") or "\\" in name or ":" in name.split("/")[0]:
        raise ConversionError(path, f"zip member {name!r} points outside the archive; refusing to read it")


def _read_member(path, archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise ConversionError(path, f"the archive has no {name!r} (members: {archive.namelist()})") from None
    if info.file_size > limit:
        raise ConversionError(path, f"zip member {name!r} would decompress to {info.file_size} bytes (limit {limit})")
    if info.compress_size and info.file_size > MAX_COMPRESSION_RATIO * info.compress_size and info.file_size > 1 << 20:
        raise ConversionError(path, f"zip member {name!r} expands {info.file_size / info.compress_size:.0f}x "
                                    f"(limit {MAX_COMPRESSION_RATIO}x); refusing a possible zip bomb")
    with archive.open(info) as f:
        data = f.read(limit + 1)  # the header's size is not trusted either
    if len(data) > limit:
        raise ConversionError(path, f"zip member {name!r} decompresses beyond {limit} bytes")
    return data


def _json(path, data: bytes, what: str):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(path, f"{what} is not valid JSON: {e}") from None


def _open_h5(path, source):
    h5py = _h5py()
    try:
        return h5py.File(source, "r")
    except (OSError, ValueError) as e:
        raise ConversionError(path, f"not a readable HDF5 file ({e})") from None


def attr_str(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def attr_strings(group, name: str) -> List[str]:
    """A list-of-strings attribute, including Keras's chunked form (name0, name1, ...), which
    legacy .h5 files use when the list exceeds HDF5's attribute size limit."""
    if name in group.attrs:
        values = group.attrs[name]
    else:
        values, chunk = [], 0
        while f"{name}{chunk}" in group.attrs:
            values.extend(group.attrs[f"{name}{chunk}"])
            chunk += 1
        if chunk == 0:
            return []
    return [attr_str(v) for v in np.atleast_1d(values)]


def read_dataset(path, dataset, layer: str, expected_shape=None) -> np.ndarray:
    """A numeric dataset as a float array, with its shape and size checked before reading."""
    h5py = _h5py()
    if not isinstance(dataset, h5py.Dataset):
        raise ConversionError(path, f"expected a dataset at {dataset.name}, found a group", layer)
    shape = tuple(dataset.shape)
    if expected_shape is not None and shape != tuple(expected_shape):
        raise ConversionError(path, f"weight {dataset.name} has shape {shape}; the config implies {tuple(expected_shape)}", layer)
    if int(np.prod(shape, dtype=np.int64)) > MAX_DATASET_ELEMENTS:
        raise ConversionError(path, f"weight {dataset.name} declares {shape}, beyond the size limit", layer)
    if dataset.dtype.kind not in "fiu":
        raise ConversionError(path, f"weight {dataset.name} has non-numeric dtype {dataset.dtype}", layer)
    try:
        return np.asarray(dataset[()], dtype=np.float32 if dataset.dtype.kind != "f" or dataset.dtype.itemsize <= 4 else np.float64)
    except (OSError, ValueError) as e:
        raise ConversionError(path, f"weight {dataset.name} cannot be read ({e}); is the file truncated?", layer) from None


def open_keras_file(path) -> KerasFile:
    """Opens any Keras container. Weights-only files have config None."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ConversionError(path, f"cannot be opened ({e.strerror})") from None
    if head.startswith(b"PK"):
        return _open_keras_zip(path)
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return _open_h5_file(path, _open_h5(path, path))
    raise ConversionError(path, "is neither a .keras zip archive nor an HDF5 file (.h5 / .weights.h5)")


def _open_keras_zip(path) -> KerasFile:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ConversionError(path, f"is not a readable zip archive ({e}); is it truncated?") from None
    with archive:
        for name in archive.namelist():
            _check_member_name(path, name)
        config = _json(path, _read_member(path, archive, "config.json", MAX_CONFIG_BYTES), "config.json")
        metadata = {}
        if "metadata.json" in archive.namelist():
            metadata = _json(path, _read_member(path, archive, "metadata.json", MAX_CONFIG_BYTES), "metadata.json")
        if "model.weights.h5" not in archive.namelist():
            raise ConversionError(path, "the archive has no model.weights.h5 (npz-weight archives are not supported)")
        data = _read_member(path, archive, "model.weights.h5", MAX_MEMBER_BYTES)
    h5 = _open_h5(path, io.BytesIO(data))
    if not isinstance(config, dict) or "class_name" not in config:
        raise ConversionError(path, "config.json does not describe a Keras object (no class_name)")
    version = metadata.get("keras_version") if isinstance(metadata, dict) else None
    return KerasFile(path, config, version, h5, "keras3", h5)


def _open_h5_file(path, h5) -> KerasFile:
    config = None
    if "model_config" in h5.attrs:
        raw = h5.attrs["model_config"]
        config = _json(path, raw if isinstance(raw, bytes) else attr_str(raw).encode(), "the model_config attribute")
    version = attr_str(h5.attrs["keras_version"]) if "keras_version" in h5.attrs else None
    if "layer_names" in h5.attrs or "layer_names0" in h5.attrs:
        return KerasFile(path, config, version, h5, "legacy", h5)
    if "model_weights" in h5:
        group = h5["model_weights"]
        if version is None and "keras_version" in group.attrs:
            version = attr_str(group.attrs["keras_version"])
        return KerasFile(path, config, version, h5, "legacy", group)
    if "layers" in h5 or "_layer_checkpoint_dependencies" in h5 or "vars" in h5:
        # A .weights.h5 carries no version: this tree is Keras 3's, or tf.keras 2.13-2.15's
        # (which named it _layer_checkpoint_dependencies).
        if version is None:
            version = "2.13" if "_layer_checkpoint_dependencies" in h5 else "3"
        return KerasFile(path, config, version, h5, "keras3", h5)
    raise ConversionError(path, "is an HDF5 file but holds no Keras weights (no layer_names, model_weights or layers)")
