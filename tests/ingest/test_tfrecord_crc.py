"""TFRecord CRC checks go through a maintained crc32c package when one is installed; every
backend gives the same answers, the pure-Python loop stays as the fallback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from flashfeed.ingest.sources import tfrecord_format as tf
from flashfeed.ingest.sources.tfrecord_format import (
    CRC32C_BACKENDS,
    crc32c_backend,
    frame_record,
    iter_records,
)

# RFC 3720 (iSCSI) appendix B.4 vectors and the usual check value
VECTORS = {
    b"123456789": 0xE3069283,
    bytes(32): 0x8A9136AA,
    b"\xff" * 32: 0x62A8AB43,
    bytes(range(32)): 0x46DD794E,
    b"": 0,
}


def _installed() -> list[str]:
    names = []
    for name in CRC32C_BACKENDS:
        try:
            crc32c_backend(name)
        except ImportError:
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("name", _installed())
def test_every_installed_backend_gives_the_castagnoli_crc(name: str) -> None:
    _, fn = crc32c_backend(name)
    for data, want in VECTORS.items():
        assert fn(data) == want, (name, data[:8])


def test_backends_agree_on_random_bytes_and_flag_the_same_record() -> None:
    rng = np.random.default_rng(7)
    payloads = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1, 77, 0, 4099)]
    blob = bytearray(b"".join(frame_record(p) for p in payloads))
    second = list(iter_records(bytes(blob), source="t"))[1]
    blob[second[0] + 40] ^= 0x01  # one bit of the second record's data
    installed = _installed()
    assert "python" in installed
    for name in installed:
        _, fn = crc32c_backend(name)
        got = [ok for _, _, ok in iter_records(bytes(blob), source="t", crc=fn)]
        assert got == [True, False, True, True], name


def test_the_check_uses_an_installed_package_not_the_python_loop() -> None:
    pytest.importorskip("google_crc32c")  # a dependency of flashfeed
    name, fn = crc32c_backend()
    assert name == "google-crc32c"
    assert tf.crc32c(b"123456789") == fn(b"123456789") == 0xE3069283


def test_an_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match="'zlib'"):
        crc32c_backend("zlib")


def test_without_a_crc32c_package_the_python_loop_checks() -> None:
    code = (
        "import sys\n"
        "sys.modules['google_crc32c'] = None\n"
        "sys.modules['crc32c'] = None\n"
        "from flashfeed.ingest.sources import tfrecord_format as tf\n"
        "blob = tf.frame_record(b'abc') + tf.frame_record(b'')\n"
        "oks = [ok for _, _, ok in tf.iter_records(blob, source='t')]\n"
        "print(tf.crc32c_backend()[0], tf.crc32c(b'123456789'), oks)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(maxsplit=1) == ["python", f"{0xE3069283} [True, True]\n"]
