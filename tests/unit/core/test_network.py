"""The network model: ring all-reduce cost, layouts, the compact reference, and the simulator switch."""

from __future__ import annotations

import math

import pytest

from services.core.link_profiles import LINK_PROFILES, link_profile, with_links
from services.core.model_sizes import DEFAULT_PROFILE, MODEL_PROFILES, model_profile
from services.core.network import NetworkModel, ring_allreduce_s
from services.core.state import ClusterState, Gpu, Node

P3 = link_profile("p3.8xlarge")


def p3_cluster(nodes: int = 4, uplink: float | None = None) -> ClusterState:
    return with_links(ClusterState.uniform(nodes, 4), P3, uplink_gbps=uplink)


def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_gradient() -> None:
    # 8 Gbit over 4 members at 10 Gb/s: 2 * 3/4 * 8 / 10 = 1.2 s
    assert ring_allreduce_s(8e9, 4, 10.0) == pytest.approx(1.2)
    assert ring_allreduce_s(8e9, 1, 10.0) == 0.0
    assert ring_allreduce_s(8e9, 2, 20.0) == pytest.approx(ring_allreduce_s(8e9, 2, 10.0) / 2)


def test_published_parameter_counts_and_name_matching() -> None:
    assert model_profile("VGG-16").params_m == pytest.approx(138.4)
    assert model_profile("ResNet_50").params_m == pytest.approx(25.6)
    assert model_profile("GPT-2").params_m == pytest.approx(124.0)
    assert model_profile(None) is DEFAULT_PROFILE
    assert model_profile("no-such-model") is DEFAULT_PROFILE
    assert all(p.params_m >= 0 and p.step_s > 0 for p in MODEL_PROFILES.values())


def test_p3_profile_has_the_double_nvlink_pairs_blox_describes() -> None:
    links = P3.pair_map()
    assert links[(0, 3)] == links[(3, 0)] == 2 * links[(0, 1)]  # Blox §5.3: GPU 0-3 twice GPU 0-1
    cluster = p3_cluster(2)
    node = cluster.nodes["node-1"]
    assert node.network_gbps == 10.0
    assert node.link_bandwidth_gbps[(1, 2)] == 400.0


def test_spread_finds_the_slowest_link() -> None:
    model = NetworkModel()
    cluster = p3_cluster(2)
    one_node = model.spread((0, 3), cluster)
    assert (one_node.per_node, one_node.nodes, one_node.intra_gbps) == (2, 1, 400.0)
    assert math.isinf(one_node.inter_gbps)
    across = model.spread((0, 1, 4, 5), cluster)
    assert (across.per_node, across.nodes, across.intra_gbps, across.inter_gbps) == (2, 2, 200.0, 10.0)
    assert across.observed_gbps == 10.0


def test_spread_across_switches_is_capped_by_the_fabric() -> None:
    nodes = [Node("a", (0, 1), switch="s0", network_gbps=100.0), Node("b", (2, 3), switch="s1", network_gbps=100.0)]
    gpus = [Gpu(0, "a", 0), Gpu(1, "a", 1), Gpu(2, "b", 0), Gpu(3, "b", 1)]
    cluster = ClusterState(nodes, gpus)
    assert NetworkModel(switch_gbps=40.0).spread((0, 2), cluster).inter_gbps == 40.0
    assert NetworkModel().spread((0, 2), cluster).inter_gbps == 100.0


def test_missing_or_zero_pairs_use_the_pcie_default() -> None:
    node = Node("a", (0, 1), link_bandwidth_gbps={(0, 1): 0.0})
    assert NetworkModel(default_pair_gbps=96.0).pair_gbps(node, 1, 0) == 96.0


@pytest.mark.parametrize("model", ["vgg16", "resnet50", "bert", "transformer"])
def test_spreading_over_a_slow_uplink_slows_every_communicating_model(model: str) -> None:
    network = NetworkModel()
    cluster = p3_cluster()
    assert network.speed(model, (0, 1, 2, 3), cluster) == 1.0  # the compact placement itself
    spread = network.speed(model, (0, 1, 4, 5), cluster)
    assert 0.0 < spread < 0.9


def test_slowdown_grows_with_model_size_and_shrinks_with_bandwidth() -> None:
    network = NetworkModel()
    gpus = (0, 1, 4, 5)
    slow, fast = p3_cluster(uplink=10.0), p3_cluster(uplink=100.0)
    # VGG16 moves 5x ResNet-50's gradient for 1.6x its compute: it suffers more on the same link
    assert network.speed("vgg16", gpus, slow) < network.speed("resnet50", gpus, slow)
    for model in ("vgg16", "resnet50"):
        assert network.speed(model, gpus, slow) < network.speed(model, gpus, fast) <= 1.0
    assert network.speed("a3c", gpus, slow) > 0.99  # a tiny model hardly notices


