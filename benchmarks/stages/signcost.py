"""CPU cost of signing one ranged S3 GET: flashfeed's SigV4 signer against botocore's.

  ours      ``flashfeed/s3/sigv4.py``'s ``s3_get_headers``: the headers of a signed ranged GET
  botocore  ``botocore.auth.S3SigV4Auth.add_auth`` on an ``AWSRequest`` built for the same
            GET (what a fill would call per request if it signed with botocore)

Both sign the same path, Range and credentials (a session token included) in interleaved
rounds; each round times ``--requests`` signatures with ``time.process_time``. Prints
microseconds a request (median of the rounds) and the ratio to ours; ``--json`` writes the
rounds. No server is needed: signing is pure CPU.

    python -m benchmarks.stages.signcost --requests 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from flashfeed.s3.sigv4 import s3_get_headers, s3_path

METHODS = ("ours", "botocore")
HOST = "127.0.0.1:8333"
REGION = "us-east-1"
KEY, SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLE"


def ours(n: int) -> Callable[[], None]:
    path = s3_path("bucket", "dataset/shards/000000.tar")

    def run() -> None:
        for i in range(n):
            s3_get_headers(
                host=HOST, path=path, region=REGION, access_key=KEY, secret_key=SECRET,
                token=TOKEN, extra={"range": f"bytes={i}-{i + 16_777_215}"},
            )  # fmt: skip

    return run


def botocore(n: int) -> Callable[[], None]:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth = S3SigV4Auth(Credentials(KEY, SECRET, TOKEN), "s3", REGION)
    url = f"http://{HOST}" + s3_path("bucket", "dataset/shards/000000.tar")

    def run() -> None:
        for i in range(n):
            request = AWSRequest(
                method="GET", url=url, headers={"Range": f"bytes={i}-{i + 16_777_215}"}
            )
            auth.add_auth(request)

    return run


def per_request_us(fn: Callable[[], None], n: int) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="signatures a round (20000)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the rounds as JSON here")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.rounds < 1:
        ap.error(f"--requests and --rounds must be >= 1, got {args.requests}, {args.rounds}")
    runs = {"ours": ours(args.requests), "botocore": botocore(args.requests)}
    for m in METHODS:  # warm-up: imports, the signing-key cache
        runs[m]()
    got = run_rounds({m: lambda m=m: per_request_us(runs[m], args.requests) for m in METHODS},
                     args.rounds)  # fmt: skip
    rounds = [{m: got[m][r] for m in METHODS} for r in range(args.rounds)]
    med = {m: statistics.median(r[m] for r in rounds) for m in METHODS}
    print(f"{args.requests} signed ranged GETs a round, {args.rounds} rounds interleaved")
    print(f"{'signer':<10}{'us/request (median)':>21}{'per round':>34}{'vs ours':>9}")
    for m in METHODS:
        each = " ".join(f"{r[m]:.1f}" for r in rounds)
        print(f"{m:<10}{med[m]:>21.1f}  {each:>32}{med[m] / med['ours']:>8.2f}x")
    if args.json:
        write_json(args.json, {"args": vars(args), "rounds": rounds, "median_us": med})
    return 0


if __name__ == "__main__":
    sys.exit(main())
