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
    "HEAD",
    "MAX_FDS",
    "MAX_MESSAGE",
    "ProtocolError",
    "decode_message",
    "encode_message",
    "message_size",
    "received_fds",
    "recv_message",
    "send_message",
]

#: the largest message either side accepts (a status report of many datasets fits)
MAX_MESSAGE = 16 << 20
#: the most descriptors one message carries (a shard and its index)
MAX_FDS = 4
#: a message's head: the length of its JSON body
HEAD = struct.Struct(">I")


class ProtocolError(ConnectionError):
    """The other side sent something that is no message of this protocol."""


def encode_message(message: dict[str, Any]) -> bytes:
    """``message`` as its bytes on the wire: its length, then its JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"message of {len(body)} bytes is over the limit of {MAX_MESSAGE}")
    return HEAD.pack(len(body)) + body


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
    when the other side closed the connection between messages (blocking socket)."""
    fds: list[int] = []
    head = _recv_exact(sock, HEAD.size, fds, first=True)
    if head is None:
        return None
    try:
        size = message_size(head)
        body = _recv_exact(sock, size, fds, first=False) if size else b""
        if body is None:
            raise ProtocolError("connection closed inside a message")
        return decode_message(body), fds
    except ProtocolError:
        _close(fds)
        raise


def message_size(head: bytes | bytearray) -> int:
    """The length a message's head (its first ``HEAD.size`` bytes) announces."""
    (size,) = HEAD.unpack_from(head)
    if size > MAX_MESSAGE:
        raise ProtocolError(f"message of {size} bytes is over the limit of {MAX_MESSAGE}")
    return int(size)


def decode_message(body: bytes) -> dict[str, Any]:
    """A message's JSON object from its body."""
    try:
        message = json.loads(body)
    except ValueError:
        raise ProtocolError("a message that is not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message that is not a JSON object")
    return message


def received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors a ``recvmsg`` took (``SCM_RIGHTS``): now this process's."""
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            found = array.array("i")
            found.frombytes(payload[: len(payload) - len(payload) % found.itemsize])
            fds.extend(found)
    return fds


def _recv_exact(sock: socket.socket, size: int, fds: list[int], *, first: bool) -> bytes | None:
    chunks: list[bytes] = []
    got = 0
    while got < size:
        data, ancdata, _, _ = sock.recvmsg(
            size - got, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
        )
        fds.extend(received_fds(ancdata))
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
