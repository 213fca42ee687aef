"""Fairness of the node service: requests are served round robin per tenant, so a tenant
flooding the service cannot starve another (the time bound itself is measured in
``benchmarks/stages/nodebench.py``, not here); a tenant's ``requests_per_s`` paces its
requests; fills share workers by job weight."""

from __future__ import annotations

import json
import os
import re
import threading

import pytest

from flashfeed.cache.node.fairqueue import FairQueue


def test_another_tenants_reads_complete_while_a_flood_is_still_being_served(
    node, tenants, datasets, tmp_path
):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"},
                               "ffnodeb": {"quota": "16MiB", "requests_per_s": 0}})  # fmt: skip
    node.start()
    alice, bob = tenants
    url = datasets["shared"]
    go = os.path.join(node.base, "go")
    reader = alice.start("hits", url, "0", "100", go)
    assert json.loads(reader.stdout.readline()) == {"ready": True}
    flood = bob.start("flood", url, "0", "40000")
    started = json.loads(flood.stdout.readline())["start"]
    open(go, "w").close()  # alice reads while bob floods
    sent = json.loads(flood.stdout.readline())["sent"]
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err.decode()
    hits = json.loads(out.decode().splitlines()[-1])
    out, err = flood.communicate(timeout=300)
    assert flood.returncode == 0, err.decode()
    flood_end = json.loads(out.decode().splitlines()[-1])["end"]
    # alice's 100 reads, made as bob's flood began, were all answered while the flood was
    # still being served (served in arrival order, they would wait behind it)
    assert started <= hits["start"] and hits["end"] < flood_end, (hits, started, sent, flood_end)


def test_fair_queue_serves_a_waiting_flow_once_per_round_whatever_the_flood():
    q = FairQueue()
    for i in range(1000):
        q.put("flood", ("flood", i))
    q.put("quiet", ("quiet", 0))
    q.put("quiet", ("quiet", 1))
    taken = [q.get() for _ in range(6)]
    assert [t[0] for t in taken].count("quiet") == 2
    assert taken.index(("quiet", 1)) <= 4


def test_fair_queue_shares_by_weight():
    q = FairQueue()
    for _ in range(300):
        q.put("heavy", "h", weight=3.0)
        q.put("light", "l", weight=1.0)
    first = [q.get() for _ in range(200)]
    assert first.count("h") == 150 and first.count("l") == 50


def test_an_urgent_item_goes_before_its_own_flow_not_before_another_flows_turn():
    q = FairQueue()
    for i in range(5):
        q.put("job", ("ahead", i))  # a loader's fetches ahead
    q.put("other", ("other", 0))
    q.put("job", ("read", 0), urgent=True)  # the same loader waits for this shard now
    taken = [q.get() for _ in range(7)]
    assert taken[0] == ("read", 0)  # first of its flow, before the fetches ahead
    assert taken.index(("other", 0)) == 1  # the other flow keeps its turn
    assert [t for t in taken if t[0] == "ahead"] == [("ahead", i) for i in range(5)]


def test_fair_queue_wakes_a_waiting_worker_and_ends_on_close():
    q = FairQueue()
    got: list[object] = []
    t = threading.Thread(target=lambda: got.extend([q.get(), q.get()]))
    t.start()
    q.put("a", 1)
    q.close()
    t.join(5)
    assert got == [1, None]


def test_a_tenants_requests_per_s_paces_its_flood_and_not_the_others(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"},
                               "ffnodeb": {"quota": "16MiB", "requests_per_s": 100}})  # fmt: skip
    node.start()
    alice, bob = tenants
    url = datasets["shared"]
    flood = bob.start("flood", url, "0", "300")
    started = json.loads(flood.stdout.readline())["start"]
    got = alice.run("get", url, "0,1,2")  # alice, unbounded, is read at once meanwhile
    assert got["rc"] == 0 and sorted(got["sha256"]) == ["0", "1", "2"], got
    out, err = flood.communicate(timeout=120)
    assert flood.returncode == 0, err.decode()
    end = json.loads(out.decode().splitlines()[-1])["end"]
    # bob's 300 reads and one status beyond its burst of 100 are read at 100 a second
    assert end - started >= 1.9, end - started


