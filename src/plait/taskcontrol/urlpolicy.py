"""Which TaskController URLs the control plane will call (decision 46).

A controller URL is a tenant's input that makes the control plane send requests
from inside the region, so it is checked like any server-side request a tenant can
aim: at job create and update (a refused URL is a 422 naming the rule), and again
at every call, on the addresses the host name resolves to then.

Rules, first match wins, for each address the URL's host resolves to:

* ``own-api``: the control plane's own API (any of its addresses and port): refused;
* ``metadata``: cloud metadata services (169.254.169.254, fd00:ec2::254, ...):
  refused;
* ``unspecified``/``multicast``/``reserved`` addresses: refused;
* ``loopback`` and ``link-local``: refused unless the admin's allow-list names a
  network of such addresses explicitly (``plait up`` allows 127.0.0.0/8 and ::1);
* ``allow-list``: the address must be in one of the admin's networks
  (``plait serve --controller-networks``; default every address, 0.0.0.0/0 and ::/0).

A name that does not resolve when a job is created is accepted (its service may
come up later) and checked at each call; DNS rebinding between the check and the
connect remains possible, as for any resolver-based filter.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from plait.errors import ValidationError
from plait.model.redact import redact_url

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: cloud instance-metadata endpoints (AWS, GCP, Azure, OpenStack share the first)
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200"))
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal",
                            "instance-data", "instance-data.ec2.internal"})
EVERYWHERE: tuple[Network, ...] = (ipaddress.ip_network("0.0.0.0/0"),
                                   ipaddress.ip_network("::/0"))
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"),
                                 ipaddress.ip_network("::1/128"))


def networks(specs: Iterable[str]) -> tuple[Network, ...]:
    """Parse an allow-list (CIDRs; ``loopback`` and ``any`` as shorthands)."""
    out: list[Network] = []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        if spec == "loopback":
            out.extend(LOOPBACK)
        elif spec == "any":
            out.extend(EVERYWHERE)
        else:
            try:
                out.append(ipaddress.ip_network(spec, strict=False))
            except ValueError:
                raise ValidationError("controller_networks",
                                      f"{spec!r} is not a network (CIDR)") from None
    return tuple(out)


def _endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError("task_controller", f"{redact_url(url)!r} is not an http(s) URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValidationError("task_controller",
                              f"{redact_url(url)!r} has an invalid port") from None
    return parts.hostname.lower().rstrip("."), port


@dataclass(frozen=True)
class UrlPolicy:
    allow: tuple[Network, ...] = EVERYWHERE
    #: (address, port) pairs of the control plane's own API
    own: frozenset[tuple[Address, int]] = field(default_factory=frozenset)

    def host(self, url: str) -> tuple[str, int]:
        """The URL's host and port (a ``ValidationError`` for a malformed URL or a
        metadata host name)."""
        host, port = _endpoint(url)
        if host in METADATA_NAMES:
            raise refused(url, "metadata", f"{host} is a cloud metadata service")
        return host, port

    def literal(self, host: str) -> Address | None:
        try:
            return ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return None

    def check(self, url: str, addresses: Sequence[str]) -> None:
        """Refuse ``url`` (a ``ValidationError`` naming the rule) unless every address
        its host resolves to is allowed."""
        _, port = self.host(url)
        for text in addresses:
            addr = ipaddress.ip_address(text.split("%", 1)[0])
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            self._check(url, addr, port)

    def _check(self, url: str, addr: Address, port: int) -> None:
        if (addr, port) in self.own or (addr.is_loopback and any(
                a.is_loopback and p == port for a, p in self.own)):
            raise refused(url, "own-api", f"{addr} port {port} is this control plane's API")
        if addr in METADATA_ADDRESSES:
            raise refused(url, "metadata", f"{addr} is a cloud metadata service")
        for kind, flag in (("unspecified", addr.is_unspecified),
                           ("multicast", addr.is_multicast),
                           ("reserved", addr.is_reserved and not addr.is_loopback)):
            if flag:
                raise refused(url, kind, f"{addr} is a {kind} address, not a host")
        for kind, flag in (("loopback", addr.is_loopback), ("link-local", addr.is_link_local)):
            if flag and not any(n.prefixlen > 0 and addr in n for n in self.allow
                                if n.version == addr.version):
                raise refused(url, kind, f"{addr} is a {kind} address; an admin may allow "
                                         "it with plait serve --controller-networks")
        if not any(addr in n for n in self.allow if n.version == addr.version):
            raise refused(url, "allow-list", f"{addr} is in none of the allowed networks "
                          f"({', '.join(map(str, self.allow)) or 'none'})")


def refused(url: str, rule: str, why: str) -> ValidationError:
    return ValidationError("task_controller", f"controller URL {redact_url(url)!r} refused "
                                              f"(rule {rule}): {why}")


def own_addresses(urls: Iterable[str]) -> frozenset[tuple[Address, int]]:
    """The (address, port) pairs of the control plane's API URLs; a wildcard or named
    host counts as loopback (the box's own addresses)."""
    out: set[tuple[Address, int]] = set()
    for url in urls:
        try:
            host, port = _endpoint(url)
        except ValidationError:
            continue
        try:
            addr = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            addr = None
        if addr is None or addr.is_unspecified:
            out.update((a, port) for a in (ipaddress.ip_address("127.0.0.1"),
                                           ipaddress.ip_address("::1")))
        else:
            out.add((addr, port))
    return frozenset(out)
