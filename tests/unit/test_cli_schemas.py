"""`roundhouse schemas`: every subject's model is printed as valid JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roundhouse.cli import main
from schemas import codec
from schemas.base import SCHEMA_VERSION
from schemas.subjects import SUBJECTS, spec_for


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["schemas", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_every_subject_and_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert set(doc["subjects"]) == {s.pattern for s in SUBJECTS}
    for spec in SUBJECTS:
        entry = doc["subjects"][spec.pattern]
        assert entry["model"] == spec.model.__name__
        assert entry["durable"] is spec.durable
        schema = doc["models"][spec.model.__name__]
        assert schema["title"] == spec.model.__name__
        assert schema["$schema"].startswith("https://json-schema.org/")
        assert schema["additionalProperties"] is False
        # Every event carries the envelope fields, and publishers must send the required ones.
        assert {"event_id", "ts", "schema_version"} <= set(schema["properties"])
        assert {"event_id", "ts", "schema_version"} <= set(schema["required"])
        assert set(schema.get("required", [])) >= {
            name for name, field in spec.model.model_fields.items() if field.is_required()
        }
        if spec.reply_model is not None:
            assert entry["reply_model"] in doc["models"]
    assert "JobSpec" in doc["models"]


def test_model_option_prints_one_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--model", "LeaseGrant")
    assert code == 0
    schema = json.loads(out)
    assert schema["title"] == "LeaseGrant"
    assert "epoch" in schema["required"]
    assert schema["properties"]["spec"]["$ref"] == "#/$defs/JobSpec"
    assert "JobSpec" in schema["$defs"]


def test_model_option_accepts_a_subject(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--model", "metrics.job.job-1")
    assert code == 0
    assert json.loads(out)["title"] == "JobMetrics"


@pytest.mark.parametrize("name", ["NoSuchModel", "job.teleported"])
def test_unknown_model_is_an_error(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = _run(capsys, "--model", name)
    assert code == 2
    assert out == ""
    assert name in err
    assert "JobArrived" in err or "job.arrived" in err


def test_list_prints_the_subject_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--list")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["SUBJECT", "MODEL", "STORAGE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {s.pattern for s in SUBJECTS}
    assert rows["job.arrived.*"][1:3] == ["JobArrived", "jetstream"]
    assert rows["lease.grant.*"][1:4] == ["LeaseGrant", "core", "LeaseAck"]


@pytest.mark.parametrize("spec", SUBJECTS, ids=lambda s: s.pattern)
def test_example_payload_decodes_on_its_subject(capsys: pytest.CaptureFixture[str], spec: object) -> None:
    from schemas.subjects import SubjectSpec

    assert isinstance(spec, SubjectSpec)
    code, out, _ = _run(capsys, "--example", spec.model.__name__)
    assert code == 0
    payload = json.loads(out)
    subject = spec.pattern
    if spec.token_field is not None:
        value = payload
        for name in spec.token_field.split("."):  # a nested field: job.arrived.<spec.user>
            value = value[name]
        subject = subject.replace("*", value)
    # What a non-Python publisher would copy from the docs is accepted as-is.
    decoded = codec.decode(subject, out.encode())
    assert type(decoded) is spec_for(subject).model


def test_out_writes_one_file_per_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "--out", str(tmp_path / "schemas"))
    assert code == 0
    written = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert "subjects.json" in written
    assert "JobArrived.schema.json" in written
    replies = {s.reply_model for s in SUBJECTS if s.reply_model is not None}
    # one file per subject model and per reply model, plus JobSpec and subjects.json
    assert len(written) == len({s.model for s in SUBJECTS}) + len(replies) + 2
    subjects = json.loads((tmp_path / "schemas" / "subjects.json").read_text())
    assert set(subjects["subjects"]) == {s.pattern for s in SUBJECTS}
    grant = json.loads((tmp_path / "schemas" / "LeaseGrant.schema.json").read_text())
    assert grant["title"] == "LeaseGrant"
    assert "wrote" in out


def test_options_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["schemas", "--list", "--model", "JobArrived"])
    assert caught.value.code == 2
    assert "not allowed with" in capsys.readouterr().err
