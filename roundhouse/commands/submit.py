"""`roundhouse submit`: submit a job from a YAML spec, or from flags and a command line.

    roundhouse submit job.yaml
    roundhouse submit --gpus 2 --kind te --name trial -- python train.py --lr 0.1
    roundhouse submit --gpus 2 --distributed -- python examples/train_ddp.py

The job's working directory is the directory `submit` ran in (``--workdir`` or a spec's ``workdir:``
overrides it), as with ``sbatch``; ``--distributed`` starts one process per GPU with torch.distributed's
environment, otherwise a job is one process seeing all its GPUs.

The spec is validated here first, so a malformed one is refused with the field and the rule before
anything is sent; then admission's verdict is printed (accepted, held or rejected, with the reason).
What it needs beyond parsing its flags (pydantic, the client, YAML for a spec file) is imported when
it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roundhouse.commands.common import add_endpoint_flags, with_client

if TYPE_CHECKING:
    from roundhouse.client import Client, Verdict
    from schemas.job import JobSpec

EXIT_REJECTED = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("submit", help="submit a job (YAML spec, or flags -- CMD ARGS...)")
    parser.add_argument("spec", nargs="?", type=Path, help="YAML (or JSON) job spec file")
    parser.add_argument("--gpus", type=int, help="GPUs the job needs")
    parser.add_argument("--kind", choices=["te", "be", "TE", "BE"], help="job class: te (trial) or be (best effort)")
    parser.add_argument("--name", help="job name (default: the program's name)")
    parser.add_argument(
        "--user", help="user the job runs for (default and only choice with credentials: the credentials' identity)"
    )
    parser.add_argument(
        "--priority", type=int,
        help="tier, -1000..1000 (default 0): higher tiers rank before lower ones under any policy, and may "
        "preempt them under a preemptive one; the policy orders jobs within a tier",
    )  # fmt: skip
    parser.add_argument("--grace", type=float, dest="grace_period_s", help="seconds to checkpoint after a revoke")
    parser.add_argument("--expected-duration", type=float, dest="expected_duration_s")
    parser.add_argument("--expected-iterations", type=int)
    parser.add_argument("--model", help="model/profile hint, e.g. resnet50")
    parser.add_argument("--throughputs", dest="gpu_throughputs", metavar="TYPE=X[;TYPE=X...]",
                        help="relative speed per GPU type, e.g. 'k80=0.2;v100=1', for heterogeneity-aware "
                             "policies (gavel); default: looked up from --model")  # fmt: skip
    parser.add_argument(
        "--workdir", help="working directory of the job's processes on the node (default: this directory, "
        "made absolute; it must exist on the node, as on a shared file system)",
    )  # fmt: skip
    parser.add_argument(
        "--distributed", action="store_true", default=None,
        help="one process per GPU with torch.distributed's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (default: "
        "one process seeing all the job's GPUs)",
    )  # fmt: skip
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    parser.add_argument("--id", dest="job_id", help="job id (default: generated)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for admission's verdict")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    add_endpoint_flags(parser)
    parser.epilog = "After `--`: the program and its arguments (run without a shell)."
    parser.set_defaults(handler=run)


class SpecError(ValueError):
    """A job spec that cannot be submitted; the message says what to fix."""


def _from_file(path: Path) -> dict[str, Any]:
    import yaml  # only for a spec file: flags and a command line need no YAML

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path} must hold a mapping of job spec fields, not {type(data).__name__}")
    return data


def build_spec(args: argparse.Namespace) -> JobSpec:
    from pydantic import ValidationError

    from schemas.job import JobSpec

    fields: dict[str, Any] = _from_file(args.spec) if args.spec else {}
    command = list(getattr(args, "trailing", []))
    if command:
        fields["command"] = command
    for flag in ("gpus", "name", "user", "priority", "grace_period_s", "expected_duration_s",
                 "expected_iterations", "model", "distributed"):
        value = getattr(args, flag)
        if value is not None:
            fields[flag] = value
    if args.workdir is not None:
        fields["workdir"] = os.path.abspath(args.workdir)
    elif "workdir" not in fields:
        # As sbatch does: the job runs where it was submitted from (a shared file system), so relative
        # script paths work; the worker fails the launch if the directory is not on its node.
        fields["workdir"] = os.getcwd()
    if args.kind:
        fields["job_class"] = args.kind.upper()
    if args.gpu_throughputs is not None:
        from services.core.heterogeneity import parse_throughputs  # only when asked: start-up stays cheap

        try:
            fields["gpu_throughputs"] = parse_throughputs(args.gpu_throughputs)
        except ValueError as exc:
            raise SpecError(f"--throughputs: {exc}") from None
    if args.env:
        env = dict(fields.get("env") or {})
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep:
                raise SpecError(f"--env {item!r} must be KEY=VALUE")
            env[key] = value
        fields["env"] = env
    if "command" not in fields:
        raise SpecError("no command: give a spec file with `command:` or `-- PROGRAM ARGS...`")
    if "name" not in fields and isinstance(fields["command"], list) and fields["command"]:
        fields["name"] = Path(str(fields["command"][0])).name or "job"
    try:
        return JobSpec.model_validate(fields)
    except ValidationError as exc:
        problems = "\n".join(
            f"  {'.'.join(map(str, e['loc'])) or '(spec)'}: {e['msg']} [{e['type']}]" for e in exc.errors()
        )
        raise SpecError(f"invalid job spec:\n{problems}") from exc


def _print(verdict: Verdict, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"job_id": verdict.job_id, "outcome": verdict.outcome, "reason": verdict.reason}))
    else:
        reason = f" ({verdict.reason})" if verdict.reason else ""
        print(f"{verdict.job_id} {verdict.outcome}{reason}")


def run(args: argparse.Namespace) -> int:
    from roundhouse.client import NoVerdictError

    try:
        spec = build_spec(args)
    except SpecError as exc:
        print(f"roundhouse submit: {exc}", file=sys.stderr)
        return 2

    async def submit(client: Client) -> Verdict:
        return await client.submit(spec, job_id=args.job_id, wait=not args.no_wait)

    try:
        verdict = with_client(args, submit)
    except NoVerdictError as exc:
        print(f"roundhouse submit: {exc}", file=sys.stderr)
        return 1
    except PermissionError as exc:  # --user names someone else than the credentials' identity
        print(f"roundhouse submit: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"roundhouse submit: cannot reach NATS: {exc}", file=sys.stderr)
        return 1
    _print(verdict, args.json)
    return EXIT_REJECTED if verdict.outcome == "rejected" else 0
