"""The node service's wire format: length-prefixed JSON messages over a Unix stream socket,
open file descriptors riding along (``SCM_RIGHTS``) with the message they belong to.

A message is a 4-byte big-endian length and that many bytes of JSON (an object). The fds of
a message arrive with its first bytes, so a reader that takes a whole message takes its fds.
"""

from __future__ import annotations

import array
import json
import socket
import struct
from typing import Any

__all__ = [
    "MAX_FDS",
    "MAX_MESSAGE",
    "ProtocolError",
    "encode_message",
    "recv_message",
    "send_message",
]

#: the largest message either side accepts (a status report of many datasets fits)
MAX_MESSAGE = 16 << 20
#: the most descriptors one message carries (a shard and its index)
MAX_FDS = 4
_HEAD = struct.Struct(">I")


class ProtocolError(ConnectionError):
    """The other side sent something that is no message of this protocol."""


def encode_message(message: dict[str, Any]) -> bytes:
    """``message`` as its bytes on the wire: its length, then its JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"message of {len(body)} bytes is over the limit of {MAX_MESSAGE}")
    return _HEAD.pack(len(body)) + body


def send_message(
    sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None
) -> None:
    """Send one message (and ``fds``, which stay open here) on a blocking socket."""
    data = encode_message(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and the fds it carried (now this process's, close them), or None
    when the other side closed the connection between messages."""
    fds: list[int] = []
    head = _recv_exact(sock, _HEAD.size, fds, first=True)
    if head is None:
        return None
    (size,) = _HEAD.unpack(head)
    if size > MAX_MESSAGE:
        _close(fds)
        raise ProtocolError(f"message of {size} bytes is over the limit of {MAX_MESSAGE}")
    body = _recv_exact(sock, size, fds, first=False) if size else b""
    if body is None:
        _close(fds)
        raise ProtocolError("connection closed inside a message")
    try:
        message = json.loads(body)
    except ValueError:
        _close(fds)
        raise ProtocolError("a message that is not JSON") from None
    if not isinstance(message, dict):
        _close(fds)
        raise ProtocolError("a message that is not a JSON object")
    return message, fds


def _recv_exact(sock: socket.socket, size: int, fds: list[int], *, first: bool) -> bytes | None:
    chunks: list[bytes] = []
    got = 0
    while got < size:
        data, ancdata, _, _ = sock.recvmsg(
            size - got, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                found = array.array("i")
                found.frombytes(payload[: len(payload) - len(payload) % found.itemsize])
                fds.extend(found)
        if not data:
            if first and got == 0:
                _close(fds)
                return None
            _close(fds)
            raise ProtocolError("connection closed inside a message")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _close(fds: list[int]) -> None:
    import os

    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
