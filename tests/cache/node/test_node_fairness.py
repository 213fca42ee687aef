"""Fairness of the node service: requests are served round robin per tenant, so a tenant
flooding the service cannot starve another (the time bound itself is measured in
``benchmarks/stages/nodebench.py``, not here); fills share workers by job weight."""

from __future__ import annotations

import json
import os
import threading

from flashfeed.cache.node.fairqueue import FairQueue


def test_another_tenants_reads_complete_while_a_flood_is_still_being_served(
    node, tenants, datasets, tmp_path
):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}, "ffnodeb": {"quota": "16MiB"}})
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
