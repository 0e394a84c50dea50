"""The shipped cluster configurations: launcher YAMLs against Ray's own schema, KubeRay shapes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from ray_layout.commands.tune import build_parser as tune_parser

CONFIGS = Path("cluster_configs")
RAY_SCHEMA = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


@pytest.mark.parametrize("path", sorted((CONFIGS / "ray").glob("*.yaml")), ids=lambda p: p.name)
def test_launcher_configs_follow_rays_schema(path):
    config = yaml.safe_load(path.read_text())
    jsonschema.validate(config, RAY_SCHEMA)  # unknown keys and wrong types are rejected
    gpu_types = [t for t in config["available_node_types"].values() if t["resources"].get("GPU")]
    assert gpu_types and all(t["resources"]["GPU"] == 8 for t in gpu_types)
    assert config["head_node_type"] in config["available_node_types"]


def test_the_schema_check_can_fail():
    config = yaml.safe_load((CONFIGS / "ray" / "aws_h200.yaml").read_text())
    config["max_wrkers"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, RAY_SCHEMA)


def worker_gpus(cluster_spec: dict) -> list[int]:
    return [
        container["resources"]["limits"]["nvidia.com/gpu"]
        for group in cluster_spec["workerGroupSpecs"]
        for container in group["template"]["spec"]["containers"]
    ]


def test_kuberay_cluster_and_job():
    cluster = yaml.safe_load((CONFIGS / "kuberay" / "raycluster.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert worker_gpus(cluster["spec"]) == [8]
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    job = yaml.safe_load((CONFIGS / "kuberay" / "rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert worker_gpus(job["spec"]["rayClusterSpec"]) == [8]
    entrypoint = shlex.split(job["spec"]["entrypoint"])
    assert entrypoint[:3] == ["python", "-m", "ray_layout.tune"]
    args = tune_parser().parse_args(entrypoint[3:])  # the job runs a command this project has
    assert (args.backend, args.pp) == ("megatron", 4)
