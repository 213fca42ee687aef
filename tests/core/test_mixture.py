"""The mixture value and its file form: every bad input is one clear error naming it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flashfeed.plan.mixture import Change, Mixture, Source, load_mixture


def _write(tmp_path, obj, name="mix.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj) if name.endswith(".json") else obj)
    return p


def test_weights_are_relative_and_normalised():
    m = Mixture((Source("/d/web", 3), Source("/d/code", 1.5), Source("/d/books", 1.5)))
    assert m.names == ("web", "code", "books")
    assert np.allclose(m.weights, [0.5, 0.25, 0.25])
    assert Mixture((Source("/a", 6), Source("/b", 2))).weights.tolist() == [0.75, 0.25]


def test_file_form_round_trips_and_resolves_relative_paths(tmp_path):
    form = {
        "sources": [
            {"url": "web", "weight": 3},
            {"url": "s3://bucket/code/", "weight": 1, "name": "code"},
        ],
        "schedule": [{"at": 1000, "weights": {"code": 3}, "ramp": 500}],
        "length": 5000,
    }
    m = Mixture.from_file(_write(tmp_path, form))
    assert m.sources[0].url == str(tmp_path / "web")
    assert m.sources[1].url == "s3://bucket/code/" and m.names == ("web", "code")
    assert m.schedule == (Change(1000, {"code": 3.0}, 500),)
    assert m.length == 5000 and m.until is None
    again = load_mixture(m.to_dict())
    assert again == m and again.digest == m.digest
    assert load_mixture(str(_write(tmp_path, form))) == m


def test_yaml_file_form(tmp_path):
    pytest.importorskip("yaml")
    text = "sources:\n  - {url: /d/a, weight: 2}\n  - {url: /d/b, weight: 1}\nuntil: b\n"
    m = load_mixture(_write(tmp_path, text, "mix.yaml"))
    assert m.names == ("a", "b") and m.until == "b"
    assert np.allclose(m.weights, [2 / 3, 1 / 3])


@pytest.mark.parametrize(
    ("form", "words"),
    [
        ({"sources": [{"url": "/a"}], "lenght": 5}, ["unknown key", "lenght"]),
        ({"sources": [{"url": "/a", "wieght": 2}]}, ["unknown key", "wieght"]),
        (
            {"sources": [{"url": "/a"}], "schedule": [{"at": 1, "weight": {"a": 1}}]},
            ["unknown key", "weight"],
        ),
        ({"sources": [{"url": "/a", "weight": 0}]}, ["weight of source 'a'", "> 0", "0"]),
        ({"sources": [{"url": "/a", "weight": -2}]}, ["weight of source 'a'", "-2"]),
        ({"sources": [{"url": "/a", "weight": "heavy"}]}, ["weight of source 'a'", "heavy"]),
        ({"sources": []}, ["empty source list"]),
        ({"sources": [{"url": "/a"}, {"url": "/a/"}]}, ["'/a/'", "twice"]),
        ({"sources": [{"url": "/x/a"}, {"url": "/y/a"}]}, ["named 'a'", "distinct"]),
        ({"sources": [{"url": "/a"}], "until": "b"}, ["until='b'", "not a source"]),
        ({"sources": [{"url": "/a"}], "until": "a", "length": 4}, ["not both"]),
        ({"sources": [{"url": "/a"}], "length": 0}, ["length", ">= 1", "0"]),
        (
            {"sources": [{"url": "/a"}], "schedule": [{"at": 3, "weights": {"z": 1}}]},
            ["unknown source", "'z'"],
        ),
        (
            {
                "sources": [{"url": "/a"}, {"url": "/b"}],
                "schedule": [
                    {"at": 10, "weights": {"a": 2}, "ramp": 10},
                    {"at": 15, "weights": {"a": 1}},
                ],
            },
            ["at 15", "overlap"],
        ),
        (
            {
                "sources": [{"url": "/a"}, {"url": "/b"}],
                "schedule": [{"at": 10, "weights": {"a": 0, "b": 0}}],
            },
            ["at 10", "every source off"],
        ),
        (
            {"sources": [{"url": "/a"}], "schedule": [{"at": -1, "weights": {"a": 1}}]},
            ["'at'", "-1"],
        ),
        ({"sources": [{"url": ""}]}, ["url", "non-empty"]),
        ([{"url": "/a"}], ["must be a mapping"]),
    ],
)
def test_bad_file_forms_are_one_clear_error(tmp_path, form, words):
    path = _write(tmp_path, form)
    with pytest.raises(ValueError) as err:
        Mixture.from_file(path)
    message = str(err.value)
    assert str(path) in message
    for w in words:
        assert w in message, (w, message)
    assert "\n" not in message


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, -math.inf, True, None])
def test_bad_weights_in_python(bad):
    with pytest.raises(ValueError, match="weight of source 'a'"):
        Source("/d/a", bad)


def test_bad_schedule_weights_in_python():
    with pytest.raises(ValueError, match="schedule weight of 'a' at 5"):
        Change(5, {"a": math.nan})
    with pytest.raises(ValueError, match="schedule weight of 'a' at 5"):
        Change(5, {"a": -1})
    assert Change(5, {"a": 0}).weights == {"a": 0.0}  # a schedule may turn one source off


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read mixture file"):
        Mixture.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_mixture(bad)
    with pytest.raises(ValueError, match="must be a Mixture, a file path or a dict"):
        load_mixture(42)  # type: ignore[arg-type]


def test_knots_describe_jumps_and_ramps():
    m = Mixture(
        (Source("/a", 1), Source("/b", 1)),
        (Change(100, {"a": 3}), Change(200, {"a": 1}, ramp=100)),
    )
    xs, rows = m.knots()
    assert xs.tolist() == [0, 100, 100, 200, 300]
    assert np.allclose(rows[:, 0], [0.5, 0.5, 0.75, 0.75, 0.5])
