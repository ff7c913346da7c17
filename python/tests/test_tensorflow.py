"""monarch.tensorflow (and the monarch_tf shim) without the full plugin suite."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_is_cheap_and_shim_reexports():
    import monarch.tensorflow as mtf
    assert mtf.uri("/data/set/a") == "monarch:///data/set/a"
    sys.path.insert(0, os.path.join(REPO, "integrations", "tensorflow"))
    try:
        import monarch_tf
    finally:
        sys.path.pop(0)
    assert monarch_tf.plugin_path is mtf.plugin_path and monarch_tf.register is mtf.register
    assert set(monarch_tf.__all__) == {"plugin_path", "register", "configure", "uri", "stats",
                                       "wait_for_placement"}


def test_plugin_found_and_reads(dataset):
    plugin = os.environ.get("MONARCH_TF_PLUGIN")
    if not plugin:
        pytest.skip("the TensorFlow plugin is not built in this build tree (no TensorFlow "
                    "with filesystem headers for MONARCH_PYTHON, or MONARCH_BUILD_TENSORFLOW=OFF)")
    import monarch.tensorflow as mtf
    assert mtf.plugin_path() == os.path.abspath(plugin)
    # The plugin keeps one instance per process: a fresh interpreter.
    script = (
        "import os, monarch.tensorflow as mtf, tensorflow as tf\n"
        f"mtf.configure(dataset={dataset!r}); mtf.register()\n"
        f"data = tf.io.read_file(mtf.uri({os.path.join(dataset, 'blob.bin')!r})).numpy()\n"
        f"assert data == open({os.path.join(dataset, 'blob.bin')!r}, 'rb').read()\n"
        "assert mtf.stats()['tiers'][-1]['bytes_read'] == len(data)\n"
        "print('ok', len(data))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "ok 300000" in r.stdout, r.stderr[-3000:]
