"""The pieces of a remote call that need no socket: the answer's wire form with
``ask_again_after``, signatures, and the URL policy's rules."""

import pytest

from plait.errors import ValidationError
from plait.taskcontrol import TaskControlResponse, response_from_wire, response_to_wire, signing
from plait.taskcontrol.urlpolicy import UrlPolicy, networks, own_addresses


def test_ask_again_after_is_optional_bounded_and_round_trips():
    assert response_from_wire({"ack": ["a"]}) == TaskControlResponse(("a",), None)
    r = response_from_wire({"ack": [], "ask_again_after": 2})
    assert r.ask_again_after == 2.0 and response_from_wire(response_to_wire(r)) == r
    assert response_from_wire({"ack": [], "ask_again_after": 10**9}).ask_again_after == 3600
    # never back to back: 0 (or 0.01) is half a second
    for soon in (0, 0.01):
        assert response_from_wire({"ack": [], "ask_again_after": soon}).ask_again_after == 0.5
    for bad in ({"ack": [], "ask_again_after": -1}, {"ack": [], "ask_again_after": "1"},
                {"ack": [], "ask_again_after": True}, {"ask_again_after": 1},
                {"ack": [], "extra": 1}, {"ack": [], "ask_again_after": float("nan")}):
        with pytest.raises(ValidationError):
            response_from_wire(bad)


def test_a_signature_verifies_only_for_its_key_body_and_time():
    key = signing.job_key(b"s" * 32, "web")
    assert key != signing.job_key(b"s" * 32, "db") != signing.job_key(b"t" * 32, "web")
    header = signing.sign(key, b'{"x":1}', now=1000.0)
    signing.verify(key, header, b'{"x":1}', now=1100.0)
    for args in ((key, header, b'{"x":2}', 1000.0), (key, header, b'{"x":1}', 2000.0),
                 (signing.job_key(b"s" * 32, "db"), header, b'{"x":1}', 1000.0),
                 (key, None, b'{"x":1}', 1000.0), (key, "garbage", b'{"x":1}', 1000.0)):
        with pytest.raises(signing.SignatureError):
            signing.verify(*args)


def test_a_task_credential_is_bound_to_one_endpoint():
    key = signing.job_key(b"s" * 32, "web")
    agents = signing.task_credential(key, "web", 3)
    mine = signing.task_credential(key, "web", 3, "10.0.0.5:4100")
    assert mine == signing.endpoint_credential(agents, "10.0.0.5:4100")
    assert mine.startswith(signing.CREDENTIAL_PREFIX) and mine != agents
    assert mine == signing.task_credential(key, "web", 3, "10.0.0.5:4100")
    assert signing.task_credential(key, "web", 3, "HOST:1") == signing.task_credential(
        key, "web", 3, "host:1")  # (a host name has no case)
    others = {signing.task_credential(key, "web", 3, e) for e in
              ("10.0.0.5:4101", "10.0.0.6:4100", "10.0.0.5:41000", "")}
    others.add(signing.task_credential(key, "web", 4, "10.0.0.5:4100"))
    assert mine not in others and len(others) == 5


def test_a_task_credential_is_one_tasks_of_one_job_of_one_key():
    import hashlib
    import hmac

    key = signing.job_key(b"s" * 32, signing.key_name("web", "u1"))
    cred = signing.task_credential(key, "web", 3)
    # as documented: a known derivation a controller without plait can repeat
    assert cred == "ptc_" + hmac.new(bytes.fromhex(key), b"plait task credential v1\0web/3",
                                     hashlib.sha256).hexdigest()
    assert cred == signing.task_credential(key, "web", 3)  # (a function of its inputs)
    others = {signing.task_credential(key, "web", 4), signing.task_credential(key, "web", 30),
              signing.task_credential(key, "web3", 0), signing.task_credential(key, "db", 3),
              signing.task_credential(signing.job_key(b"s" * 32, signing.key_name("web", "u2")),
                                      "web", 3),
              signing.task_credential(signing.job_key(b"t" * 32, "web#u1"), "web", 3)}
    assert cred not in others and len(others) == 6
    # never the job's key itself, nor a TaskControl signature's MAC
    assert key not in cred and len(cred) == 4 + 64


@pytest.mark.parametrize(("allow", "url", "address", "rule"), [
    (("any",), "http://h/", "169.254.169.254", "metadata"),
    (("any",), "http://metadata.google.internal/", "10.0.0.1", "metadata"),
    (("any",), "http://h/", "169.254.1.1", "link-local"),
    (("any",), "http://h/", "127.0.0.1", "loopback"),
    (("any",), "http://h/", "::1", "loopback"),
    (("any",), "http://h/", "::ffff:127.0.0.1", "loopback"),
    (("any",), "http://h/", "0.0.0.0", "unspecified"),
    (("any",), "http://h/", "224.0.0.1", "multicast"),
    (("10.0.0.0/8",), "http://h/", "192.168.1.1", "allow-list"),
    (("loopback", "any"), "http://h:7070/", "127.0.0.1", "own-api"),
    (("loopback", "any"), "http://h:7070/", "::1", "own-api"),
])
def test_url_rules(allow, url, address, rule):
    policy = UrlPolicy(allow=networks(allow), own=own_addresses(["http://127.0.0.1:7070"]))
    with pytest.raises(ValidationError, match=f"rule {rule}"):
        policy.check(url, [address])


def test_allowed_urls():
    policy = UrlPolicy(allow=networks(["loopback", "any"]),
                       own=own_addresses(["http://0.0.0.0:7070"]))
    policy.check("http://h:9000/", ["127.0.0.1"])  # loopback named: allowed
    policy.check("http://h/", ["10.1.2.3", "2001:db8::1"])
    UrlPolicy().check("https://controller.example/", ["93.184.216.34"])
    with pytest.raises(ValidationError, match="not a network"):
        networks(["10.0.0.0/33"])
    with pytest.raises(ValidationError, match="not an http"):
        UrlPolicy().check("ftp://h/", ["10.0.0.1"])
