"""CONFORMANCE item 126 with any id (P§2.11): every LLM call of a v2 rollout names its rollout
and its sample in ``x-rollout-id`` / ``x-sample-id``, whatever they hold, through each SDK path
that sends them (the OpenAI client, Strands, OpenAI Agents).

Hypothesis draws rollout ids the schema accepts (non-ASCII, CJK, emoji, CR/LF, spaces at either
end, U+2028, ``%``...) and sample ids of any text, and runs them on a real fleet (two gateways,
two workers, redis-server) against the mock TrainGate. Each rollout must succeed; the mock
must read each header as the ids (percent-decoded), a plain header-safe ASCII id must go as it
is, and the turns the worker kept must name their sample. Before, a non-ASCII id failed the
rollout (``'ascii' codec can't encode``, ``validation_error``) and CR/LF or a leading space
failed it as ``Connection error.`` (``agent_error``).
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollout_sdk.client.headers import ROLLOUT_HEADER, SAMPLE_HEADER
from tests.conftest import V2_ENV, module_fleet
from tests.harness import REPO, TERMINAL, V2FleetUnderTest

ID_HEADERS_AGENT = str(REPO / "tests/agents/id_headers_v2.py")
PATHS = ("openai", "strands", "openai_agents")
EXAMPLES = int(os.environ.get("ROLLOUT_FLEET_PROPERTY_EXAMPLES", "100"))
PLAIN = "plain-id.1_2~x"  # header-safe ASCII: sent as it is
_unique = itertools.count()
pytestmark = pytest.mark.timeout(180 + 10 * EXAMPLES)


fleet = module_fleet(ID_HEADERS_AGENT, workers=2, gateways=2, env=V2_ENV, handle=V2FleetUnderTest)


# What a rollout id may hold (P§2.3): anything but "/", "\" and NUL. A sample id: any text.
id_text = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="/\\\x00"), min_size=1, max_size=25
)
sample_text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30)


def rollout_id(drawn: str) -> str:
    """A fresh id with what was drawn at both ends (a leading or trailing space stays one)."""
    return f"{drawn}{next(_unique)}{drawn}"


def raw_header(text: str, call: dict[str, Any], name: str) -> None:
    """The header went as P§2.11 says: as it is if plain header-safe ASCII, else encoded."""
    sent = call["headers"][name]
    plain = all(" " <= c <= "~" and c != "%" for c in text) and text.strip(" ") == text
    assert sent == (text if plain else quote(text, safe="")), (text, sent)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ids=st.tuples(id_text, id_text, id_text), samples=st.tuples(*[sample_text] * 3))
@example(ids=("é中文😀", "a\r\nb", " lead\u2028"), samples=("\u2028 x", "%41 trail ", "名前\n"))
@example(ids=(PLAIN, "%41", "tab\there"), samples=(PLAIN, "é", "\x00"))
def test_126_any_id_names_its_llm_calls_through_every_sdk_path(
    fleet: V2FleetUnderTest, ids: tuple[str, str, str], samples: tuple[str, str, str]
) -> None:
    rollouts = {}
    for path, drawn, sample in zip(PATHS, ids, samples, strict=True):
        rid = rollout_id(drawn) if drawn != PLAIN else f"{PLAIN}{next(_unique)}"
        body = fleet.body(
            rid,
            initial_messages=[{"role": "user", "content": "Say hello."}],
            metadata={"path": path, "sample": sample},
        )
        admitted = fleet.admit(body)
        assert admitted.status_code == 202, (path, rid, admitted.text)
        rollouts[rid] = (path, sample, admitted.json()["polling_lease_token"])
    for rid, (path, sample, token) in rollouts.items():
        final = fleet.result(rid, token, timeout=60)
        assert final["status"] in TERMINAL
        assert (final["status"], final["err_message"]) == ("success", None), (path, rid, final)
        assert final["sample"]["reward"] == 1.0, (path, final)
        calls = fleet.trainer.calls("chat", rid)
        assert calls, (path, rid)
        for call in calls:
            assert (call["x_rollout_id"], call["x_sample_id"]) == (rid, sample), (path, call)
            raw_header(rid, call, ROLLOUT_HEADER)
            raw_header(sample, call, SAMPLE_HEADER)
        turns = json.loads(fleet.record(rid)["turns"])
        assert [turn["sample_id"] for turn in turns] == [sample] * len(calls), (path, turns)
