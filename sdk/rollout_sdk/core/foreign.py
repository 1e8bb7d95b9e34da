"""What an error may say: never bytes another service sent.

A trainer names the addresses the SDK calls; the service there may be anything, and what it
sends can end up in an exception's text — httpx's ``RemoteProtocolError`` quotes an illegal
status line (an SSH banner, a secret in it), pydantic's ``ValidationError`` quotes the values
it refused, the OpenAI client's ``APIError`` quotes an error event's message. Such text must
never reach a stored result, a returned error, a log line, a trace or a metric: the trainer
would read back a service it could not reach itself.

One rule, here: an exception whose class comes from a library that parses what it received
(:data:`FOREIGN_MODULES`, and pydantic's validation errors) is told by its type and what the
SDK knows of the call (method, address), never by its text; the SDK's own exceptions say
what they say (their messages are built from our words and the trainer's own request). Every
place that stores, returns, logs or traces an error goes through :func:`describe` (a message)
or :func:`format_exception` (a traceback).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator

import httpx
from pydantic import ValidationError

# Libraries whose exceptions quote what they received.
FOREIGN_MODULES = ("httpx", "httpcore", "h11", "h2", "hpack", "pydantic_core", "pydantic")
# OpenAI client errors whose text is the client's own fixed words.
_OPENAI_OWN_WORDS = frozenset({"APIConnectionError", "APITimeoutError"})


def _module_root(cls: type) -> str:
    return cls.__module__.split(".", 1)[0]


def is_foreign_type(module: str, name: str) -> bool:
    """Whether an exception class (by its module and name) may quote received bytes."""
    root = module.split(".", 1)[0]
    if root in FOREIGN_MODULES:
        return True
    return root == "openai" and name not in _OPENAI_OWN_WORDS


def quotes_foreign_bytes(exc: BaseException) -> bool:
    """Whether ``exc``'s own text may quote bytes another service sent (its class, or the
    nearest class of the library it comes from, is one of :data:`FOREIGN_MODULES`; the SDK's
    subclasses of those speak its own words)."""
    for cls in type(exc).__mro__:
        root = _module_root(cls)
        if root in ("rollout_sdk", "rollout_core", "rollout_worker", "rollout_gateway"):
            return False
        if root in ("builtins",):
            return False
        if is_foreign_type(cls.__module__, cls.__name__):
            return True
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def named(request: httpx.Request) -> str:
    """A request as an error names it: method and URL without credentials or query."""
    url = request.url
    return f"{request.method} {url.scheme}://{url.netloc.decode('ascii')}{url.path}"


def _call(exc: BaseException) -> str:
    """The request an httpx/httpcore error was about, as the SDK sent it (:func:`named`)."""
    for link in _chain(exc):
        try:
            request = link.request  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # httpx raises the latter when it has none
            continue
        if isinstance(request, httpx.Request):
            return named(request)
    return ""


def answered(response: httpx.Response) -> str:
    """What a failed answer may say: the request and the status with its standard reason
    phrase (``POST http://host/v1/chat/completions returned 404 Not Found``). Never the body,
    nor the server's own phrase."""
    request = response.request
    reason = httpx.codes.get_reason_phrase(response.status_code) or "(unknown status)"
    return f"{request.method} {request.url} returned {response.status_code} {reason}"


def _status(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f" (HTTP {status})" if isinstance(status, int) else ""


def foreign_texts(exc: BaseException) -> list[str]:
    """The texts of the foreign exceptions in ``exc``'s chain (longest first), to be found
    where some code quoted them into its own message."""
    texts = {str(link) for link in _chain(exc) if quotes_foreign_bytes(link)}
    return sorted((text for text in texts if len(text) >= 4), key=len, reverse=True)


def scrub(text: str, exc: BaseException) -> str:
    """``text`` with the text of every foreign exception of ``exc``'s chain cut out (a message
    some code built by quoting one)."""
    for foreign in foreign_texts(exc):
        text = text.replace(foreign, "(text not shown)")
    return text


def _validation(exc: ValidationError) -> str:
    """Where a value failed validation and why, without the value."""
    problems = exc.errors(include_url=False, include_input=False, include_context=False)
    shown = [f"{'.'.join(map(str, p['loc'])) or 'value'}: {p['msg']}" for p in problems[:3]]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return f"{exc.title} is invalid: " + "; ".join(shown) + more


def _own_words(exc: BaseException) -> BaseException | None:
    """The first exception of ``exc``'s chain that is the SDK's own account of a refused
    call (a class with ``own_words = True``: the destination policy's refusal, a capped
    answer), which a library then wrapped in its own words or in foreign ones."""
    return next((link for link in _chain(exc) if getattr(type(link), "own_words", False)), None)


def describe(exc: BaseException) -> str:
    """One line for ``exc`` that an error message, record, log line or trace may carry.

    The SDK's own account of a refused call if one is behind ``exc`` (a refused destination,
    an answer over its cap), however a library wrapped it ("Connection error."). Else, a
    foreign exception: its type, the call and the status it was about ("POST
    http://host/v1/chat/completions failed: RemoteProtocolError"). Others: their text, with
    any foreign exception's text from their chain that they quote cut out."""
    own = _own_words(exc)
    if own is not None and own is not exc:  # however a library or framework wrapped it
        return str(own)
    if isinstance(exc, ValidationError):
        return _validation(exc)
    if quotes_foreign_bytes(exc):
        response = getattr(exc, "response", None)  # the OpenAI client's status errors
        if isinstance(response, httpx.Response):
            return answered(response)
        call = _call(exc)
        kind = type(exc).__name__ + _status(exc)
        return f"{call} failed: {kind}" if call else kind
    text = str(exc) or type(exc).__name__
    return scrub(text, exc)


def format_exception(exc: BaseException) -> str:
    """``exc``'s traceback as ``traceback.format_exception`` prints it, each exception of the
    chain told by :func:`describe` instead of its text."""
    parts: list[str] = []
    links = []
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        links.append(current)
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            current = current.__context__
        else:
            current = None
    for index, link in enumerate(reversed(links)):
        if index:
            newer = links[len(links) - index - 1]
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if newer.__cause__ is link
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        if link.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(
                traceback.StackSummary.extract(traceback.walk_tb(link.__traceback__)).format()
            )
        kind = type(link)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else (f"{kind.__module__}.{kind.__qualname__}")
        )
        parts.append(f"{name}: {describe(link)}\n")
    return "".join(parts)


__all__ = [
    "FOREIGN_MODULES",
    "answered",
    "describe",
    "foreign_texts",
    "format_exception",
    "is_foreign_type",
    "named",
    "quotes_foreign_bytes",
    "scrub",
]
