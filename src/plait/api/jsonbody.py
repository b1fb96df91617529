"""Request bodies are UTF-8 JSON: FastAPI reads a body with ``json.loads``, which
takes UTF-16 and UTF-32 too (and a UTF-8 byte order mark), though the API says
UTF-8. ``Utf8Route`` (an app's ``router.route_class``, set before its routes) reads
them with ``plait.fastjson``, which refuses what is not UTF-8 with a decode error
naming the encoding: FastAPI answers it as any body that is not JSON (a 422)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from plait import fastjson


class Utf8Request(Request):
    """A request whose ``json()`` is ``plait.fastjson.loads`` of its body."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = fastjson.loads(await self.body())
        return self._json


class Utf8Route(APIRoute):
    """A route whose handler reads its request as a ``Utf8Request``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def utf8_handler(request: Request) -> Response:
            return await handler(Utf8Request(request.scope, request.receive))

        return utf8_handler
