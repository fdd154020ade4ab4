"""Where a zip or HDF5 checkpoint's bytes become plain data (tf_formats.py does it for the TensorFlow
formats, in process: no native parser is involved there).

`parse(fobj, size, config_only)` reads a `.keras` zip or an HDF5 file (`.h5`, `.weights.h5`) and
returns `(header, blob)`: a JSON-able header (the config text, the version, the weights layout,
a .keras archive's lookup vocabularies (assets/**/vocabulary.txt, text) and, for every weight, its
name, dtype, shape and offset) and one buffer holding every weight's bytes. Nothing else of the file survives; `containers.py` turns the pair into a KerasFile, and
`isolation.py` runs this function in a helper process so that libhdf5 can neither hang nor crash
the user's process on a corrupted file.

Every failure, whatever library raised it, leaves as ParseError (the message names the object
inside the file). What is refused, before anything large is allocated:
- zip: members that are encrypted, not stored/deflated, listed twice, named outside the archive,
  larger than the file (stored) or expanding more than MAX_ZIP_RATIO (deflated), whatever the
  header claims: members are read in bounded chunks and the reading stops at the limit;
- HDF5: any link that is not a hard link (soft, external, user-defined), an object reached
  twice (hard-link cycles and aliases), datasets stored outside the file (external raw storage,
  virtual datasets), filtered (compressed) datasets, non-numeric dtypes (bfloat16 aside: a 2-byte
  HDF5 opaque type tagged dtype="bfloat16", as Keras 3 writes it), datasets whose declared
  size is not backed by bytes inside the file, and declared sizes that add up to more than the
  file holds;
- sizes and counts beyond the limits below (config text, names, objects, depth, vocabulary
  assets).
"""
from __future__ import annotations

import io
import posixpath
import struct
import zipfile
from collections import Counter
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..errors import few

MAX_CONFIG_BYTES = 16 << 20       # a Keras config of 1000 layers is about 2 MB of JSON
MAX_METADATA_BYTES = 1 << 20
MAX_MEMBER_BYTES = 8 << 30        # model.weights.h5
MAX_ASSETS = 64                   # assets/.../vocabulary.txt members read (lookup layers' vocabularies)
MAX_ASSET_BYTES = 16 << 20        # all of them together
MAX_ZIP_RATIO = 16                # deflated float weights shrink by < 1.3x; Keras stores members
ZIP_RATIO_FLOOR = 1 << 20         # below this, small members may compress as they like
MAX_NAMES = 100_000               # entries of layer_names / weight_names
MAX_OBJECTS = 200_000             # HDF5 groups and datasets visited
MAX_DEPTH = 64                    # HDF5 group nesting
MAX_NDIM = 8
ALIGN = 64                        # weights start at 64-byte offsets in the blob

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


class ParseError(Exception):
    """A file that cannot be read; `message` says what, `layer` which layer when known."""

    def __init__(self, message: str, layer: Optional[str] = None):
        super().__init__(message)
        self.message, self.layer = message, layer


def parse(fobj, size: int, config_only: bool = False) -> Tuple[dict, bytearray]:
    """(header, blob) of the checkpoint in the binary file object `fobj` of `size` bytes."""
    try:
        fobj.seek(0)
        head = fobj.read(8)
        fobj.seek(0)
        if head.startswith(b"PK"):
            return _parse_zip(fobj, size, config_only)
        if head.startswith(HDF5_MAGIC):
            return _H5(fobj, size).parse(config_only)
        if _looks_like_json(fobj.read(64)):
            return _parse_json_config(fobj, size, config_only)
        raise ParseError("is neither a .keras zip archive nor an HDF5 file (.h5 / .weights.h5)")
    except ParseError:
        raise
    except MemoryError:
        raise ParseError("reading it needs more memory than the parser may use; the file is corrupted "
                         "or declares sizes it does not hold") from None
    except RecursionError:
        raise ParseError("its structure nests too deeply") from None
    except Exception as e:  # noqa: BLE001 - the boundary: any library's failure is the file's
        raise ParseError(f"cannot be read ({type(e).__name__}: {_short(e)})") from None


