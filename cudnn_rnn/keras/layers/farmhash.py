"""String inputs and TensorFlow's FarmHash Fingerprint64 of strings, for the layers that take
strings (TextVectorization, StringLookup, Hashing, HashedCrossing): `strings_of` reads a string
input (a numpy array of str or bytes, or a nested list of them) and `fingerprint64` is FarmHash's
Fingerprint64 of a byte string, TensorFlow's `tf.fingerprint(..., "farmhash64")` and the hash of
`tf.strings.to_hash_bucket_fast`."""
from __future__ import annotations

import numpy as np
import torch

# FarmHash Fingerprint64 on Python integers (64-bit wrapping arithmetic: & _M). The Hashing
# layer's integer inputs take a vectorised form of its short cases (preprocessing.fingerprint64).
_M = (1 << 64) - 1
_K0, _K1, _K2 = 0xc3a5c85c97cb3127, 0xb492b66fbe98f273, 0x9ae16a3b2f90404f


def _rot(v, s):
    return ((v >> s) | (v << (64 - s))) & _M if s else v


def _f64(s, i):
    return int.from_bytes(s[i:i + 8], "little")


def _f32(s, i):
    return int.from_bytes(s[i:i + 4], "little")


def _shift_mix(v):
    return v ^ (v >> 47)


def _h16(u, v, mul=0x9ddfea08eb382d69):
    a = ((u ^ v) * mul) & _M
    a ^= a >> 47
    b = ((v ^ a) * mul) & _M
    b ^= b >> 47
    return (b * mul) & _M


def _len0to16(s, n):
    if n >= 8:
        mul = _K2 + n * 2
        a = (_f64(s, 0) + _K2) & _M
        b = _f64(s, n - 8)
        c = (_rot(b, 37) * mul + a) & _M
        d = ((_rot(a, 25) + b) * mul) & _M
        return _h16(c, d, mul)
    if n >= 4:
        mul = _K2 + n * 2
        return _h16((n + (_f32(s, 0) << 3)) & _M, _f32(s, n - 4), mul)
    if n > 0:
        y = s[0] + (s[n >> 1] << 8)
        z = n + (s[n - 1] << 2)
        return (_shift_mix(((y * _K2) ^ (z * _K0)) & _M) * _K2) & _M
    return _K2


def _mix_ends(s, n, ka):
    """The 17-64-byte cases' mix of the first 16 and the last 16 bytes (the first word times ka):
    (mul, a, the two halves HashLen16 takes)."""
    mul = _K2 + n * 2
    a = (_f64(s, 0) * ka) & _M
    b = _f64(s, 8)
    c = (_f64(s, n - 8) * mul) & _M
    d = (_f64(s, n - 16) * _K2) & _M
    return mul, a, (_rot((a + b) & _M, 43) + _rot(c, 30) + d) & _M, (a + _rot((b + _K2) & _M, 18) + c) & _M


def _len17to32(s, n):
    mul, _, u, v = _mix_ends(s, n, _K1)
    return _h16(u, v, mul)


def _len33to64(s, n):
    mul, a, y, v = _mix_ends(s, n, _K2)
    z = _h16(y, v, mul)
    e = (_f64(s, 16) * mul) & _M
    f = _f64(s, 24)
    g = ((y + _f64(s, n - 32)) * mul) & _M
    h = ((z + _f64(s, n - 24)) * mul) & _M
    return _h16((_rot((e + f) & _M, 43) + _rot(g, 30) + h) & _M, (e + _rot((f + a) & _M, 18) + g) & _M, mul)


def _weak32(s, i, a, b):
    w, x, y, z = _f64(s, i), _f64(s, i + 8), _f64(s, i + 16), _f64(s, i + 24)
    a = (a + w) & _M
    b = _rot((b + a + z) & _M, 21)
    c = a
    a = (a + x + y) & _M
    b = (b + _rot(a, 44)) & _M
    return (a + z) & _M, (b + c) & _M


