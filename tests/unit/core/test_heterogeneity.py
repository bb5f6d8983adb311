"""GPU type names (normalised from what drivers report), per-type throughputs and their lookup order."""

from __future__ import annotations

import pytest

from services.core.heterogeneity import (
    DEFAULT_TYPE_SPEED,
    GAVEL_THROUGHPUTS,
    HeterogeneityModel,
    normalize_gpu_type,
    parse_throughputs,
    relative_throughput,
)
from services.scheduler.inventory import Inventory
from services.worker.inventory import fake_inventory
from tests.helpers import fake_node


@pytest.mark.parametrize(
    ("name", "gpu_type"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
        ("Tesla V100-SXM2-16GB", "v100"),
        ("Tesla K80", "k80"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("Tesla T4", "t4"),
        ("v100", "v100"),
        ("Roundhouse Fake GPU", "roundhouse-fake-gpu"),
        ("", "generic"),
        (None, "generic"),
    ],
)
def test_driver_names_become_short_types(name: str | None, gpu_type: str) -> None:
    assert normalize_gpu_type(name) == gpu_type


def test_lookup_order_own_throughputs_then_model_then_type_default_then_one() -> None:
    own = {"k80": 0.5}
    assert relative_throughput("k80", model="resnet50", throughputs=own) == 0.5
    assert relative_throughput("p100", model="resnet50", throughputs=own) == GAVEL_THROUGHPUTS["resnet50"]["p100"]
    assert relative_throughput("p100", model="unknown") == DEFAULT_TYPE_SPEED["p100"]
    assert relative_throughput("a100", model="resnet50") == 1.0
    assert relative_throughput("v100", model="RESNET50") == 1.0  # model names are case-insensitive


def test_gavels_table_is_normalised_to_v100_and_keeps_its_oddities() -> None:
    assert all(row["v100"] == 1.0 for row in GAVEL_THROUGHPUTS.values())
    assert GAVEL_THROUGHPUTS["cyclegan"]["k80"] < 0.2  # 0.505 / 4.426 samples/s in Gavel's table
    assert GAVEL_THROUGHPUTS["recoder"]["k80"] > 1.0  # Gavel measured Recommendation faster on a K80


def test_parse_throughputs() -> None:
    assert parse_throughputs("K80=0.2; v100=1") == {"k80": 0.2, "v100": 1.0}
    for bad in ("", "k80", "k80=x", "k80=0", "k80=-1", "=1", "k80=inf"):
        with pytest.raises(ValueError, match="throughput"):
            parse_throughputs(bad)


def test_the_factor_is_the_slowest_held_type() -> None:
    model = HeterogeneityModel(["k80", "k80", "v100", "v100"])
    assert model.factor([2, 3], model="cyclegan") == 1.0
    assert model.factor([1, 2], model="cyclegan") == GAVEL_THROUGHPUTS["cyclegan"]["k80"]
    assert model.factor([0], throughputs={"k80": 2.0}) == 2.0


def test_the_scheduler_sees_a_nodes_normalised_gpu_type() -> None:
    inventory = Inventory(lease_ttl_s=30.0)
    inventory.register(fake_node("node-a", 2, gpu_name="NVIDIA A100-SXM4-80GB"), now=0.0)
    inventory.register(fake_node("node-b", 1, gpu_name="Tesla V100-SXM2-16GB"), now=0.0)
    assert inventory.get("node-a").gpu_type == "a100"  # type: ignore[union-attr]
    assert inventory.get("node-b").gpu_type == "v100"  # type: ignore[union-attr]


def test_fake_gpus_report_the_name_they_are_given() -> None:
    assert {g.name for g in fake_inventory(2, "n", "Tesla K80").gpus} == {"Tesla K80"}
