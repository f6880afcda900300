"""What travels over HTTP to `bertkit serve`: a request's JSON read and checked, and
predictions made valid JSON.

A request is `{"inputs": [...]}`, each input what `bertkit predict` takes on one line (a
text, a `[text, text_pair]` pair, `{"question", "context"}`, a list of words), plus the
run's task's predict options by keyword (classification's `{"top_k": 3}`). Each mistake
is a `RequestError` with the HTTP status it answers and one line:

    400  not JSON, not an object, a missing or unknown field, a value of the wrong type
    413  a body, or a request's texts, over the server's limits; too many inputs
    422  an input the model cannot take (its `parse_inputs` message: `input 3: ...`)
"""

from __future__ import annotations

import json
import math
import sys

# The most inputs one request may hold: a larger job is a file for `bertkit predict`.
MAX_REQUEST_INPUTS = 2048
# The most bytes a request body may hold: a request's texts are at most
# `bertkit.files.MAX_REQUEST_CHARACTERS` characters, each at most 4 bytes of UTF-8,
# or 6 as a JSON escape (\\uXXXX); with room for the JSON around them.
MAX_BODY_BYTES = 8 * 1024 * 1024


class RequestError(Exception):
    """A request the server cannot answer: `status` (4xx) and a one-line `message`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def read_request(body: bytes, option_keywords=(), max_inputs: int = MAX_REQUEST_INPUTS):
    """`(inputs, options)` of a request body: the list of inputs (not yet checked against
    the task) and `{keyword: whole number}` of the task's predict options it gives.

    Example:
        >>> read_request(b'{"inputs": ["a good film"], "top_k": 2}', ["top_k"])
        (['a good film'], {'top_k': 2})
        >>> read_request(b'{"texts": ["a"]}')
        Traceback (most recent call last):
        ...
        bertkit.serving.protocol.RequestError: unknown field 'texts'; expected 'inputs'
    """
    request = json_object(body)
    unknown = sorted(set(request) - {"inputs", *option_keywords})
    if unknown:
        taken = ", ".join(f"'{name}'" for name in ("inputs", *option_keywords))
        raise RequestError(400, f"unknown field '{unknown[0]:.40}'; expected {taken}")
    inputs = request.get("inputs")
    if "inputs" not in request:
        raise RequestError(400, "missing field 'inputs': expected {\"inputs\": [...]}")
    if not isinstance(inputs, list):
        raise RequestError(400, f"'inputs' must be a list of inputs, got {kind(inputs)}")
    if not inputs:
        raise RequestError(400, "'inputs' is empty: expected at least one input")
    if len(inputs) > max_inputs:
        raise RequestError(
            413,
            f"{len(inputs):,} inputs, over the limit of {max_inputs:,} a request; "
            "send fewer inputs per request",
        )
    return inputs, {key: _option(key, request[key]) for key in option_keywords if key in request}


def json_object(body: bytes) -> dict:
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RequestError(400, f"the body is not JSON: {reason:.120}") from None
    except RecursionError:  # [[[[...]]]] nested deeper than Python's stack
        raise RequestError(400, "the body is not JSON we read: nested too deeply") from None
    except ValueError:  # Python turns at most sys.get_int_max_str_digits() digits into an int
        raise RequestError(
            400,
            f"the body is not JSON we read: "
            f"a number of over {sys.get_int_max_str_digits():,} digits",
        ) from None
    if not isinstance(request, dict):
        raise RequestError(400, f'expected a JSON object {{"inputs": [...]}}, got {kind(request)}')
    return request


def _option(key: str, value) -> int:
    """A predict option's value: a whole number of at least 1, as `bertkit predict`'s flag."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"'{key}' must be a whole number of at least 1, got {value!r:.40}")
    return value


def check_request_characters(inputs: list, max_request_characters: int) -> None:
    """A request's texts together are at most `max_request_characters` characters (each
    input's own bound is checked with the task's `parse_inputs`)."""
    count = sum(len(text) for text in strings_in(inputs))
    if count > max_request_characters:
        raise RequestError(
            413,
            f"the request's texts are {count:,} characters, over the limit of "
            f"{max_request_characters:,} a request; send fewer texts per request",
        )


def strings_in(value):
    """The strings in `value` and, without recursion (JSON can nest deeply), in its lists,
    tuples and dicts (keys included)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            pending += item


def kind(value) -> str:
    """A JSON value's kind for a message: `a number`, `an object`, ..."""
    kinds = {dict: "an object", list: "a list", str: "a text", bool: "true or false"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


def finite(value):
    """JSON has no NaN or infinity: a diverged model's scores are answered as null.

    Example:
        >>> finite({"score": float("nan"), "top_k": [{"score": 0.5}]})
        {'score': None, 'top_k': [{'score': 0.5}]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_line(value) -> bytes:
    """`value` as one line of JSON (UTF-8, NaN as null), as `bertkit predict` prints it."""
    text = json.dumps(finite(value), ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")
