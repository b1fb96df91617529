"""Creates carried to a shard together: the wire form of ``POST /v1/shard/creates``.

The front end takes single-job creates from many callers; each one it would forward as
a request of its own costs the shard's leader a request's whole handling (the HTTP
parse, the middleware, an answer written) and the front end a hop. Creates that wait
for the same shard at once go in one request instead, and each is answered from its
part of the answer. Each create keeps its caller's token and request id: the shard
checks every one as if it had come alone, so a batch can do nothing its parts could
not.

A batch (``CONTENT_TYPE``) is its creates one after another, each a line of JSON
(``{"authorization": ..., "request_id": ..., "length": N}``) and then its body, the
N bytes the caller sent. The answer (the same type) is, per create in order, a line
``STATUS LENGTH`` and then the LENGTH bytes of its JSON answer; status 0 (length 0)
says that the create is not one the batch path answers (a refusal, an error, a token
the leader has not verified yet, a TaskController to check): the front end sends that
one alone, and its caller gets the route's own answer, word for word."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import Scope

from plait import fastjson

CONTENT_TYPE = "application/x-plait-creates"
PATH = "/v1/shard/creates"
#: creates in one batch at most, and bytes of their bodies (the request stays well
#: under the API's body limit, ``proxy.MAX_BODY``)
MAX_ITEMS = 256
MAX_BYTES = 512 * 1024
#: a body larger than this is never batched (sent alone)
MAX_ITEM = 16 * 1024
JSON = b"application/json"


class BadBatch(ValueError):
    """The request or answer is not in the batch's wire form (the reason says where)."""


@dataclass(frozen=True, slots=True)
class Item:
    authorization: str
    request_id: str
    body: bytes


def encode(items: list[Item]) -> bytes:
    out: list[bytes] = []
    for it in items:
        out.append(fastjson.dumps({"authorization": it.authorization,
                                   "request_id": it.request_id, "length": len(it.body)}))
        out.append(b"\n")
        out.append(it.body)
    return b"".join(out)


def decode(data: bytes, max_items: int = MAX_ITEMS) -> list[Item]:
    items: list[Item] = []
    at = 0
    while at < len(data):
        if len(items) >= max_items:
            raise BadBatch(f"more than {max_items} creates in one batch")
        end = data.find(b"\n", at)
        if end < 0:
            raise BadBatch(f"create {len(items)}: no header line")
        try:
            head = fastjson.loads(data[at:end])
            auth, rid, length = head["authorization"], head["request_id"], head["length"]
        except (ValueError, KeyError, TypeError):
            raise BadBatch(f"create {len(items)}: the header line is not "
                           '{"authorization", "request_id", "length"} JSON') from None
        if not (isinstance(auth, str) and isinstance(rid, str) and isinstance(length, int)
                and 0 <= length <= len(data) - end - 1):
            raise BadBatch(f"create {len(items)}: a header field of the wrong type, or a "
                           "length past the end of the batch")
        items.append(Item(auth, rid, data[end + 1:end + 1 + length]))
        at = end + 1 + length
    return items


def encode_answers(answers: list[tuple[int, bytes] | None]) -> bytes:
    out: list[bytes] = []
    for a in answers:
        status, body = a if a is not None else (0, b"")
        out.append(b"%d %d\n" % (status, len(body)))
        out.append(body)
    return b"".join(out)


def decode_answers(data: bytes, count: int) -> list[tuple[int, bytes] | None]:
    answers: list[tuple[int, bytes] | None] = []
    at = 0
    while at < len(data):
        end = data.find(b"\n", at)
        try:
            status_s, length_s = data[at:end].split(b" ")
            status, length = int(status_s), int(length_s)
        except ValueError:
            raise BadBatch(f"answer {len(answers)}: not a 'STATUS LENGTH' line") from None
        if end < 0 or length < 0 or end + 1 + length > len(data):
            raise BadBatch(f"answer {len(answers)}: a length past the end")
        answers.append(None if status == 0 else (status, data[end + 1:end + 1 + length]))
        at = end + 1 + length
    if len(answers) != count:
        raise BadBatch(f"{len(answers)} answers to {count} creates")
    return answers


# -- which requests a hot path may take (a shard's; a batch the front end makes) --
def is_json(content_type: bytes) -> bool:
    """Is this Content-Type JSON itself (``application/json``, its parameters aside)?
    The routes take other JSON types too (``+json``): those go to the route."""
    return content_type.split(b";", 1)[0].strip().lower() == JSON


def headers_once(scope: Scope) -> tuple[bytes | None, bytes | None] | None:
    """(Authorization, Content-Type) of the request, each None when absent; None when
    either is given more than once (the route reads the first, as Starlette does)."""
    auth = ctype = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if auth is not None:
                return None
            auth = value
        elif name == b"content-type":
            if ctype is not None:
                return None
            ctype = value
    return auth, ctype


def plain_headers(scope: Scope) -> tuple[bytes, bytes] | None:
    """(Authorization, Content-Type) of a request a hot path may answer: each given
    once, the type JSON itself; None otherwise, for the route to answer (a repeated
    header is read there as Starlette reads it, and refused or taken there)."""
    given = headers_once(scope)
    if given is None or given[0] is None or given[1] is None or not is_json(given[1]):
        return None
    return given[0], given[1]