def fingerprint64(s: bytes) -> int:
    """FarmHash's Fingerprint64 (farmhashna::Hash64) of a byte string: what TensorFlow's
    to_hash_bucket_fast takes modulo the bucket count (StringLookup's OOV indices)."""
    n = len(s)
    if n <= 16:
        return _len0to16(s, n)
    if n <= 32:
        return _len17to32(s, n)
    if n <= 64:
        return _len33to64(s, n)
    seed = 81
    x = seed
    y = (seed * _K1 + 113) & _M
    z = (_shift_mix((y * _K2 + 113) & _M) * _K2) & _M
    v, w = (0, 0), (0, 0)
    x = (x * _K2 + _f64(s, 0)) & _M
    end = ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    i = 0
    while True:
        x = (_rot((x + y + v[0] + _f64(s, i + 8)) & _M, 37) * _K1) & _M
        y = (_rot((y + v[1] + _f64(s, i + 48)) & _M, 42) * _K1) & _M
        x ^= w[1]
        y = (y + v[0] + _f64(s, i + 40)) & _M
        z = (_rot((z + w[0]) & _M, 33) * _K1) & _M
        v = _weak32(s, i, (v[1] * _K1) & _M, (x + w[0]) & _M)
        w = _weak32(s, i + 32, (z + w[1]) & _M, (y + _f64(s, i + 16)) & _M)
        z, x = x, z
        i += 64
        if i == end:
            break
    mul = _K1 + ((z & 0xff) << 1)
    i = last64
    w = ((w[0] + ((n - 1) & 63)) & _M, w[1])
    v = ((v[0] + w[0]) & _M, v[1])
    w = ((w[0] + v[0]) & _M, w[1])
    x = (_rot((x + y + v[0] + _f64(s, i + 8)) & _M, 37) * mul) & _M
    y = (_rot((y + v[1] + _f64(s, i + 48)) & _M, 42) * mul) & _M
    x ^= (w[1] * 9) & _M
    y = (y + v[0] * 9 + _f64(s, i + 40)) & _M
    z = (_rot((z + w[0]) & _M, 33) * mul) & _M
    v = _weak32(s, i, (v[1] * mul) & _M, (x + w[0]) & _M)
    w = _weak32(s, i + 32, (z + w[1]) & _M, (y + _f64(s, i + 16)) & _M)
    z, x = x, z
    return _h16((_h16(v[0], w[0], mul) + _shift_mix(y) * _K0 + z) & _M, (_h16(v[1], w[1], mul) + x) & _M, mul)


def strings_of(x, what: str) -> np.ndarray:
    """x as an array of Python str (bytes decoded as UTF-8): a numpy array of str, bytes or
    objects, or a nested list or tuple of str / bytes."""
    if isinstance(x, torch.Tensor):
        raise TypeError(f"{what} takes strings (a numpy array of str, or a list of them); got a tensor of {x.dtype}")
    array = np.asarray(x, dtype=object) if isinstance(x, (list, tuple)) else x
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "USO":
        got = f"an array of {array.dtype}" if isinstance(array, np.ndarray) else type(x).__name__
        raise TypeError(f"{what} takes strings (a numpy array of str, or a list of them); got {got}")
    out = np.empty(array.shape, dtype=object)
    for index, s in np.ndenumerate(array):
        if isinstance(s, bytes):
            try:
                s = s.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{what}: a string at {index} is not UTF-8") from None
        elif not isinstance(s, str):
            raise TypeError(f"{what} takes strings; the element at {index} is {type(s).__name__}")
        out[index] = s
    return out


def string_fingerprints(strings: np.ndarray) -> torch.Tensor:
    """fingerprint64 of each string's UTF-8 bytes, as the bits of an int64 tensor of its shape."""
    values = [fingerprint64(s.encode("utf-8")) for s in strings.reshape(-1)]
    return torch.tensor([v - (1 << 64) if v >> 63 else v for v in values], dtype=torch.int64).reshape(strings.shape)
