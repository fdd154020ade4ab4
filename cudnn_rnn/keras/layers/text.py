"""The string layers: TextVectorization and StringLookup, their modules and their builders.

A model whose input is a string tensor takes, in that input's place, the strings themselves: a
numpy array of str or bytes (the shape Keras declares, batch first), or a nested list of them.
They are turned into the integer ids (or encoded counts) Keras computes, as TensorFlow's string
kernels do it: lowercasing and whitespace are ASCII's only (`tf.strings.lower` leaves "Ü" as it
is; `tf.strings.split` keeps a no-break space inside its token), punctuation is Keras's
DEFAULT_STRIP_REGEX, n-grams joined by a space, shorter rows padded with the mask id 0. What
follows them is tensors; a model with a string input cannot be exported (its first operation is
not a tensor operation).

The vocabulary is the layer's config or its .keras asset (a legacy .h5 keeps none); tf_idf
multiplies the counts by the file's idf_weights. Not converted, each with an error naming it:
ragged or sparse outputs, StringLookup's invert (strings out), and a custom standardize or split
function (Python code). Several OOV indices take a token's FarmHash Fingerprint64 (farmhash.py)
modulo their count, as TensorFlow's to_hash_bucket_fast; with a salt, its SipHash-2-4 keyed by the
salt (preprocessing.py), as to_hash_bucket_strong."""
from __future__ import annotations

import re
from typing import List, Optional, Sequence

import numpy as np
import torch

from .base import _Single
from .farmhash import fingerprint64, strings_of
from .preprocessing import NO_VOCABULARY, encode_categorical, lookup_counts_dtype, salt_key, string_siphash
from .registry import builder
from .values import MAX_SIZE, Values

# Keras's DEFAULT_STRIP_REGEX (",-." is the range , - .)
_PUNCTUATION = re.compile(r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']')
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_SPACE = re.compile(r"[ \t\n\v\f\r]+")


class _Vocabulary:
    """A lookup table over strings, indexed as Keras's StringLookup indexes them: in output_mode
    "int" the mask token (if any) at 0, then the OOV index (if any), then the vocabulary; in the
    other modes the mask token is no index (it counts nowhere) and the OOV index is the first."""

    def __init__(self, tokens: Sequence[str], mask_token: Optional[str], num_oov: int, int_mode: bool,
                 oov_token: str = "[UNK]", salt: Optional[tuple] = None):
        self.mask_token, self.num_oov, self.oov_token, self.tokens = mask_token, num_oov, oov_token, list(tokens)
        self.salt = salt
        self.masked = 1 if mask_token is not None and int_mode else 0
        self.first = self.masked + num_oov
        self.index = {t: self.first + i for i, t in enumerate(tokens)}
        self.size = self.first + len(tokens)

    def lines(self) -> List[str]:
        """The vocabulary asset Keras writes: the special tokens it indexes, then the tokens."""
        return [self.mask_token] * self.masked + [self.oov_token] * self.num_oov + self.tokens

    def id(self, token: str) -> int:
        if token == self.mask_token:
            return 0 if self.masked else -1
        got = self.index.get(token)
        if got is not None:
            return got
        # one OOV index: it; several: the token's FarmHash (with a salt, its SipHash) modulo their
        # count; none: TensorFlow's table default, -1 (where Keras asserts)
        if self.num_oov > 1:
            if self.salt is None:
                return self.masked + fingerprint64(token.encode("utf-8")) % self.num_oov
            hashed = int(string_siphash(np.array([token], dtype=object), self.salt)[0]) & ((1 << 64) - 1)
            return self.masked + hashed % self.num_oov
        return self.masked if self.num_oov else -1


class _Strings(_Single):
    """A string layer: its outputs are made on the device the module is moved to, encoded rows in
    `dtype` (lookup_counts_dtype: the floating dtype, which .to() moves, or Keras 3's int64)."""

    keeps_mask = False

    def __init__(self, vocabulary: _Vocabulary, mode: str, depth: int, dtype: torch.dtype,
                 idf: Optional[torch.Tensor] = None):
        super().__init__()
        self.vocabulary, self.mode, self.depth = vocabulary, mode, depth
        self.register_buffer("anchor", torch.zeros(0, dtype=dtype), persistent=False)  # (device and dtype)
        # tf_idf: the inverse document frequency of each index (a weight of the file, not trained)
        self.register_buffer("idf", idf.to(dtype) if idf is not None else None)

    def keras_groups(self):  # (save_keras) Keras stores the weights by name, for the layer and its lookup
        if self.idf is None:
            return []
        return [(sub, [("idf_weights", self.idf)]) for sub in getattr(self, "asset_dirs", ("",))]

    def asset_lines(self) -> List[str]:  # (writers/export.py: save_keras writes the vocabulary back)
        return self.vocabulary.lines()

    def _ids(self, rows) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64).to(self.anchor.device)

    def _encoded(self, ids: torch.Tensor) -> torch.Tensor:
        if self.mode == "tf_idf":
            return encode_categorical(ids, "count", self.depth, self.anchor.dtype) * self.idf
        return encode_categorical(ids, self.mode, self.depth, self.anchor.dtype)


