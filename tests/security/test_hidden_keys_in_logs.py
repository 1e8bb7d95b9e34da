"""A key a worker holds never shows in its log lines, in either log format, whoever logs it."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import threading
from collections.abc import Iterator

import pytest

from rollout_core.logs import log_config
from rollout_core.secrets import hiding, redact


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_held_key_is_hidden_in_messages_tracebacks_and_other_threads(
    log_format: str,
) -> None:
    stream = io.StringIO()
    config = log_config("INFO", log_format)  # type: ignore[arg-type]
    config["handlers"]["stderr"]["stream"] = stream
    logging.config.dictConfig(config)
    logger = logging.getLogger("agent")
    with hiding("sk-HELD"):
        try:
            raise RuntimeError("the trainer refused sk-HELD")
        except RuntimeError:
            logger.exception("run() raised with %s", "sk-HELD")
        thread = threading.Thread(target=logger.warning, args=("from a thread: sk-HELD",))
        thread.start()
        thread.join()
    logger.info("after: sk-HELD")
    text = stream.getvalue()
    assert "RuntimeError: the trainer refused ***" in text.replace("\\n", "\n")
    assert "run() raised with ***" in text
    assert "from a thread: ***" in text
    assert text.count("sk-HELD") == 1  # only the line logged after the key was let go
    if log_format == "json":
        lines = [json.loads(line) for line in text.splitlines()]
        assert "***" in lines[0]["exc_info"]


@pytest.mark.parametrize(
    ("key", "text", "shown"),
    [
        # a short key: hidden where it stands alone, not inside words (whose letters it showed)
        ("e", "POST /v1/chat/completions returned 500", "POST /v1/chat/completions returned 500"),
        ("k3y", "bad key k3y; Bearer k3y,k3y.", "bad key ***; Bearer ***,***."),
        ("k3y", "k3yboard k3y_x", "k3yboard k3y_x"),
        # a long one wherever it is, inside a longer token too
        ("sk-live-0123456789", "xsk-live-0123456789abc", "x***abc"),
    ],
)
def test_a_key_is_hidden_where_it_is_the_key(key: str, text: str, shown: str) -> None:
    assert redact(text, key) == shown
