"""One local Ray instance per test module: the body of each Ray test module's ``ray_cluster`` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType


def local_ray(*modules: ModuleType) -> Iterator[None]:
    """Start Ray on loopback (2 CPUs), yield, then check no actor is left alive and shut it down.

    Workers cannot import test modules by name: ``modules`` are sent by value. Ray is imported here, once
    the module's ``pytest.importorskip("ray")`` let it run.
    """
    import ray

    for module in modules:
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    try:
        # Ray's state API needs the dashboard; the GCS table is the way to list actors without it.
        alive = [a for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]
        assert not alive, f"actors left alive: {[a['ActorClassName'] for a in alive]}"
    finally:
        ray.shutdown()
