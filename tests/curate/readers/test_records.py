"""kiln.curate.readers.records: meta values made JSON-safe, worked by hand."""

from __future__ import annotations

import datetime
import json
import math
from decimal import Decimal

from kiln.curate.readers.records import json_value


def test_json_value_by_hand():
    meta = {
        "when": datetime.datetime(2020, 1, 1, 12, 30),
        "day": datetime.date(2020, 1, 2),
        "at": datetime.time(8, 15),
        "price": Decimal("19.990"),  # str keeps the trailing zero a float would lose
        "digest": b"\x00\xffk",
        "scores": [1.5, math.nan, math.inf, -math.inf],
        "tags": ("a", {"b", "c"}),
        "nested": {"list": [datetime.date(1999, 12, 31), {"deep": b"\x01"}], 7: "int key"},
        "half": "pair \ud83d",  # a lone surrogate cannot be written as UTF-8
        "ok": [None, True, 3, "x"],
        "span": datetime.timedelta(hours=1),
    }
    assert json_value(meta) == {
        "when": "2020-01-01T12:30:00",
        "day": "2020-01-02",
        "at": "08:15:00",
        "price": "19.990",
        "digest": "00ff6b",
        "scores": [1.5, "NaN", "Infinity", "-Infinity"],
        "tags": ["a", ["b", "c"]],
        "nested": {"list": ["1999-12-31", {"deep": "01"}], "7": "int key"},
        "half": "pair \ufffd",
        "ok": [None, True, 3, "x"],
        "span": "1:00:00",
    }
    json.dumps(json_value(meta), ensure_ascii=False, allow_nan=False).encode("utf-8")  # strict JSON, valid UTF-8