def _looks_like_json(start: bytes) -> bool:
    return start.lstrip(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"{")


def _parse_json_config(fobj, size: int, config_only: bool) -> Tuple[dict, bytearray]:
    """A model config saved as JSON (`model.to_json()`): an architecture, no weights."""
    if not config_only:
        raise ParseError("holds a model config (JSON) and no weights: load the weights file with this as its "
                         "architecture (load_keras(WEIGHTS, architecture=...))")
    if size > MAX_CONFIG_BYTES:
        raise ParseError(f"the model config exceeds {MAX_CONFIG_BYTES} bytes")
    fobj.seek(0)
    try:
        text = fobj.read(MAX_CONFIG_BYTES + 1).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ParseError("looks like a JSON model config but is not UTF-8 text") from None
    return {"container": "json", "config": text, "layout": None}, bytearray()


def _short(e: BaseException, limit: int = 300) -> str:
    text = str(e)
    return text if len(text) <= limit else text[:limit] + "..."


# ------------------------------------------------------------------------------------------------
# zip (.keras)
# ------------------------------------------------------------------------------------------------
def _check_member_name(name: str) -> None:
    norm = posixpath.normpath(name)
    if (name.startswith("/") or norm.startswith("..") or "\\" in name or ":" in name.split("/")[0]
            or "\0" in name):
        raise ParseError(f"zip member {name!r} points outside the archive; refusing to read it")


def _read_member(archive: zipfile.ZipFile, size: int, name: str, limit: int) -> bytes:
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise ParseError(f"the archive has no {name!r} (members: {few(archive.namelist())})") from None
    if info.flag_bits & 0x1:
        raise ParseError(f"zip member {name!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ParseError(f"zip member {name!r} uses compression method {info.compress_type}; "
                         "a .keras archive stores or deflates its members")
    if info.compress_size > size:
        raise ParseError(f"zip member {name!r} claims {info.compress_size} bytes in a file of {size}")
    allowed = info.compress_size if info.compress_type == zipfile.ZIP_STORED else \
        max(ZIP_RATIO_FLOOR, MAX_ZIP_RATIO * info.compress_size)
    allowed = min(allowed, limit)
    if info.file_size > allowed:
        raise ParseError(f"zip member {name!r} would expand to {info.file_size} bytes (limit {allowed}: "
                         f"{MAX_ZIP_RATIO}x its compressed size, at most {limit}); refusing a possible zip bomb")
    chunks, total = [], 0
    try:
        with archive.open(info) as f:
            while True:  # bounded reads: the header's sizes are not trusted
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > allowed:
                    raise ParseError(f"zip member {name!r} decompresses beyond {allowed} bytes "
                                     f"(its header says {info.file_size}); refusing a possible zip bomb")
                chunks.append(chunk)
    except ParseError:
        raise
    except Exception as e:  # noqa: BLE001 - BadZipFile (CRC), zlib.error, EOFError, ...
        raise ParseError(f"zip member {name!r} cannot be read ({type(e).__name__}: {_short(e)}); "
                         "is the file truncated or corrupted?") from None
    return b"".join(chunks)


def _parse_zip(fobj, size: int, config_only: bool) -> Tuple[dict, bytearray]:
    try:
        archive = zipfile.ZipFile(fobj)
    except Exception as e:  # noqa: BLE001
        raise ParseError(f"is not a readable zip archive ({type(e).__name__}: {_short(e)}); is it truncated?") from None
    with archive:
        names = archive.namelist()
        for name in names:
            _check_member_name(name)
        twice = [n for n, c in Counter(names).items() if c > 1]
        if twice:
            raise ParseError(f"the archive holds {few(twice)} more than once")
        config = _text(_read_member(archive, size, "config.json", MAX_CONFIG_BYTES), "config.json")
        metadata = None
        if "metadata.json" in names:
            metadata = _text(_read_member(archive, size, "metadata.json", MAX_METADATA_BYTES), "metadata.json")
        if config_only:  # (the vocabularies too: the layers a config builds read them)
            return {"container": "zip", "config": config, "metadata": metadata, "keras_version": None,
                    "layout": None, "assets": _read_assets(archive, names, size)}, bytearray()
        if "model.weights.h5" not in names:
            raise ParseError("the archive has no model.weights.h5 (npz-weight archives are not supported)")
        data = _read_member(archive, size, "model.weights.h5", MAX_MEMBER_BYTES)
        assets = _read_assets(archive, names, size)
    if not data.startswith(HDF5_MAGIC):
        raise ParseError("model.weights.h5 in the archive is not an HDF5 file")
    header, blob = _H5(io.BytesIO(data), len(data), "model.weights.h5:", raw=data).parse(False)
    header.update(container="zip", config=config, metadata=metadata, layout="keras3", assets=assets)
    return header, blob


