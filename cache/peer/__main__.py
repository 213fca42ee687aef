"""``python -m flashfeed.cache.peer serve``: one node of the cluster tier, standalone.

    python -m flashfeed.cache.peer serve --cache-dir /nvme/ff --listen 10.0.0.5:7460 \\
        --hostfile hosts.txt --port 7460 --token-file /etc/flashfeed/peer-token

Prints one JSON line ``{"address": "host:port"}`` once it serves, then serves until killed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from flashfeed.units import parse_size

from .auth import load_token
from .discovery import parse_listen, peers_from
from .node import PeerNode


def _listen(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashfeed.cache.peer", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve this node's cache to its peers")
    s.add_argument("--cache-dir", required=True)
    s.add_argument("--listen", type=_listen, required=True, help="host:port (port 0: any)")
    s.add_argument("--token-file", help="the cluster token (else FLASHFEED_PEER_TOKEN)")
    s.add_argument("--hosts", help="the nodes, comma-separated (host or host:port)")
    s.add_argument("--hostfile", help="the nodes, one a line")
    s.add_argument("--port", type=int, default=7460, help="the peers' port where hosts lack one")
    s.add_argument("--max-streams", type=int, default=8)
    s.add_argument("--rate", default="0", help="bytes a second served, at most (0: unbounded)")
    args = p.parse_args(argv)
    try:
        token = load_token(token_file=args.token_file)
        peers = peers_from(hosts=args.hosts, hostfile=args.hostfile, port=args.port)
        node = PeerNode(
            cache_dir=args.cache_dir,
            token=token,
            listen=args.listen,
            peers=peers,
            max_streams=args.max_streams,
            rate=float(parse_size(args.rate, name="rate")) if args.rate != "0" else 0.0,
        )
    except ValueError as exc:
        print(f"flashfeed peer: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"address": node.address}), flush=True)
    try:
        node.server.serve_forever()
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
