"""Credentials in URLs are shown as ***: a password (or a user alone), and the
values of query parameters that look like secrets; the rest of the URL as written."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.model.redact import redact_text, redact_url, secret_param, shown_intent, shown_spec


@pytest.mark.parametrize(("url", "shown"), [
    ("http://u:p@h:80/x", "http://u:***@h:80/x"),
    ("https://tok3n@h/", "https://***@h/"),
    ("http://u:p%40ss@word@h/", "http://u:***@h/"),
    ("http://h/x?a=1&api_key=S&API-KEY=S&Token=T", "http://h/x?a=1&api_key=***&API-KEY=***&Token=***"),
    ("http://h/?access_token=A;X-Amz-Signature=B&sig=C&password=D&secret=E&key=F",
     "http://h/?access_token=***;X-Amz-Signature=***&sig=***&password=***&secret=***&key=***"),
    ("http://h/?api%5Fkey=S&stage=1", "http://h/?api%5Fkey=***&stage=1"),
    ("http://h/cb#access_token=Z&state=1", "http://h/cb#access_token=***&state=1"),
    ("http://h/p?q=1#frag", "http://h/p?q=1#frag"),
    ("http://h/x?key=&flag", "http://h/x?key=&flag"),
    ("http://h:8080", "http://h:8080"),
    ("not a url", "not a url"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("name", ["api_key", "apikey", "TOKEN", "access_token", "Secret",
                                  "password", "passwd", "pwd", "X-Amz-Signature", "sig",
                                  "client_secret", "X-Goog-Credential", "auth"])
def test_secret_looking_parameters(name: str) -> None:
    assert secret_param(name)


@pytest.mark.parametrize("name", ["job", "stage", "region", "page", "format", "design"])
def test_plain_parameters(name: str) -> None:
    assert not secret_param(name)


def test_every_url_in_a_message_is_redacted() -> None:
    said = ("controller http://a:pw1@h/tc?token=t1: ConnectError; gate 'https://h/g?key=k2' "
            "answered 500")
    shown = redact_text(said)
    assert shown == ("controller http://a:***@h/tc?token=***: ConnectError; gate "
                     "'https://h/g?key=***' answered 500")
    assert redact_text("no url here") == "no url here"


def test_views_of_specs_and_intents() -> None:
    spec = {"name": "web", "task_controller": "http://u:p@h/?token=t", "args": ["x"]}
    assert shown_spec(spec) == {**spec, "task_controller": "http://u:***@h/?token=***"}
    assert spec["task_controller"] == "http://u:p@h/?token=t"  # (not changed in place)
    assert shown_spec({"name": "web", "task_controller": None})["task_controller"] is None
    push = {"intent": {"spec": spec, "stages": [50], "gate": {"url": "http://g/?key=k",
                                                             "external": False}},
            "status": {"message": "http://g/?key=k answered 500", "phase": "rolled_back"}}
    shown = shown_intent(push)
    assert shown["intent"]["gate"]["url"] == "http://g/?key=***"
    assert shown["intent"]["spec"]["task_controller"] == "http://u:***@h/?token=***"
    assert shown["status"] == {"message": "http://g/?key=*** answered 500",
                               "phase": "rolled_back"}
    assert shown_intent({"intent": {"spec": spec, "gate": None}})["intent"]["gate"] is None


#: what a URL's user or password may hold as plait takes it (no space, no control)
URL_TEXT = {"blacklist_categories": ("Zs", "Zl", "Zp", "Cc", "Cs")}


@given(user=st.text(st.characters(**URL_TEXT, blacklist_characters="@/?#:"), min_size=1),
       password=st.text(st.characters(**URL_TEXT, blacklist_characters="@/?#&;"), min_size=4),
       host=st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True))
def test_a_password_never_shows(user: str, password: str, host: str) -> None:
    url = f"https://{user}:{password}@{host}/path?token={password}&x=1"
    shown = redact_url(url)
    assert shown == f"https://{user}:***@{host}/path?token=***&x=1"
    assert redact_text(f"said {url} here") == f"said {shown} here"


@given(st.text())
def test_never_raises(text: str) -> None:
    redact_url(text)
    redact_text(text)
