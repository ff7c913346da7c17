"""Shared fixtures for the TensorFlow plugin tests.

The pytest process never imports TensorFlow: every scenario runs in a child
interpreter (tf_child.py), because the plugin holds one Monarch instance per
process, configured at its first use. Datasets are generated once per session.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "integrations", "tensorflow"))

import monarch_tf  # noqa: E402  (importing it does not import TensorFlow)


def _find_plugin():
    """(plugin path, None) or (None, why every test is skipped)."""
    if importlib.util.find_spec("tensorflow") is None:
        return None, "TensorFlow is not installed in this Python"
    try:
        return monarch_tf.plugin_path(), None
    except FileNotFoundError as e:
        return None, str(e)


PLUGIN, SKIP_REASON = _find_plugin()


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def run_child(scenario, args, env=None, timeout=240):
    """Runs tf_child.py SCENARIO in a fresh interpreter; returns (result, stderr).
    Fails unless the child printed a result and exited with code 0."""
    child_env = dict(os.environ)
    for var in ("MONARCH_CONFIG", "MONARCH_DATASET"):
        child_env.pop(var, None)
    child_env.update(env or {})
    child_env["MONARCH_TF_PLUGIN"] = PLUGIN
    child_env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(REPO, "integrations", "tensorflow"), child_env.get("PYTHONPATH", "")])
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "tf_child.py"), scenario,
                           json.dumps(args)], env=child_env, capture_output=True, text=True,
                          timeout=timeout)
    results = [line[len("RESULT "):] for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, (
        f"{scenario} exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}")
    return json.loads(results[-1]), proc.stderr


def write_config(path, dataset, tiers, threads=2, node_dir=None):
    """A YAML config: `tiers` are (kind, capacity_bytes, dir or None), fastest
    first; the source is appended. With `node_dir`, the process is a client
    of a node service in that runtime directory (started on demand)."""
    lines = [f"dataset:\n  path: {dataset}\ntiers:"]
    for i, (kind, capacity, directory) in enumerate(tiers):
        lines.append(f"  - name: {kind}{i}\n    kind: {kind}\n    capacity: {capacity}")
        if directory:
            os.makedirs(directory, exist_ok=True)
            lines.append(f"    path: {directory}")
    # The dataset stands for a PFS, read once: `promote`, as its local files
    # are in the page cache (tests/test_read_path.cc covers `defer`); and no
    # hit on a posix copy sent to that page cache instead (route_by_speed,
    # covered there too), so that the tests can count the tier's reads.
    lines.append(f"  - name: pfs\n    kind: source\nplacement:\n  threads: {threads}\n"
                 "  cached_source: promote\n  route_by_speed: false\n")
    if node_dir:
        lines.append(f"node:\n  shared: true\n  runtime_dir: {node_dir}\n  idle_exit: 3s\n")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return str(path)


@pytest.fixture(scope="session")
def records_dataset(tmp_path_factory):
    """2 shards of 24 MiB of random-size records plus 4 small-record files."""
    root = tmp_path_factory.mktemp("records")
    result, _ = run_child("gen_records", {
        "root": str(root), "small_files": 4, "small_records": 500,
        "big_shards": 2, "big_shard_bytes": 24 << 20})
    return str(root), result["bytes"]


@pytest.fixture(scope="session")
def mnist_dataset(tmp_path_factory):
    """8 equal TFRecord files of 384 synthetic 28x28 examples."""
    root = tmp_path_factory.mktemp("mnist")
    result, _ = run_child("gen_mnist", {"root": str(root), "files": 8, "records_per_file": 384})
    return str(root), result["bytes"]


@pytest.fixture(scope="session")
def tree_dataset(tmp_path_factory):
    """Nested directories, names with spaces, an empty file, an image folder."""
    root = tmp_path_factory.mktemp("tree") / "dataset"
    result, _ = run_child("gen_tree", {"root": str(root)})
    return str(root), result["bytes"]