def _read_assets(archive, names, size: int) -> Dict[str, str]:
    """The lookup layers' vocabularies (assets/<layer path>/vocabulary.txt, UTF-8 text), bounded in
    count and total size; other assets are not read."""
    wanted = [n for n in names if n.startswith("assets/") and n.endswith("/vocabulary.txt")]
    if len(wanted) > MAX_ASSETS:
        raise ParseError(f"the archive holds {len(wanted)} vocabulary assets (limit {MAX_ASSETS})")
    assets, total = {}, 0
    for name in wanted:
        raw = _read_member(archive, size, name, MAX_ASSET_BYTES - total)
        total += len(raw)
        assets[name] = _text(raw, name)
    return assets


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParseError(f"{what} is not UTF-8 text ({e})") from None


# ------------------------------------------------------------------------------------------------
# HDF5
# ------------------------------------------------------------------------------------------------
def _check_global_heaps(fobj, size: int, prefix: str, raw: Optional[bytes]) -> None:
    """Refuses global heap collections (where variable-length strings such as model_config
    live) that libhdf5 would walk forever: a free-space object of size 0 before the end makes
    H5HG's deserializer stop advancing. The helper's time limit catches such loops anyway; this
    check names the cause at once, and also protects in-process parsing."""
    import mmap

    if raw is not None:
        data, close = raw, None
    else:
        if size == 0:
            return
        close = data = mmap.mmap(fobj.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        at = data.find(b"GCOL")
        while at >= 0:
            if data[at + 4:at + 5] == b"\x01":
                (total,) = struct.unpack_from("<Q", data, at + 8) if at + 16 <= size else (0,)
                end = at + total
                if 16 < total and end <= size:
                    p, steps = at + 16, 0
                    while p + 16 <= end and steps < 1 << 20:
                        idx, _, _, length = struct.unpack_from("<HHIQ", data, p)
                        if idx == 0 and length == 0:
                            raise ParseError(f"{prefix}the global heap collection at byte {at} is corrupted (an "
                                             "empty free-space object, on which libhdf5 loops forever)")
                        need = length if idx == 0 else 16 + ((length + 7) & ~7)
                        if need <= 0 or need > end - p:
                            break
                        p, steps = p + need, steps + 1
            at = data.find(b"GCOL", at + 4)
    finally:
        if close is not None:
            close.close()


class _H5:
    """One HDF5 file, walked through hard links only, every dataset checked before it is read."""

    def __init__(self, fobj, size: int, prefix: str = "", raw: Optional[bytes] = None):
        import h5py

        self.h5py, self.size, self.prefix = h5py, size, prefix
        self.where = "/"
        _check_global_heaps(fobj, size, prefix, raw)
        try:
            self.file = h5py.File(fobj, "r")
        except Exception as e:  # noqa: BLE001
            raise ParseError(f"{prefix or 'the file'} is not a readable HDF5 file ({type(e).__name__}: {_short(e)})") from None
        self.seen: set = set()
        self.resolved: Dict[str, object] = {}   # intermediate groups of weight paths, by path
        self.objects = 0
        self.entries: List[list] = []      # [key, dsid, dtype, shape, nbytes, memory type or None]
        self.declared = 0

    # -- failures name the object they were reading ---------------------------------------------
    def parse(self, config_only: bool) -> Tuple[dict, bytearray]:
        try:
            return self._parse(config_only)
        except ParseError as e:
            if self.where != "/" and " at " not in e.message:
                e.message = f"{e.message} (at {self.prefix}{self.where})"
                e.args = (e.message,)
            raise
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ParseError(f"the HDF5 structure is corrupted at {self.prefix}{self.where} "
                             f"({type(e).__name__}: {_short(e)})") from None
        finally:
            try:
                self.file.close()
            except Exception:  # noqa: BLE001 - closing a corrupted file may fail too
                pass

    def _parse(self, config_only: bool) -> Tuple[dict, bytearray]:
        root = self.file.id
        config = self._attr_text(root, "/", "model_config")
        version = self._attr_text(root, "/", "keras_version")
        header = {"container": "h5", "config": config, "metadata": None, "keras_version": version,
                  "backend": self._backend(root, "/")}
        if config_only:
            header["layout"] = None
            return header, bytearray()
        weights_root, where = root, ""
        legacy = self._has_attr(root, "/", "layer_names") or self._has_attr(root, "/", "layer_names0")
        if not legacy:
            model_weights = self._child(root, "", "model_weights")
            if model_weights is not None:
                if self._kind(model_weights) != "group":
                    raise ParseError("model_weights is not a group")
                weights_root, where, legacy = model_weights, "model_weights", True
                if version is None:
                    header["keras_version"] = self._attr_text(weights_root, where, "keras_version")
                if header["backend"] is None:
                    header["backend"] = self._backend(weights_root, where)
        if legacy:
            header.update(layout="legacy", **self._legacy(weights_root, where))
        else:
            tops = [n for n in ("layers", "_layer_checkpoint_dependencies", "vars") if self._exists(root, n)]
            flat = [] if any(n != "vars" for n in tops) else self._backslash_paths(root)
            if not tops and not flat:
                raise ParseError("is an HDF5 file but holds no Keras weights (no layer_names, model_weights or layers)")
            if header["keras_version"] is None:
                # A .weights.h5 carries no version: this tree is Keras 3's, or tf.keras
                # 2.13-2.14's (which named it _layer_checkpoint_dependencies).
                tree_names = tops + [n.split("\\", 1)[0] for n in flat]
                header["keras_version"] = "2.13" if "_layer_checkpoint_dependencies" in tree_names else "3"
            groups: List[str] = []
            for name in tops:
                obj = self._child(root, "", name)
                if self._kind(obj) == "group":
                    self._walk(obj, name, 1, groups)
            for name in flat:
                obj = self._child(root, "", name)
                if self._kind(obj) == "group":
                    self._walk(obj, name.replace("\\", "/"), 1 + name.count("\\"), groups)
            header.update(layout="keras3", groups=groups)
        return header, self._read_all(header)

    def _backslash_paths(self, root) -> List[str]:
        """The weight groups of a .keras file that tf.keras 2.13-2.15 wrote on Windows: it joined
        the tree's paths with os.path.join, so every group sits at the root under a name such as
        `_layer_checkpoint_dependencies\\lstm\\cell` (its datasets below it as usual). Their names,
        sorted; the walk reads them as the '/'-separated tree they stand for."""
        out = []
        for raw in self._link_names(root, "/"):
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue  # not a name Keras writes
            if name.split("\\", 1)[0] in ("layers", "_layer_checkpoint_dependencies") and "\\" in name:
                out.append(name)
        return sorted(out)

    # -- links and objects ------------------------------------------------------------------------
    def _exists(self, gid, name: str) -> bool:
        return bool(gid.links.exists(name.encode("utf-8")))

    def _child(self, gid, path: str, name: str, once: bool = True):
        """The object `name` (one path component) in group `gid`, through a hard link only;
        None if there is no such link. With `once`, an object reached before is refused."""
        self.where = f"{path}/{name}" if path else name
        if not name or name in (".", "..") or "/" in name:
            raise ParseError(f"invalid HDF5 name {name!r}")
        bname = name.encode("utf-8")
        if not gid.links.exists(bname):
            return None
        h5l = self.h5py.h5l
        info = gid.links.get_info(bname)
        if info.type == h5l.TYPE_SOFT:
            raise ParseError(f"{self.where} is a soft link; Keras files hold plain (hard) links only")
        if info.type == h5l.TYPE_EXTERNAL:
            raise ParseError(f"{self.where} is an external link to another file; a checkpoint must be "
                             "self-contained and is never allowed to read other files")
        if info.type != h5l.TYPE_HARD:
            raise ParseError(f"{self.where} is a user-defined link (type {info.type}); refusing it")
        self.objects += 1
        if self.objects > MAX_OBJECTS:
            raise ParseError(f"holds more than {MAX_OBJECTS} objects")
        obj = self.h5py.h5o.open(gid, bname)
        if once:
            self._once(obj)
        return obj

    def _once(self, obj) -> None:
        addr = self.h5py.h5o.get_info(obj).addr
        if addr in self.seen:
            raise ParseError(f"{self.where} is an object already reached by another link (a cycle or an "
                             "alias); Keras never links an object twice")
        self.seen.add(addr)

    def _resolve(self, gid, path: str, relative: str):
        """A '/'-separated path below gid, component by component (hard links only)."""
        parts = relative.split("/")
        obj = gid
        for i, part in enumerate(parts):
            child = f"{path}/{part}" if path else part
            cached = self.resolved.get(child) if i < len(parts) - 1 else None
            if cached is not None:  # weight names share their leading groups
                obj, path = cached, child
                continue
            if i and self._kind(obj) != "group":
                raise ParseError(f"{self.where} is not a group")
            obj = self._child(obj, path, part, once=False)
            if obj is None:
                return None
            path = child
            if i < len(parts) - 1:
                self.resolved[child] = obj
        if self._kind(obj) == "dataset":  # a dataset listed twice would be read twice
            self._once(obj)
        return obj

    def _link_names(self, gid, path: str) -> List[bytes]:
        """The names of a group's links, stopping past MAX_OBJECTS of them."""
        names: List[bytes] = []

        def collect(name):
            names.append(name)
            return 1 if len(names) > MAX_OBJECTS else None

        self.where = path
        gid.links.iterate(collect)
        return names

    def _kind(self, obj) -> str:
        h5i = self.h5py.h5i
        t = h5i.get_type(obj)
        return "group" if t == h5i.GROUP else "dataset" if t == h5i.DATASET else "other"

    def _walk(self, gid, path: str, depth: int, groups: List[str]) -> None:
        if depth > MAX_DEPTH:
            raise ParseError(f"groups nest deeper than {MAX_DEPTH} levels")
        groups.append(path)
        for raw in self._link_names(gid, path):
            obj = self._child(gid, path, raw.decode("utf-8"))
            child = f"{path}/{raw.decode('utf-8')}"
            kind = self._kind(obj)
            if kind == "group":
                self._walk(obj, child, depth + 1, groups)
            elif kind == "dataset":
                self._add_dataset(obj, child)

    # -- attributes -------------------------------------------------------------------------------
    def _has_attr(self, oid, path: str, name: str) -> bool:
        self.where = f"{path}@{name}"
        return bool(self.h5py.h5a.exists(oid, name.encode()))

    def _attr_value(self, oid, path: str, name: str):
        if not self._has_attr(oid, path, name):
            return None
        attr = self.h5py.h5a.open(oid, name.encode())
        space = attr.get_space()
        if space.get_simple_extent_type() == self.h5py.h5s.NULL:
            raise ParseError(f"attribute {path}@{name} is empty")
        npoints = space.get_simple_extent_npoints()
        if npoints > MAX_NAMES:
            raise ParseError(f"attribute {path}@{name} holds {npoints} values (limit {MAX_NAMES})")
        dtype = attr.dtype
        if npoints == 0:  # Keras writes an empty float array for a layer without weights
            return np.empty((0,), dtype=object)
        if npoints * dtype.itemsize > MAX_CONFIG_BYTES:
            raise ParseError(f"attribute {path}@{name} declares {npoints * dtype.itemsize} bytes (limit {MAX_CONFIG_BYTES})")
        if dtype.kind != "S" and not (dtype.kind == "O" and self.h5py.check_string_dtype(dtype) is not None):
            raise ParseError(f"attribute {path}@{name} is not text (dtype {dtype})")
        arr = np.empty(attr.shape, dtype=dtype)
        attr.read(arr)
        return arr

    def _decode(self, value, what: str) -> str:
        if isinstance(value, (bytes, np.bytes_)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ParseError(f"{what} is not UTF-8 text ({e})") from None
        if isinstance(value, str):
            return value
        raise ParseError(f"{what} is not text")

    def _backend(self, oid, path: str) -> Optional[str]:
        """The backend attribute Keras writes beside keras_version (informative: None where it
        is missing or not one short string)."""
        try:
            text = self._attr_text(oid, path, "backend")
        except ParseError:
            return None
        return text if text is not None and len(text) <= 40 else None

    def _attr_text(self, oid, path: str, name: str) -> Optional[str]:
        arr = self._attr_value(oid, path, name)
        if arr is None:
            return None
        if arr.size != 1:
            raise ParseError(f"attribute {path}@{name} is not one string")
        text = self._decode(arr.reshape(-1)[0], f"attribute {path}@{name}")
        if len(text) > MAX_CONFIG_BYTES:
            raise ParseError(f"attribute {path}@{name} exceeds {MAX_CONFIG_BYTES} bytes")
        return text

    def _attr_names(self, oid, path: str, name: str) -> List[str]:
        """A list-of-strings attribute, including Keras's chunked form (name0, name1, ...),
        which legacy .h5 files use when the list exceeds HDF5's attribute size limit."""
        arrays = []
        value = self._attr_value(oid, path, name)
        if value is not None:
            arrays.append(value)
        else:
            chunk = 0
            while chunk <= MAX_NAMES:
                value = self._attr_value(oid, path, f"{name}{chunk}")
                if value is None:
                    break
                arrays.append(value)
                chunk += 1
        names = [self._decode(v, f"attribute {path}@{name}") for a in arrays for v in a.reshape(-1)]
        if len(names) > MAX_NAMES:
            raise ParseError(f"attribute {path}@{name} lists {len(names)} names (limit {MAX_NAMES})")
        twice = [n for n, c in Counter(names).items() if c > 1]
        if twice:
            raise ParseError(f"attribute {path}@{name} lists {few(twice)} more than once")
        return names

    # -- the legacy layout ------------------------------------------------------------------------
    def _legacy(self, root, path: str) -> dict:
        layer_names = self._attr_names(root, path or "/", "layer_names")
        layer_weights: Dict[str, List[list]] = {}
        for layer in layer_names:
            group = self._resolve(root, path, layer) if layer else None
            if group is None or self._kind(group) != "group":
                raise ParseError(f"layer_names lists {layer!r} but the file has no such group", layer)
            gpath = f"{path}/{layer}" if path else layer
            weights = []
            for w in self._attr_names(group, gpath, "weight_names"):
                dset = self._resolve(group, gpath, w) if w else None
                if dset is None or self._kind(dset) != "dataset":
                    raise ParseError(f"weight_names lists {w!r} but {gpath} has no such dataset", layer)
                weights.append([w, self._add_dataset(dset, f"{gpath}/{w}")])
            layer_weights[layer] = weights
        return {"layer_names": layer_names, "layer_weights": layer_weights}

    # -- datasets ---------------------------------------------------------------------------------
    def _add_dataset(self, dsid, key: str) -> int:
        """Checks a dataset's declared storage before anything is read; returns its entry index."""
        h5d = self.h5py.h5d
        self.where = key
        dcpl = dsid.get_create_plist()
        layout = dcpl.get_layout()
        if layout == getattr(h5d, "VIRTUAL", 3):
            raise ParseError(f"weight {key} is a virtual dataset (its data lives in other files); refusing it")
        if dcpl.get_external_count() > 0:
            raise ParseError(f"weight {key} keeps its data in external files; a checkpoint must be self-contained")
        if dcpl.get_nfilters() > 0:
            raise ParseError(f"weight {key} is stored through HDF5 filters (compression); Keras writes weights "
                             "unfiltered, and a filtered dataset's size cannot be bounded before it is read")
        if layout not in (h5d.COMPACT, h5d.CONTIGUOUS, h5d.CHUNKED):
            raise ParseError(f"weight {key} has an unknown storage layout {layout}")
        dtype = dsid.dtype
        # Keras 3 stores a bfloat16 variable as 2-byte opaque data tagged dtype="bfloat16" (HDF5 has
        # no bfloat16): read with the file's own type as its 16-bit patterns, widened to float32 by
        # the reader (containers.py). Told by the HDF5 type: h5py takes an opaque type's numpy
        # dtype from its tag, which a file can set to anything.
        ftype = dsid.get_type()
        opaque16 = ftype.get_class() == self.h5py.h5t.OPAQUE and ftype.get_size() == 2 \
            and self._attr_text(dsid, key, "dtype") == "bfloat16"
        self.where = key
        mtype = ftype if opaque16 else None
        if opaque16:
            dtype = np.dtype("u2")
        elif dtype.kind not in "fiu" or dtype.itemsize not in ((2, 4, 8) if dtype.kind == "f" else (1, 2, 4, 8)) \
                or dtype.names is not None or dtype.subdtype is not None:
            raise ParseError(f"weight {key} has non-numeric dtype {dtype}")
        space = dsid.get_space()
        if space.get_simple_extent_type() == self.h5py.h5s.NULL:
            raise ParseError(f"weight {key} has no data (null dataspace)")
        shape = tuple(int(d) for d in space.shape)
        if len(shape) > MAX_NDIM:
            raise ParseError(f"weight {key} has {len(shape)} dimensions (limit {MAX_NDIM})")
        nbytes = dtype.itemsize
        for d in shape:
            nbytes *= d
        stored = int(dsid.get_storage_size())
        if nbytes > self.size or stored > self.size:
            raise ParseError(f"weight {key} declares {shape} ({nbytes} bytes) in a file of {self.size} bytes")
        if nbytes > stored:
            raise ParseError(f"weight {key} declares {shape} ({nbytes} bytes) but stores only {stored}; "
                             "the file is truncated or corrupted")
        if layout == h5d.CONTIGUOUS and nbytes:
            offset = dsid.get_offset()
            if offset is None or offset + nbytes > self.size:
                raise ParseError(f"weight {key} points past the end of the file")
        self.declared += nbytes
        if self.declared > self.size:
            raise ParseError(f"the weights declare {self.declared} bytes, more than the file's {self.size}: "
                             "datasets overlap or the file is corrupted")
        self.entries.append([key, dsid, dtype.newbyteorder("="), shape, nbytes, mtype])
        return len(self.entries) - 1

    def _read_all(self, header: dict) -> bytearray:
        offsets, total = [], 0
        for entry in self.entries:
            offsets.append(total)
            total += -(-entry[4] // ALIGN) * ALIGN
        blob = bytearray(total)
        listing = []
        for (key, dsid, dtype, shape, nbytes, mtype), offset in zip(self.entries, offsets):
            self.where = key
            count = nbytes // dtype.itemsize
            out = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
            if count:
                if mtype is not None and mtype.get_size() != out.dtype.itemsize:  # (h5py does not check it)
                    raise ParseError(f"weight {key} changed its element size between the checks and the read")
                try:
                    dsid.read(self.h5py.h5s.ALL, self.h5py.h5s.ALL, out, mtype=mtype)
                except Exception as e:  # noqa: BLE001
                    raise ParseError(f"weight {key} cannot be read ({type(e).__name__}: {_short(e)}); "
                                     "is the file truncated?") from None
            listing.append([key, "bfloat16" if mtype is not None else dtype.str, list(shape), offset])
        header["arrays"] = listing
        return blob