class StringLookup(_Strings):
    """keras.layers.StringLookup: each string's index (the mask token at 0 in output_mode
    "int", then the OOV index, then the vocabulary), encoded as output_mode says."""

    def apply(self, x):
        strings = strings_of(x, "StringLookup")
        ids = self._ids([self.vocabulary.id(s) for s in strings.reshape(-1)]).reshape(strings.shape)
        return ids if self.mode == "int" else self._encoded(ids)

    def extra_repr(self):
        return f"{self.vocabulary.size} ids, output_mode={self.mode!r}"


class TextVectorization(_Strings):
    """keras.layers.TextVectorization: each string standardized, split into tokens, n-grams
    added, and looked up (StringLookup's indices); output_mode "int" gives each row's ids padded
    with 0 (or cut) to output_sequence_length, or to the longest row; multi_hot and count give
    one column per index, tf_idf the counts times each index's idf weight."""

    asset_dirs = ("", "_lookup_layer")  # Keras writes its vocabulary for it and its inner StringLookup

    def __init__(self, vocabulary: _Vocabulary, standardize: Optional[str], split: Optional[str],
                 ngrams: Sequence[int], mode: str, length: Optional[int], depth: int, dtype: torch.dtype,
                 idf: Optional[torch.Tensor] = None):
        super().__init__(vocabulary, mode, depth, dtype, idf)
        self.standardize, self.split, self.ngrams, self.length = standardize, split, tuple(ngrams), length

    def tokens(self, s: str) -> List[str]:
        if self.standardize in ("lower", "lower_and_strip_punctuation"):
            s = s.translate(_ASCII_LOWER)
        if self.standardize in ("strip_punctuation", "lower_and_strip_punctuation"):
            s = _PUNCTUATION.sub("", s)
        if self.split == "whitespace":
            words = [w for w in _ASCII_SPACE.split(s) if w]
        elif self.split == "character":
            words = list(s)
        else:
            words = [s]
        if not self.ngrams:
            return words
        return [" ".join(words[i:i + n]) for n in self.ngrams for i in range(len(words) - n + 1)]

    def apply(self, x):
        strings = strings_of(x, "TextVectorization")
        if self.split is None:  # no split: the strings are the tokens, in the input's own shape
            if strings.ndim != 2:
                raise ValueError(f"TextVectorization without split takes [batch, n] strings; got shape "
                                 f"{list(strings.shape)}")
            ids = [self.vocabulary.id(self.tokens(s)[0]) for s in strings.reshape(-1)]
            if self.mode != "int":
                return self._encoded(self._ids(ids).reshape(strings.shape))
            rows, longest = np.array(ids, dtype=np.int64).reshape(strings.shape).tolist(), strings.shape[1]
        else:
            if strings.ndim == 2 and strings.shape[1] == 1:
                strings = strings[:, 0]
            if strings.ndim != 1:
                raise ValueError(f"TextVectorization takes a batch of strings ([batch] or [batch, 1]); got shape "
                                 f"{list(strings.shape)}")
            rows = [[self.vocabulary.id(t) for t in self.tokens(s)] for s in strings]
            longest = max((len(r) for r in rows), default=0)
        if self.mode == "int":  # padded with the mask id 0, or cut
            width = self.length if self.length is not None else longest
            return self._ids([r[:width] + [0] * (width - len(r[:width])) for r in rows]).reshape(len(rows), width)
        # counts over each row's tokens: row b's ids, padded with -1 (no class)
        width = longest
        if width == 0:  # no tokens in any row (or no rows)
            return torch.zeros(len(rows), self.depth, dtype=self.anchor.dtype, device=self.anchor.device)
        return self._encoded(self._ids([r + [-1] * (width - len(r)) for r in rows]).reshape(len(rows), width))

    def extra_repr(self):
        return (f"{self.vocabulary.size} ids, standardize={self.standardize!r}, split={self.split!r}, "
                f"output_mode={self.mode!r}")


def _vocabulary(cfg, ctx, mask_token: Optional[str], num_oov: int, oov_token: str) -> List[str]:
    """The layer's vocabulary: its config's list, or its .keras asset's lines (special tokens
    first), without the leading special tokens."""
    name = ctx.spec.class_name
    vocabulary = cfg.get("vocabulary")
    special = ([mask_token] if mask_token is not None else []) + [oov_token] * num_oov
    if vocabulary is None:
        vocabulary = ctx.weights.vocabulary()
        if vocabulary is None:
            raise ctx.error(f"{name}'s vocabulary {NO_VOCABULARY}")
        if vocabulary[:len(special)] != special:
            raise ctx.error(f"{name}'s vocabulary asset does not begin with its special tokens {special}")
    elif isinstance(vocabulary, str):
        raise ctx.error(f"{name}'s vocabulary is a file path in the config; the file is not part of the model")
    if not isinstance(vocabulary, list) or len(vocabulary) > MAX_SIZE or not all(isinstance(t, str) for t in vocabulary):
        raise ctx.error(f"{name} vocabulary {str(vocabulary)[:60]!r} is not a list of strings")
    if special and vocabulary[:len(special)] == special:  # Keras drops leading special tokens
        vocabulary = vocabulary[len(special):]
    if len(set(vocabulary)) != len(vocabulary) or set(vocabulary) & set(special):
        raise ctx.error(f"{name} vocabulary holds a token twice")
    return vocabulary