def test_more_overlap_hides_more_communication() -> None:
    cluster = p3_cluster()
    gpus = (0, 1, 4, 5)
    assert NetworkModel(overlap_gamma=1.0).speed("resnet50", gpus, cluster) < NetworkModel(overlap_gamma=4.0).speed(
        "resnet50", gpus, cluster
    )


def test_the_weaker_nvlink_pair_is_slower_than_the_double_one_inside_a_node() -> None:
    network = NetworkModel()
    cluster = p3_cluster(1)
    assert network.speed("vgg16", (0, 3), cluster) == 1.0  # the best pair is the reference
    assert network.speed("vgg16", (0, 1), cluster) < 1.0


def test_wider_than_a_node_is_compared_with_whole_nodes() -> None:
    network = NetworkModel()
    cluster = p3_cluster(4)
    whole = tuple(range(8))
    scattered = (0, 1, 4, 5, 8, 9, 12, 13)
    assert network.speed("vgg16", whole, cluster) == 1.0
    assert network.speed("vgg16", scattered, cluster) < 1.0


def test_the_reference_cache_follows_the_cluster() -> None:
    network = NetworkModel()
    slow_intra = ClusterState.uniform(1, 2)  # no links reported: PCIe default between the pair
    assert network.compact(2, slow_intra).intra_gbps == network.default_pair_gbps
    assert network.compact(2, p3_cluster(1)).intra_gbps == 400.0


@pytest.mark.parametrize("bad", [{"overlap_gamma": 0.5}, {"default_pair_gbps": 0.0}, {"switch_gbps": math.nan}])
def test_rejects_meaningless_settings(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        NetworkModel(**bad)  # type: ignore[arg-type]


def test_with_links_rejects_a_busy_cluster_and_a_bad_uplink() -> None:
    cluster = ClusterState.uniform(1, 4)
    with pytest.raises(ValueError, match="uplink"):
        with_links(cluster, P3, uplink_gbps=0.0)
    cluster.assign("j", (0,))
    with pytest.raises(ValueError, match="empty cluster"):
        with_links(cluster, P3)
    with pytest.raises(ValueError, match="known"):
        link_profile("nope")
    assert set(LINK_PROFILES) >= {"p3.8xlarge", "dgx-a100"}


def _run(placement: str, network: NetworkModel | None) -> dict[int, float]:
    """JCT per job index: a 2-GPU ResNet-18 job, then a 4-GPU VGG16 job, on two p3.8xlarge nodes."""
    from services.core.costs import CostModel
    from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
    from services.core.simulation.engine import SimConfig, Simulator
    from services.core.simulation.workload import TraceJob

    jobs = [
        TraceJob(index=0, arrival_s=0.0, gpus=2, duration_s=10_000.0, model="resnet18"),
        TraceJob(index=1, arrival_s=1.0, gpus=4, duration_s=1_000.0, model="vgg16"),
    ]
    config = SimConfig(round_s=1.0, costs=CostModel.free(), network=network, record_jobs=True)
    sim = Simulator(
        jobs, p3_cluster(2), admission=ADMISSION.create("accept-all"), scheduling=SCHEDULING.create("fifo"),
        placement=PLACEMENT.create(placement), config=config,
    )  # fmt: skip
    out = sim.run()
    return {int(i): jct for i, jct in zip(out.job_index, out.jct, strict=True)}


def test_the_simulator_slows_a_spread_job_by_the_network_model_only_when_it_is_on() -> None:
    network = NetworkModel()
    off = _run("first-free", None)
    on = _run("first-free", network)
    compact = _run("consolidated", network)
    # first-free puts the VGG16 job on GPUs 2-5 (two nodes over 10 Gb/s); consolidated on node 1
    expected = network.speed("vgg16", (2, 3, 4, 5), p3_cluster(2))
    assert expected < 0.5
    assert off[1] == pytest.approx(1_000.0, abs=2.0)  # CostModel.free(): no fixed spread penalty
    assert on[1] == pytest.approx(1_000.0 / expected, rel=0.01)
    assert compact[1] == pytest.approx(1_000.0, abs=2.0)
    assert off[0] == pytest.approx(10_000.0, abs=1.0)
    # the ResNet-18 job holds GPUs 0-1, one NVLink where 0-3 has two: a hair slower, not more
    assert on[0] == pytest.approx(10_000.0 / network.speed("resnet18", (0, 1), p3_cluster(2)), rel=1e-6)
    assert on[0] < 10_020.0
