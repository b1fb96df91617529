"""The ``plait`` console script, and a fast path for its most frequent call.

Scripts and CD systems run ``plait job deploy FILE`` many times a second; each run is a
new interpreter, and the full command (Typer, Click, Rich, the SDK, ``http.client``)
costs about 110 ms of CPU before the request is sent. For exactly that form (no
option, an ``http`` context without a CA file), this module reads the spec, sends the
one ``PUT /v1/jobs/{name}`` and prints the line the full command prints, importing
only the YAML parser and the client configuration. Anything else, including every
answer but a success and every error, goes to the full command (``plait.cli.main``),
which sends the request again (a PUT of the same spec is idempotent) and reports it
its usual way: the fast path decides nothing the full command would decide
differently.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from urllib.parse import quote, urlsplit

TYPE_CHECKING = False  # (not ``typing.TYPE_CHECKING``: importing typing costs 3 ms here)
if TYPE_CHECKING:
    from typing import Any

#: the largest answer the fast path reads (a job view is a few kB)
MAX_ANSWER = 1 << 20
#: seconds for the whole call (the full command's default too)
TIMEOUT = 30.0


def run() -> None:
    """The ``plait`` console script."""
    code = deploy(sys.argv)
    if code is None:
        from plait.cli.main import run as full

        full()
        return
    sys.stdout.flush()
    os._exit(code)  # (nothing to tear down: the interpreter's teardown is skipped)


def deploy(argv: list[str]) -> int | None:
    """``plait job deploy FILE``, when it can be done without the full command: the
    exit code (after printing what the full command prints), or None to run the
    full command instead."""
    if len(argv) != 4 or argv[1:3] != ["job", "deploy"] or argv[3].startswith("-"):
        return None
    try:
        body = _spec(argv[3])
        if body is None:
            return None
        from plait.clientconfig import ClientConfig

        ctx = ClientConfig.load().resolve()
        if ctx.ca_file or len(ctx.urls) != 1 or not ctx.token:
            return None
        answer = _put(ctx.urls[0], f"/v1/jobs/{quote(body['name'], safe='')}",
                      json.dumps(body).encode(), ctx.token)
    except Exception:  # whatever it is, the full command says it properly
        return None
    if answer is None or not isinstance(answer.get("version"), int):
        return None
    how = ("created" if answer.get("created") else
           "unchanged: the job runs this spec already" if answer.get("unchanged") else "updated")
    print(f"job {body['name']}: version {answer['version']} stored ({how})", file=sys.stderr,
          flush=True)
    return 0


def _spec(path: str) -> dict[str, Any] | None:
    """The file's one job spec, when it is one plain mapping with a name. A JSON
    file is read without a YAML parser (importing one is a third of this path)."""
    from plait.cli import specfile  # (bounded, text only, no duplicate keys)

    text = specfile.read(path)
    if text.lstrip().startswith("{"):
        docs = [specfile.parse_json(text, path)]
    else:
        docs = specfile.parse_yaml(text, path)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        return None
    doc = docs[0]
    name = doc.get("name")
    if not isinstance(name, str) or not name or (
            len(doc) == 1 and isinstance(next(iter(doc.values())), list)):
        return None  # a list of jobs under a key: the full command explains
    return doc


def _put(url: str, path: str, body: bytes, token: str) -> dict[str, Any] | None:
    """One PUT over a plain connection; the answer's JSON for a 200 or 201, else
    None. (``http.client`` is not used: importing it, with ``email`` and ``ssl``,
    costs more CPU than the rest of this path.)"""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.path not in ("", "/"):
        return None
    host, port = parts.hostname, parts.port or 80
    for value in (token, parts.netloc):  # (nothing that could end a header line)
        if not (value.isascii() and value.isprintable()) or " " in value:
            return None
    head = (f"PUT {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    with socket.create_connection((host, port), timeout=TIMEOUT) as conn:
        conn.sendall(head.encode("latin-1") + body)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_ANSWER:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    raw = b"".join(chunks)
    header, sep, content = raw.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = header.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or status[1] not in ("200", "201"):
        return None
    fields = {k.strip().lower(): v.strip() for k, _, v in
              (line.partition(":") for line in lines[1:])}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return None
    length = fields.get("content-length")
    if length is None or not length.isdigit() or int(length) != len(content):
        return None
    answer = json.loads(content)
    return answer if isinstance(answer, dict) else None