def _lookup_args(cfg, ctx, v: Values, mode: str, mask_default: Optional[str]):
    name = ctx.spec.class_name
    if v.bool("sparse", False) or v.bool("ragged", False):
        raise ctx.error(f"{name} with sparse or ragged outputs is not supported (dense outputs only)")
    num_oov = v.int("num_oov_indices", 1, lo=0, hi=1 << 16)
    salt = salt_key(cfg, ctx)
    if v.str("encoding", "utf-8").lower().replace("_", "-") not in ("utf-8", "utf8"):
        raise ctx.error(f"{name} encoding={cfg.get('encoding')!r} is not supported (utf-8)")
    mask_token = cfg["mask_token"] if "mask_token" in cfg else mask_default
    if mask_token is not None and not isinstance(mask_token, str):
        raise ctx.error(f"{name} mask_token={str(mask_token)[:30]!r}; expected a string or null")
    oov_token = v.str("oov_token", "[UNK]")
    tokens = _vocabulary(cfg, ctx, mask_token if mode == "int" else None, num_oov, oov_token)
    table = _Vocabulary(tokens, mask_token, num_oov, mode == "int", oov_token, salt)
    depth = v.int("max_tokens", lo=1) if v.bool("pad_to_max_tokens", False) and mode != "int" else table.size
    if depth < table.size:
        raise ctx.error(f"{name} max_tokens={depth} is below its {table.size} indices")
    idf = None
    if mode == "tf_idf":  # the weights file's idf_weights: one per index (the padding's 0 included)
        (weights,) = ctx.weights.take([("", 1)])
        idf = np.asarray(weights[0])
        if idf.shape != (depth,) or not np.all(np.isfinite(idf)):
            raise ctx.error(f"{name} idf_weights have shape {idf.shape}; its {depth} indices imply ({depth},), finite")
        idf = torch.as_tensor(idf.astype(np.float64))
    return table, depth, idf


def _tf_idf(cfg) -> bool:
    return cfg.get("output_mode") == "tf_idf"  # its idf_weights are the layer's one weight


@builder("StringLookup", weights=_tf_idf)
def build_string_lookup(cfg, ctx):
    v = Values(cfg, ctx)
    if v.bool("invert", False):
        raise ctx.error("StringLookup invert=True is not supported (it gives strings, which tensors cannot hold)")
    mode = v.str("output_mode", "int", ("int", "one_hot", "multi_hot", "count", "tf_idf"))
    table, depth, idf = _lookup_args(cfg, ctx, v, mode, None)
    return StringLookup(table, mode, depth, lookup_counts_dtype(ctx, mode), idf)


@builder("TextVectorization", weights=_tf_idf)
def build_text_vectorization(cfg, ctx):
    v = Values(cfg, ctx)
    mode = v.str("output_mode", "int", ("int", "multi_hot", "count", "tf_idf"))
    standardize, split = cfg.get("standardize", "lower_and_strip_punctuation"), cfg.get("split", "whitespace")
    if standardize not in (None, "lower", "strip_punctuation", "lower_and_strip_punctuation"):
        raise ctx.error(f"TextVectorization standardize={str(standardize)[:40]!r} is not supported (a function of "
                        "your own is Python code, which is not run here)")
    if split not in (None, "whitespace", "character"):
        raise ctx.error(f"TextVectorization split={str(split)[:40]!r} is not supported (a function of your own is "
                        "Python code, which is not run here)")
    ngrams = cfg.get("ngrams")
    if ngrams is None:
        widths = []
    elif isinstance(ngrams, int) and not isinstance(ngrams, bool) and 1 <= ngrams <= 64:
        widths = list(range(1, ngrams + 1))
    elif isinstance(ngrams, list) and 0 < len(ngrams) <= 64 and all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 64 for n in ngrams):
        widths = list(ngrams)
    else:
        raise ctx.error(f"TextVectorization ngrams={str(ngrams)[:40]!r}; expected null, an integer or a list of them")
    if widths and split is None:
        raise ctx.error("TextVectorization with ngrams and no split is not supported (n-grams of a row's strings)")
    length = v.int("output_sequence_length", None, lo=0) if mode == "int" else None
    table, depth, idf = _lookup_args(cfg, ctx, v, mode, "")
    return TextVectorization(table, standardize, split, widths, mode, length, depth, lookup_counts_dtype(ctx, mode),
                             idf)
