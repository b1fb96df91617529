"""The client configuration: named contexts of (API URL, token), like a kubeconfig.

Kept in ``$PLAIT_CONFIG`` or ``~/.config/plait/config.yaml``, file mode 0600 (it
holds tokens)::

    current_context: local
    contexts:
      local: {url: "http://127.0.0.1:7070", token: "plait_..."}
      prod:  {url: "https://cp1:7070,https://cp2:7070", token: "plait_...", ca_file: ca.pem}

plait writes it as JSON, which is YAML too (edit it as either): a command then reads
it without a YAML parser. A context's ``url`` may list several URLs, comma-separated
(the replicas of a control plane, or several front ends): clients fail over between
them.

``PLAIT_URL`` and ``PLAIT_TOKEN`` override the current context's values (not a
context named with ``--context``), and flags override both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from plait.errors import ValidationError


def default_path() -> Path:
    env = os.environ.get("PLAIT_CONFIG")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "plait" / \
        "config.yaml"


# (plain classes, not dataclasses: importing ``dataclasses`` costs a fast ``plait job
# deploy`` about a fifth of its CPU)
class Context:
    __slots__ = ("ca_file", "token", "url")

    def __init__(self, url: str, token: str | None = None, ca_file: str | None = None) -> None:
        #: one URL, or several comma-separated
        self.url = url
        self.token = token
        #: the CA certificate the API's TLS certificate is checked against (https
        #: URLs; default: the system's authorities)
        self.ca_file = ca_file

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and (self.url, self.token, self.ca_file) == (
            other.url, other.token, other.ca_file)

    def __repr__(self) -> str:
        return f"Context(url={self.url!r}, ca_file={self.ca_file!r})"  # (never the token)

    @property
    def urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.url.split(",") if u.strip()]


class ClientConfig:
    def __init__(self, current_context: str | None = None,
                 contexts: dict[str, Context] | None = None) -> None:
        self.current_context = current_context
        self.contexts: dict[str, Context] = {} if contexts is None else contexts

    @classmethod
    def load(cls, path: Path | None = None) -> ClientConfig:
        path = path or default_path()
        if not path.exists():
            return cls()
        text = path.read_text()
        try:  # written as JSON (which is YAML) by ``save``: no YAML parser needed
            data = json.loads(text)
        except ValueError:  # edited by hand
            import yaml

            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError as exc:
                raise ValidationError(str(path), f"not valid YAML: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("contexts", {}), dict):
            raise ValidationError(str(path), "expected current_context and a contexts mapping")
        contexts = {}
        for name, ctx in (data.get("contexts") or {}).items():
            if not isinstance(ctx, dict) or not isinstance(ctx.get("url"), str):
                raise ValidationError(f"{path}: contexts.{name}", "expected {url, token}")
            contexts[str(name)] = Context(ctx["url"], ctx.get("token"), ctx.get("ca_file"))
        return cls(data.get("current_context"), contexts)

    def save(self, path: Path | None = None) -> Path:
        path = path or default_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        # JSON, which is YAML too: the file may be edited as YAML, and a command reads
        # it without importing a YAML parser (a fifth of a fast ``plait job deploy``)
        text = json.dumps({
            "current_context": self.current_context,
            "contexts": {n: {"url": c.url, "token": c.token,
                             **({"ca_file": c.ca_file} if c.ca_file else {})}
                         for n, c in self.contexts.items()},
        }, indent=2, sort_keys=True) + "\n"
        # a new private file beside it (mkstemp: mode 0600, never an existing file or a
        # symlink), then renamed over the old one
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def own_context(self, name: str, url: str) -> str:
        """The context a region served at ``url`` writes, asked to be ``name``: that
        one, unless it holds another region's URL (kept: its token may be the only
        copy the user has at hand); then ``name-PORT`` (or ``name-2``, ...)."""
        held = self.contexts.get(name)
        if held is None or held.url == url:
            return name
        port = url.rsplit(":", 1)[-1].split("/", 1)[0]
        candidates = [f"{name}-{port}"] if port.isdigit() else []
        candidates += [f"{name}-{n}" for n in range(2, 1000)]
        for candidate in candidates:
            other = self.contexts.get(candidate)
            if other is None or other.url == url:
                return candidate
        raise ValidationError("context", f"no free context name like {name!r}")

    def set_context(self, name: str, url: str, token: str | None, use: bool = True,
                    ca_file: str | None = None) -> None:
        """``ca_file`` is kept as an absolute path: the configuration is read from any
        directory."""
        if ca_file is not None:
            ca_file = os.path.abspath(ca_file)
        self.contexts[name] = Context(url, token, ca_file)
        if use or self.current_context is None:
            self.current_context = name

    def resolve(self, context: str | None = None, url: str | None = None,
                token: str | None = None) -> Context:
        """The URL and token to use: flags, then PLAIT_URL/PLAIT_TOKEN, then the context
        (and the CA file: PLAIT_CA_FILE, then the context's)."""
        name = context or self.current_context
        base = self.contexts.get(name) if name else None
        if context and base is None:
            raise ValidationError("context", f"no context {context!r} in the configuration")
        # an explicit --context beats the environment (never one's token to another's URL)
        env_url = None if context else os.environ.get("PLAIT_URL")
        env_token = None if context else os.environ.get("PLAIT_TOKEN")
        if token is not None and not token.strip():
            # (an empty --token fell back to the configuration's, an admin's: a script
            # whose variable was unset acted as the admin)
            raise ValidationError("token", "--token is empty: give a token, or leave the "
                                           "option out to use PLAIT_TOKEN or the context's")
        if token is None and env_token is not None and not env_token.strip():
            raise ValidationError("token", "PLAIT_TOKEN is set and empty: give a token, or "
                                           "unset it to use the context's")
        final_url = url or env_url or (base.url if base else None)
        final_token = token or env_token or (base.token if base else None)
        if not final_url:
            raise ValidationError("url", "no API URL: start `plait serve`, or set PLAIT_URL or "
                                         "--url")
        env_ca = None if context else os.environ.get("PLAIT_CA_FILE")
        found = Context(final_url, final_token, env_ca or (base.ca_file if base else None))
        for u in found.urls:
            from urllib.parse import urlsplit

            try:
                parts = urlsplit(u)
                parts.port  # noqa: B018 (raises for a port that is not a number)
            except ValueError as exc:
                raise ValidationError("url", f"{u!r} is not a valid URL: {exc}") from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValidationError("url", f"{u!r} is not an http(s) URL")
        return Context(",".join(found.urls), found.token, found.ca_file)
