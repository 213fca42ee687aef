"""Upload a shard while it is written: a file-like sink that sends the shard's bytes to S3 in
parts from a background thread as they arrive, so the upload overlaps the per-image work of
the same shard instead of waiting behind it.

Atomic as ``storage.write_bytes``: the parts form an S3 multipart upload, invisible until
``commit`` completes it and aborted on failure; a shard smaller than one part, and any local
destination, is written whole at ``commit`` (one PUT, or a temporary file renamed). The
checksum is the manifest's (``storage.checksum`` of the whole shard), computed as bytes pass.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import xxhash

from flashfeed import storage

__all__ = ["MIN_PART_BYTES", "ShardUpload", "part_bytes_for"]

#: S3's smallest part (all but the last)
MIN_PART_BYTES = 5 << 20
_MAX_PART_BYTES = 64 << 20


def part_bytes_for(expected: int) -> int:
    """The part size for a shard of about ``expected`` bytes: about an eighth of it (the
    last part's upload is what stays behind the work), within S3's limits."""
    if expected < 0:
        raise ValueError(f"expected shard bytes must be >= 0, got {expected}")
    return min(_MAX_PART_BYTES, max(MIN_PART_BYTES, expected // 8))


class ShardUpload:
    """``write`` bytes (as a tar writer does), then ``commit`` (or ``abort``): the object at
    ``url`` appears whole at ``commit`` or not at all.

    ``nbytes`` and ``checksum()`` describe what was written. One writer thread only.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        part_bytes: int = MIN_PART_BYTES,
    ) -> None:
        if part_bytes < 1:
            raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
        self.url = url
        self.nbytes = 0
        self._opts = storage_options
        self._part_bytes = part_bytes
        self._chunks: list[bytes] = []
        self._pending = 0
        self._stream = not storage.is_local(url)  # a local file is written whole at commit
        self._hash = xxhash.xxh3_128()
        self._streamed = False
        self._done = False
        self._parts: list[dict[str, Any]] = []
        self._error: BaseException | None = None
        self._upload_id: str | None = None
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=2)
        self._thread: threading.Thread | None = None

    # --- the writer's side -----------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._done:
            raise ValueError(f"write to {self.url} after commit or abort")
        if self._error is not None:
            raise self._error
        chunk = data if isinstance(data, bytes) else bytes(data)
        self._chunks.append(chunk)
        self._pending += len(chunk)
        self._hash.update(chunk)
        self.nbytes += len(chunk)
        if self._pending >= self._part_bytes and self._stream:
            self._send(self._take())
        return len(chunk)

    def _take(self) -> bytes:
        """The bytes written since the last part, as one (a single copy)."""
        part = b"".join(self._chunks)
        self._chunks.clear()
        self._pending = 0
        return part

    def tell(self) -> int:
        return self.nbytes

    def checksum(self) -> str:
        """``storage.checksum`` of every byte written so far."""
        return storage.CHECKSUM_PREFIX + self._hash.hexdigest()

    def commit(self) -> None:
        """Make the object visible, whole: the last part and the completion (or one write)."""
        if self._done:
            raise ValueError(f"{self.url} was already committed or aborted")
        self._done = True
        if not self._streamed:
            storage.write_bytes(self.url, self._take(), storage_options=self._opts)
            return
        if self._pending:
            self._queue.put(self._take())
        self._finish()
        self._raise_failed()
        fs, path = storage.filesystem(self.url, self._opts)
        bucket, key, _ = fs.split_path(path)
        storage.call(
            lambda: fs.call_s3(
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            ),
            url=self.url,
            what="complete the upload of",
            storage_options=self._opts,
        )
        fs.invalidate_cache(path)

    def abort(self) -> None:
        """Drop what was sent: nothing appears at ``url``. Safe to call more than once."""
        self._done = True
        self._take()
        if not self._streamed:
            return
        self._finish()
        if self._upload_id is not None:
            fs, path = storage.filesystem(self.url, self._opts)
            bucket, key, _ = fs.split_path(path)
            upload_id, self._upload_id = self._upload_id, None
            storage.call(
                lambda: fs.call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id
                ),
                url=self.url,
                what="abort the upload of",
                storage_options=self._opts,
            )

    def _send(self, part: bytes) -> None:
        if not self._streamed:
            self._streamed = True
            self._thread = threading.Thread(target=self._run, name="shard-upload", daemon=True)
            self._thread.start()
        self._queue.put(part)

    def _finish(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # --- the upload thread -------------------------------------------------------------

    def _run(self) -> None:
        fs, path = storage.filesystem(self.url, self._opts)
        bucket, key, _ = fs.split_path(path)
        while (part := self._queue.get()) is not None:
            if self._error is not None:
                continue  # failed: drain, so that the writer never blocks on a full queue
            try:
                if self._upload_id is None:
                    made = storage.call(
                        lambda: fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key),
                        url=self.url,
                        what="start the upload of",
                        storage_options=self._opts,
                    )
                    self._upload_id = made["UploadId"]
                number = len(self._parts) + 1

                def put(body: bytes = part, n: int = number) -> dict[str, Any]:
                    return fs.call_s3(  # type: ignore[no-any-return]
                        "upload_part",
                        Bucket=bucket,
                        Key=key,
                        UploadId=self._upload_id,
                        PartNumber=n,
                        Body=body,
                    )

                out = storage.call(
                    put,
                    url=self.url,
                    what=f"upload part {number} of",
                    storage_options=self._opts,
                )
                self._parts.append({"PartNumber": number, "ETag": out["ETag"]})
            except BaseException as exc:  # handed to the writer at its next call
                self._error = exc
