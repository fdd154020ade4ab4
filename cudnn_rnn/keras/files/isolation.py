"""Running untrusted.parse in a helper process, so that a corrupted file cannot hang or crash the
user's process inside libhdf5 (which loops forever on some corrupted metadata and is not written
to survive hostile input), and cannot make it allocate without bound.

The helper is forked once, on first use, and serves one request at a time over a socketpair: the
parent opens the file (so paths, permissions and the working directory are its own) and passes
the descriptor; the helper answers with the header (JSON) and the weights' bytes, through a framing
of our own (nothing is pickled). Each request runs under
- a time limit, PARSE_TIMEOUT_S plus a second per PARSE_RATE bytes of file (the environment
  variable CUDNN_RNN_PARSE_TIMEOUT sets the base): past it the helper is killed and the load
  fails with ConversionError;
- an address-space limit of the helper's size at the request plus 256 MiB plus 3x the file, so a
  runaway allocation fails inside the helper.
A helper that dies (a crash in libhdf5) or times out is replaced on the next request. Where
os.fork does not exist (Windows) or CUDNN_RNN_PARSE_IN_PROCESS=1 is set, parse runs in-process,
without these bounds.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import threading
import time
import warnings
from typing import Optional, Tuple

from .untrusted import ALIGN, MAX_CONFIG_BYTES, MAX_ZIP_RATIO, ParseError, parse

PARSE_TIMEOUT_S = 5.0
PARSE_RATE = 10 << 20            # bytes per second of extra time allowed for large files
MEMORY_BASE = 256 << 20
BIG_REPLY = 64 << 20             # a helper that sent or grew by this much exits, returning its memory
_FRAME = struct.Struct("<Q")


def in_process() -> bool:
    return not hasattr(os, "fork") or os.environ.get("CUDNN_RNN_PARSE_IN_PROCESS", "") not in ("", "0")


def timeout_for(size: int) -> float:
    base = os.environ.get("CUDNN_RNN_PARSE_TIMEOUT")
    try:
        base_s = float(base) if base else PARSE_TIMEOUT_S
    except ValueError:
        raise ValueError(f"CUDNN_RNN_PARSE_TIMEOUT must be a number of seconds; got {base!r}") from None
    return base_s + size / PARSE_RATE


class _Restart(Exception):
    pass


def parse_file(f, size: int, config_only: bool) -> Tuple[dict, bytearray]:
    """(header, blob) of the open binary file f: in the helper, or in-process (see module doc)."""
    if in_process():
        return parse(f, size, config_only)
    with _LOCK:
        try:
            return _helper().request(f.fileno(), size, config_only, retry=True)
        except _Restart:  # a helper that dies twice on the same file died of the file
            f.seek(0)
            return _helper().request(f.fileno(), size, config_only)


# ------------------------------------------------------------------------------------------------
# the helper's side
# ------------------------------------------------------------------------------------------------
def _send(sock: socket.socket, header: dict, blob) -> None:
    data = json.dumps(header).encode()
    sock.sendall(_FRAME.pack(len(data)) + data + _FRAME.pack(len(blob)))
    if len(blob):
        sock.sendall(memoryview(blob))


def _limit_memory(size: int) -> None:
    try:
        import resource

        with open("/proc/self/statm") as f:
            vsize = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = vsize + MEMORY_BASE + 3 * size
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError, ImportError):  # no /proc or no resource module: time bound only
        pass


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _serve(sock: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    start_rss = _rss()
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
        except OSError:
            return
        if not msg or not fds:
            return
        request = json.loads(msg.decode())
        blob = bytearray()
        with os.fdopen(fds[0], "rb") as f:
            _limit_memory(request["size"])
            try:
                header, blob = parse(f, request["size"], request["config_only"])
                header = {"ok": True, **header}
            except ParseError as e:
                header = {"ok": False, "message": e.message, "layer": e.layer}
            except BaseException as e:  # noqa: BLE001 - parse converts everything; this is a bug
                header = {"ok": False, "message": f"internal parser error ({type(e).__name__}: {e})", "layer": None}
        # a helper that grew (a large file, a refused bomb) exits and gives its memory back
        header["exiting"] = len(blob) >= BIG_REPLY or _rss() - start_rss >= BIG_REPLY
        _send(sock, header, blob)
        if header["exiting"]:
            return


# ------------------------------------------------------------------------------------------------
# the parent's side
# ------------------------------------------------------------------------------------------------
class _Helper:
    def __init__(self):
        import h5py  # noqa: F401 - imported before the fork: the helper never imports
        import numpy  # noqa: F401
        import zipfile  # noqa: F401

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with warnings.catch_warnings():
            # Python >= 3.12 warns on fork in a threaded process: the helper runs only this
            # module's parser (json, zipfile, numpy, h5py), none of the parent's threads' code.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the helper
            try:
                ours.close()
                _serve(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self.sock, self.owner = pid, ours, os.getpid()

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            pid, _status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid = self.pid
        if pid:
            self.pid = None
            self.sock.close()
        return self.pid is not None

    def stop(self) -> Optional[int]:
        """Kills the helper; its wait status (None if it was already reaped)."""
        if self.pid is None:
            return None
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = None
        self.pid = None
        self.sock.close()
        return status

    def _recv_exact(self, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self.sock.settimeout(remaining)
            k = self.sock.recv_into(view[got:], min(n - got, 1 << 24))
            if k == 0:
                raise EOFError
            got += k
        return buf

    def request(self, fd: int, size: int, config_only: bool, retry: bool = False) -> Tuple[dict, bytearray]:
        """One parse. With `retry`, a helper that dies is reported as _Restart (it may have been
        killed from outside before it read the request); the caller tries once more."""
        limit = timeout_for(size)
        deadline = time.monotonic() + limit
        try:
            socket.send_fds(self.sock, [json.dumps({"size": size, "config_only": config_only}).encode()], [fd])
        except OSError:  # the helper ended between requests (killed from outside): not the file's fault
            self.stop()
            raise _Restart from None
        try:
            (n,) = _FRAME.unpack(self._recv_exact(_FRAME.size, deadline))
            if n > MAX_CONFIG_BYTES * 4:
                raise EOFError
            header = json.loads(self._recv_exact(n, deadline).decode())
            (m,) = _FRAME.unpack(self._recv_exact(_FRAME.size, deadline))
            if m > MAX_ZIP_RATIO * size + (1 << 20) + ALIGN * len(header.get("arrays", ())):
                raise EOFError
            blob = self._recv_exact(m, deadline)
        except (TimeoutError, socket.timeout):
            self.stop()
            raise ParseError(f"reading it did not finish within {limit:.0f} s and was stopped (libhdf5 can loop "
                             "forever on corrupted metadata; CUDNN_RNN_PARSE_TIMEOUT sets the limit)") from None
        except (EOFError, OSError, ValueError):
            status = self.stop()
            if retry:
                raise _Restart from None
            how = f"signal {os.WTERMSIG(status)}" if status is not None and os.WIFSIGNALED(status) else "exited"
            raise ParseError(f"the parser process died ({how}) while reading it: the file is corrupted in a "
                             "way that crashes libhdf5") from None
        except BaseException:  # KeyboardInterrupt: the helper's state is unknown
            self.stop()
            raise
        if header.pop("exiting", False):
            self.stop()
        if not header.pop("ok", False):
            raise ParseError(str(header.get("message")), header.get("layer"))
        return header, blob


_LOCK = threading.Lock()
_HELPER: Optional[_Helper] = None


def _helper() -> _Helper:
    global _HELPER
    if _HELPER is None or _HELPER.owner != os.getpid() or not _HELPER.alive():
        if _HELPER is not None and _HELPER.owner != os.getpid():
            try:  # a forked copy of the parent: the socket belongs to the parent's helper
                _HELPER.sock.close()
            except OSError:
                pass
        _HELPER = _Helper()
    return _HELPER


def shutdown() -> None:
    """Stops the helper (it is started again when needed)."""
    global _HELPER
    with _LOCK:
        if _HELPER is not None and _HELPER.owner == os.getpid():
            _HELPER.stop()
        _HELPER = None


atexit.register(shutdown)