def test_bad_requests_per_s_fail_in_one_line(tmp_path):
    from flashfeed.cache.node.tenants import ConfigError, NodeConfig

    base = {"cache_dir": str(tmp_path / "c"), "capacity": "1GiB"}
    for extra, says in (
        ({"requests_per_s": -1}, "requests_per_s must be a number >= 0 (0: unbounded), got -1"),
        ({"requests_per_s": "fast"}, "requests_per_s must be a number >= 0"),
        ({"tenants": {"a": {"quota": 1, "requests_per_s": True}}},
         "requests_per_s of tenant a must be a number >= 0"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(says)):
            NodeConfig.parse({**base, **extra}, source="n.json")
    cfg = NodeConfig.parse(
        {**base, "requests_per_s": 2000, "tenants": {"a": {"quota": 1, "requests_per_s": 5}}},
        source="n.json",
    )
    assert (cfg.request_rate("a"), cfg.request_rate("b")) == (5.0, 2000.0)
    per_core = 1000 * (os.cpu_count() or 1)  # the default
    assert NodeConfig.parse(base, source="n.json").request_rate("b") == per_core
    unbounded = NodeConfig.parse({**base, "requests_per_s": 0}, source="n.json")
    assert unbounded.request_rate("b") == 0.0


def test_fair_queue_serves_a_flows_urgent_items_before_its_others_each_in_order():
    q = FairQueue()
    for i in range(3):
        q.put("job", ("ahead", i))
    q.put("job", ("read", 0), urgent=True)
    q.put("job", ("read", 1), urgent=True)
    assert [q.get() for _ in range(5)] == [
        ("read", 0), ("read", 1), ("ahead", 0), ("ahead", 1), ("ahead", 2)
    ]  # fmt: skip


def test_fair_queue_gives_back_the_turn_of_an_item_that_needed_no_service():
    q = FairQueue()
    for _ in range(100):
        q.put("heavy", "h", weight=2.0)
        q.put("light", "l", weight=1.0)
    taken, moot = [], 0
    for _ in range(90):
        taken.append(q.get())
        if taken[-1] == "l" and taken.count("l") % 2:  # every other light item was moot
            moot += 1
            q.refund("light")
    served = taken.count("l") - moot
    # the heavy flow is served twice per light item that needed service (without the
    # refunds: twice per light item taken, 60 heavy and 30 light, 15 of them moot)
    assert abs(taken.count("h") - 2 * served) <= 2 and moot >= 20, (taken.count("h"), served)


def test_a_client_that_reads_no_replies_or_stops_mid_message_blocks_no_one(node, tenants):
    """The request loop never blocks on one client's socket: one that sends requests and
    reads none of the replies (its socket fills), and one that stops halfway through a
    message, leave every other client served."""
    import socket
    import struct
    import threading

    from flashfeed.cache.node import NodeClient

    node.start()
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deaf.connect(node.socket)
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = b'{"op":"status","id":1}'
    status = struct.pack(">I", len(body)) + body
    deaf.settimeout(5.0)
    sent = 0
    try:
        while sent < 20000:  # until its replies fill both sockets and it can send no more
            deaf.sendall(status * 100)
            sent += 100
    except TimeoutError:
        pass
    half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    half.connect(node.socket)
    half.sendall(struct.pack(">I", 100) + b'{"op":')
    answered: list[dict] = []
    client = NodeClient(node.socket, reconnect_timeout=5)
    t = threading.Thread(
        target=lambda: answered.extend(client.status() for _ in range(3)), daemon=True
    )
    t.start()
    t.join(60)
    assert len(answered) == 3 and all(a["admin"] for a in answered), (sent, answered)
    deaf.close()  # what it left unread is dropped with it; the service serves on
    half.close()
    assert client.status()["admin"]
    client.close()


def test_the_request_inbox_takes_whole_messages_and_refuses_others():
    from flashfeed.cache.node.loop import Inbox
    from flashfeed.cache.node.protocol import MAX_MESSAGE, ProtocolError, encode_message

    box = Inbox()
    data = encode_message({"op": "a"}) + encode_message({"op": "b"})
    for i in range(len(data)):  # a byte at a time: each message once it is whole
        box.feed(data[i : i + 1])
    assert [m["op"] for m in box.messages] == ["a", "b"] and not box.buffer
    with pytest.raises(ProtocolError, match="over the limit"):
        Inbox().feed((MAX_MESSAGE + 1).to_bytes(4, "big"))
    with pytest.raises(ProtocolError, match="not a JSON object"):
        Inbox().feed(encode_message([1]))  # type: ignore[arg-type]
