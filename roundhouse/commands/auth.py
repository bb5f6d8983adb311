"""`roundhouse auth`: the identities of a secured cluster, and the broker configuration made from them.

    roundhouse auth init --dir /etc/roundhouse/auth --namespace prod --user alice --node gpu-01
    roundhouse auth add-user bob --dir /etc/roundhouse/auth
    roundhouse auth add-node gpu-02 --dir /etc/roundhouse/auth
    roundhouse auth list --dir /etc/roundhouse/auth
    roundhouse auth server-config --dir /etc/roundhouse/auth

``init`` creates every service identity (scheduler, admission, placement, metrics), the operators
and the given users and nodes, keeping the keys of any that exist. Each change regenerates
``auth.conf``, the ``authorization`` block the NATS server configuration includes
(``include "auth.conf"``); apply it with ``nats-server --signal reload``. Hand each creds file to
its owner only (a service's ``--creds``, a user's ``ROUNDHOUSE_CREDS``): it is their secret.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schemas.roles import Role
from services.runtime.auth import AuthDirectory, CredentialsError, Issued, RegistryError

DEFAULT_DIR = Path(".roundhouse") / "auth"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("auth", help="create credentials and the NATS server's authorization config")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"credentials directory (default {DEFAULT_DIR})")
        return sub

    init = action("init", "create the service identities, operators, users and nodes (keeps existing keys)")
    init.add_argument("--namespace", default="", help="the Roundhouse namespace the permissions are for")
    init.add_argument("--operator", action="append", dest="operators", metavar="NAME",
                      help="an operator (repeatable; default: one named 'operator')")  # fmt: skip
    init.add_argument("--user", action="append", dest="users", default=[], metavar="NAME", help="repeatable")
    init.add_argument("--node", action="append", dest="nodes", default=[], metavar="NODE_ID", help="repeatable")
    for name, role in (("add-user", Role.USER), ("add-node", Role.WORKER), ("add-operator", Role.OPERATOR)):
        sub = action(name, f"add one {role.value} identity and regenerate auth.conf")
        sub.add_argument("name", help="the user name" if role is Role.USER else "the node id" if role is Role.WORKER
                         else "the operator's name")  # fmt: skip
        sub.set_defaults(role=role)
    action("list", "list the identities (role, name, creds file, public key)")
    action("server-config", "regenerate auth.conf from identities.json and print where it is")
    parser.set_defaults(handler=run)


def _print_issued(issued: list[Issued]) -> None:
    for item in issued:
        state = "created" if item.created else "kept"
        print(f"{state:7}  {item.identity.role.value:9}  {item.identity.name:24}  {item.creds}")


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "action", None)
    if action is None:
        print("usage: roundhouse auth {init,add-user,add-node,add-operator,list,server-config} [--dir DIR]",
              file=sys.stderr)  # fmt: skip
        return 2
    directory = AuthDirectory(args.dir)
    try:
        if action == "init":
            issued = directory.init(
                namespace=args.namespace, operators=args.operators or ["operator"], users=args.users, nodes=args.nodes
            )
            _print_issued(issued)
        elif action in ("add-user", "add-node", "add-operator"):
            _print_issued([directory.add(args.role, args.name)])
        elif action == "list":
            for item in directory.list():
                identity = item.identity
                print(f"{identity.role.value:9}  {identity.name:24}  {item.creds}  {identity.public_key}")
            return 0
        else:
            directory.write_server_config()
    except (RegistryError, CredentialsError) as exc:
        print(f"roundhouse auth {action}: {exc}", file=sys.stderr)
        return 2
    print(f"server authorization: {directory.server_config_path} (include it in nats-server.conf; "
          "apply changes with `nats-server --signal reload`)")  # fmt: skip
    return 0
