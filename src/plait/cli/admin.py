"""plait admin: operations on the control plane's store and shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from plait.cli.common import err, refuse
from plait.errors import PlaitError

admin_app = typer.Typer(help="Operations on the control plane's store.", no_args_is_help=True)
STORE_HELP = "sqlite:///path/plait.db (or a path) or zk://host:port[,host:port]"


admin_entitlement_app = typer.Typer(help="Entitlements across scheduler shards.",
                                    no_args_is_help=True)
admin_app.add_typer(admin_entitlement_app, name="entitlement")


@admin_entitlement_app.command("move")
def admin_entitlement_move(
    name: Annotated[str, typer.Argument(help="the entitlement")],
    to_shard: Annotated[int, typer.Option("--to-shard", min=0,
                                          help="the scheduler shard to manage it from now on")],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Move an entitlement to another scheduler shard, without restarting any of its
    tasks (its jobs accept no changes for the moment it takes)."""
    from plait.cli.common import guarded
    from plait.cli.daemons import entitlement_move

    guarded(entitlement_move)(name, to_shard=to_shard, output=output)


@admin_app.command("certs")
def admin_certs(
    out: Annotated[Path, typer.Option(help="where the CA and certificates are written")],
    host: Annotated[list[str], typer.Option(
        help="a name or address the control plane is reached at (repeatable)")],
    days: Annotated[int, typer.Option(min=1, help="validity of the server certificate")]
    = 365,
) -> None:
    """A small CA and a server certificate for a lab: ca.pem (give it to clients and
    agents with --ca-file), server.pem and server-key.pem (plait serve --tls-cert
    --tls-key). An existing CA in --out is reused."""
    from plait.tls import make_lab_certs

    try:
        paths = make_lab_certs(out, host, days)
    except PlaitError as exc:
        raise refuse(exc) from None
    for kind, path in paths.items():
        print(f"{kind:>10}: {path}")


def _store_url(store: str | None, data_dir: Path) -> str:
    """The store named by --store, or the SQLite store ``plait serve --data-dir``
    keeps there; a store that does not exist is refused (never made empty)."""
    if store is None:
        db = data_dir / "plait.db"
        if not db.is_file():
            raise refuse(PlaitError(f"no store in {data_dir} (no {db}): give --data-dir, "
                                    "or --store sqlite:///path or zk://host:port"))
        return f"sqlite://{db.resolve()}"
    path = store[len("sqlite://"):] if store.startswith("sqlite://") else (
        None if store.startswith("zk://") else store)
    if path is not None and not Path(path).is_file():
        raise refuse(PlaitError(f"no SQLite store at {path}"))
    return store


@admin_app.command("backup")
def admin_backup(
    file: Annotated[Path, typer.Argument(help="where to write the backup (JSON)")],
    store: Annotated[str | None, typer.Option(envvar="PLAIT_STORE", help=STORE_HELP)] = None,
    data_dir: Annotated[Path, typer.Option(
        help="the data dir of plait serve, whose store is backed up when no --store")]
    = Path(".plait"),
) -> None:
    """Write a consistent snapshot of every persistent key to FILE (mode 0600: it
    holds token hashes). Refused for a store that does not exist or holds nothing."""
    import os
    import tempfile

    from plait.store.backup import backup, dumps, open_store

    url = _store_url(store, data_dir)
    try:
        st = open_store(url)
    except PlaitError as exc:
        raise refuse(exc) from None
    try:
        document = backup(st)
    except PlaitError as exc:
        raise refuse(exc) from None
    finally:
        st.close()
    if not document["keys"]:
        raise refuse(PlaitError(f"the store at {url} holds nothing: no backup written"))
    try:  # a private file beside the target, renamed over it once whole
        fd, tmp = tempfile.mkstemp(dir=file.resolve().parent, prefix=f".{file.name}.")
        with os.fdopen(fd, "w") as out:
            out.write(dumps(document))
        os.replace(tmp, file)
    except OSError as exc:
        raise refuse(PlaitError(f"cannot write {file}: {exc.strerror}")) from None
    err.print(f"{len(document['keys'])} keys written to {file}")


@admin_app.command("restore")
def admin_restore(
    file: Annotated[str, typer.Argument(help="a backup written by 'plait admin backup'")],
    store: Annotated[str | None, typer.Option(envvar="PLAIT_STORE", help=STORE_HELP)] = None,
    data_dir: Annotated[Path, typer.Option(
        help="the data dir of plait serve, whose store is restored into when no --store")]
    = Path(".plait"),
) -> None:
    """Load FILE into an empty store (all keys in one transaction, or none)."""
    from plait.server.serve import store_for
    from plait.store.backup import open_store, restore

    try:
        with open(file) as src:
            document = json.load(src)
    except (OSError, ValueError) as exc:
        raise refuse(PlaitError(f"{file}: {exc}")) from None
    try:
        st = open_store(store) if store else store_for(data_dir)  # (a new one: 0700, 0600)
    except (PlaitError, OSError) as exc:
        raise refuse(PlaitError(str(exc))) from None
    try:
        n = restore(st, document)
    except PlaitError as exc:
        raise refuse(exc) from None
    finally:
        st.close()
    err.print(f"{n} keys restored from {file}")
